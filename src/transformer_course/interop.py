"""Weight copies into this library's modules, kept apart from the model code.

From PyTorch: ``nn.MultiheadAttention`` -> ``MultiHeadAttention`` and
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` -> ``TransformerLayer``
(the parity tests of chapters 3 and 6). From Hugging Face: a ``BertModel`` state dict
(the real all-MiniLM-L6-v2 checkpoint) -> ``pretrained.MiniLMEncoder``. Other
libraries' names (``in_proj_weight``, ``attention.self.query``) appear here and nowhere
else in the library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from transformer_course.attention import MultiHeadAttention
from transformer_course.layers import TransformerLayer

if TYPE_CHECKING:
    from transformer_course.pretrained import MiniLMEncoder

Tensor = torch.Tensor


def _copy(ours: nn.Module, theirs: nn.Module) -> None:
    ours.weight.copy_(theirs.weight)
    if theirs.bias is not None:
        ours.bias.copy_(theirs.bias)


@torch.no_grad()
def load_torch_mha(ours: MultiHeadAttention, mha: nn.MultiheadAttention):
    """Copy the weights of a ``torch.nn.MultiheadAttention`` into ``ours``. PyTorch
    stacks W^Q, W^K, W^V in ``in_proj_weight`` (3D, D) in that order. Returns ``ours``.

    Raises:
        TypeError: if ``mha`` is not an ``nn.MultiheadAttention``.
        ValueError: if its d_model, n_heads or bias differ from ``ours``, or it uses
            features ``ours`` does not have (kdim/vdim != embed_dim, add_bias_kv,
            grouped-query heads).
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(
            f"mha: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}"
        )
    theirs = (mha.embed_dim, mha.num_heads, mha.in_proj_bias is not None)
    mine = (ours.d_model, ours.n_heads, ours.q_proj.bias is not None)
    if theirs != mine:
        raise ValueError(
            f"mha: expected (d_model, n_heads, bias) = {mine}, got {theirs}"
        )
    grouped = ours.n_kv_heads != ours.n_heads
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or grouped:
        raise ValueError(
            "mha: kdim/vdim != embed_dim, add_bias_kv and grouped-query heads are not "
            "supported"
        )
    projections = (ours.q_proj, ours.k_proj, ours.v_proj)
    for proj, w in zip(projections, mha.in_proj_weight.chunk(3)):
        proj.weight.copy_(w)
    if mha.in_proj_bias is not None:
        for proj, b in zip(projections, mha.in_proj_bias.chunk(3)):
            proj.bias.copy_(b)
    _copy(ours.out_proj, mha.out_proj)
    return ours


def from_torch_mha(mha: nn.MultiheadAttention, **kwargs) -> MultiHeadAttention:
    """A new ``MultiHeadAttention`` with the sizes, dropout, device, dtype and weights
    of ``mha``; ``kwargs`` (e.g. ``backend``) go to the constructor.

    Raises: as ``load_torch_mha``.
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(
            f"mha: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}"
        )
    kwargs.setdefault("dropout", mha.dropout)
    ours = MultiHeadAttention(
        mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None, **kwargs
    )
    ours = ours.to(mha.in_proj_weight.device, mha.in_proj_weight.dtype)
    return load_torch_mha(ours, mha)


@torch.no_grad()
def load_torch_layer(
    ours: TransformerLayer,
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
) -> TransformerLayer:
    """Copy a ``torch.nn.TransformerEncoderLayer`` (into a layer without
    cross-attention) or ``TransformerDecoderLayer`` (into one with it); returns
    ``ours``.

    PyTorch's names: ``self_attn``, ``multihead_attn`` (cross), ``linear1``,
    ``linear2``, and ``norm1``, ``norm2`` (, ``norm3``) in sub-layer order.

    Raises:
        TypeError: for another kind of layer, or a decoder layer into a layer without
            cross-attention (and the reverse).
    """
    decoder = isinstance(layer, nn.TransformerDecoderLayer)
    if not isinstance(layer, nn.TransformerEncoderLayer) and not decoder:
        raise TypeError(
            "layer: expected an nn.TransformerEncoderLayer or DecoderLayer, got "
            f"{type(layer).__name__}"
        )
    if decoder != (ours.cross_attn is not None):
        raise TypeError(
            f"layer: a {type(layer).__name__} needs a TransformerLayer with "
            f"cross_attention={decoder}"
        )
    load_torch_mha(ours.self_attn, layer.self_attn)
    norms = [ours.self_attn_norm, ours.ff_norm]
    if decoder:
        load_torch_mha(ours.cross_attn, layer.multihead_attn)
        norms.insert(1, ours.cross_attn_norm)
    _copy(ours.ff.linear1, layer.linear1)
    _copy(ours.ff.linear2, layer.linear2)
    for i, norm in enumerate(norms, start=1):
        _copy(norm, getattr(layer, f"norm{i}"))
    return ours


#: Our names (``MiniLMEncoder``) -> Hugging Face ``BertModel`` names.
_BERT_EMBEDDINGS = {
    "word_embeddings.weight": "embeddings.word_embeddings.weight",
    "position_embeddings.weight": "embeddings.position_embeddings.weight",
    "segment_embeddings.weight": "embeddings.token_type_embeddings.weight",
    "embed_norm.weight": "embeddings.LayerNorm.weight",
    "embed_norm.bias": "embeddings.LayerNorm.bias",
}
_BERT_LAYER = {
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "self_attn_norm": "attention.output.LayerNorm",
    "ff.linear1": "intermediate.dense",
    "ff.linear2": "output.dense",
    "ff_norm": "output.LayerNorm",
}


@torch.no_grad()
def load_hf_bert(model: MiniLMEncoder, sd: dict[str, Tensor]) -> MiniLMEncoder:
    """Copy weights named as in Hugging Face's ``BertModel`` (e.g. the
    all-MiniLM-L6-v2 checkpoint) into a ``MiniLMEncoder``. Returns ``model``.

    Raises:
        KeyError: naming the first weight that ``sd`` lacks.
    """
    names = dict(_BERT_EMBEDDINGS)
    for i in range(len(model.layers)):
        for mine, theirs in _BERT_LAYER.items():
            for p in ("weight", "bias"):
                names[f"layers.{i}.{mine}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    params = dict(model.named_parameters())
    for mine, theirs in names.items():
        if theirs not in sd:
            raise KeyError(f"sd: expected a weight named {theirs!r}, it is missing")
        params[mine].copy_(sd[theirs])
    return model
