"""What a module is called in a diagram and which book colour (role) it gets: a short
description from its sizes ("Linear 32->16", "multi-head attention H=4") and a role
from its class or its attribute name (q_proj, k_proj, v_proj)."""

from __future__ import annotations

from torch import nn

from transformer_course import attention, layers, positional, vision

_ROLE_BY_CLASS = [
    (attention.MultiHeadAttention, "attention"),
    (layers.FeedForward, "feedforward"),
    (nn.LayerNorm, "norm"),
    (nn.Embedding, "embedding"),
    (positional.SinusoidalPositionalEncoding, "embedding"),
    (positional.LearnedPositionalEmbedding, "embedding"),
    (positional.RotaryEmbedding, "embedding"),
    (vision.PatchEmbedding, "embedding"),
]
_SHORT = {
    positional.SinusoidalPositionalEncoding: "sinusoidal positions",
    positional.LearnedPositionalEmbedding: "learned positions",
    positional.RotaryEmbedding: "rotary positions",
    vision.PatchEmbedding: "patches + positions",
}
_ROLE_BY_NAME = {"q_proj": "query", "k_proj": "key", "v_proj": "value"}


def describe(m: nn.Module) -> str:
    """A short label of ``m`` built from its sizes."""
    if isinstance(m, nn.Linear):
        return f"Linear {m.in_features}\u2192{m.out_features}"
    if isinstance(m, attention.MultiHeadAttention):
        kv = f", H_kv={m.n_kv_heads}" if m.n_kv_heads != m.n_heads else ""
        return f"multi-head attention H={m.n_heads}{kv}"
    if isinstance(m, layers.FeedForward):
        return f"feed-forward {m.linear1.in_features}\u2192{m.linear1.out_features}"
    if isinstance(m, nn.Embedding):
        return f"Embedding {m.num_embeddings}\u00d7{m.embedding_dim}"
    return _SHORT.get(type(m), type(m).__name__)


def role_of(m: nn.Module, name: str) -> str:
    """The ``style.ROLE_COLORS`` key of ``m`` (qualified name ``name``)."""
    short = name.rsplit(".", 1)[-1]
    if short in _ROLE_BY_NAME:
        return _ROLE_BY_NAME[short]
    for cls, role in _ROLE_BY_CLASS:
        if isinstance(m, cls):
            return role
    return "norm" if "Norm" in type(m).__name__ else "linear"
