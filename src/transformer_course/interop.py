"""Weight loading into this library's modules, one loader per checkpoint family.

Each family is a table from our parameter names to the checkpoint's names, read by
one copy routine that names the missing or mis-shaped tensor:

- PyTorch modules: ``nn.MultiheadAttention`` -> ``MultiHeadAttention`` and
  ``nn.TransformerEncoderLayer`` / ``DecoderLayer`` -> ``TransformerLayer`` (the parity
  tests of chapters 3 and 6).
- The MiniLM checkpoint: a Hugging Face ``BertModel`` state dict (all-MiniLM-L6-v2)
  -> ``pretrained.MiniLMEncoder`` (``load_hf_bert``).
- The Llama family: Hugging Face ``LlamaForCausalLM`` names (``load_hf_llama``) and
  GGUF files, llama.cpp's format (``gguf_loader``) -> a ``DecoderOnlyLM`` with a
  Llama config (chapter 10). ``llama_config_from_hf`` (from ``checkpoint_keys``) and
  the GGUF loader's ``load_gguf_llama`` and ``llama_config_from_gguf`` can be
  imported from here too.

A Llama checkpoint is never loaded silently different from its reference
implementation (transformers, llama.cpp): every key of its configuration changes the
model as the reference says or is refused by name (``checkpoint_keys``), biases are
loaded when the config has them, and a tensor of the checkpoint that the model has no
place for is refused by name.

Other libraries' names (``in_proj_weight``, ``attention.self.query``,
``blk.0.attn_q.weight``, ``num_key_value_heads``) appear here and in ``gguf_loader``,
nowhere else in the library.

RoPE layout: Hugging Face's Llama rotates pairs (x_i, x_{i + d/2}) ("half"); llama.cpp's
converter permutes each head's W^Q and W^K rows so that pairs are adjacent
(x_{2i}, x_{2i+1}), "interleaved". The loaders refuse a model whose ``rope_layout`` is
not the checkpoint's; ``permute_rotary_rows`` converts one into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.attention import MultiHeadAttention
from transformer_course.checkpoint_keys import llama_config_from_hf  # noqa: F401
from transformer_course.layers import TransformerLayer
from transformer_course.model import DecoderOnlyLM
from transformer_course.positional import LAYOUTS

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


# ------------------------------------------------------------- the MiniLM checkpoint

#: Our names (``pretrained.MiniLMEncoder``) -> Hugging Face ``BertModel`` names.
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
def load_hf_bert(model: nn.Module, sd: Mapping[str, Tensor]) -> nn.Module:
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
    return _load_table(model, names, sd.get, "sd")


def _load_table(
    model: nn.Module,
    names: Mapping[str, str],
    get: Callable[[str], Tensor | None],
    source: str,
) -> nn.Module:
    """Copy ``get(names[ours])`` into every parameter of ``model`` (shared ones once).

    Raises:
        KeyError: a parameter of ``model`` without a checkpoint name, or a checkpoint
            tensor that is missing, naming it.
        ValueError: a checkpoint tensor whose shape differs from the parameter's.
    """
    with torch.no_grad():
        for mine, p in model.named_parameters():
            if mine not in names:
                raise KeyError(
                    f"model: parameter {mine!r} has no counterpart in the checkpoint "
                    f"(wrong config? e.g. bias=True for a model without biases)"
                )
            w = get(names[mine])
            if w is None:
                raise KeyError(
                    f"{source}: expected a tensor named {names[mine]!r}, it is missing"
                )
            w = torch.as_tensor(w)
            if tuple(w.shape) != tuple(p.shape):
                raise ValueError(
                    f"{source}: tensor {names[mine]!r} has shape {tuple(w.shape)}, "
                    f"expected {tuple(p.shape)} for {mine!r}"
                )
            p.copy_(w)
    return model


# ------------------------------------------------------------- the Llama family

#: Our ``DecoderOnlyLM`` names -> (Hugging Face ``LlamaForCausalLM``, GGUF) names.
_LLAMA = {
    "embed.tokens.weight": ("model.embed_tokens.weight", "token_embd.weight"),
    "norm.weight": ("model.norm.weight", "output_norm.weight"),
    "out.weight": ("lm_head.weight", "output.weight"),  # absent when tied
}
_LLAMA_LAYER = {  # per layer: HF "model.layers.{i}.", GGUF "blk.{i}."
    "self_attn_norm.weight": ("input_layernorm.weight", "attn_norm.weight"),
    "self_attn.q_proj.weight": ("self_attn.q_proj.weight", "attn_q.weight"),
    "self_attn.k_proj.weight": ("self_attn.k_proj.weight", "attn_k.weight"),
    "self_attn.v_proj.weight": ("self_attn.v_proj.weight", "attn_v.weight"),
    "self_attn.out_proj.weight": ("self_attn.o_proj.weight", "attn_output.weight"),
    "ff_norm.weight": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "ff.gate_proj.weight": ("mlp.gate_proj.weight", "ffn_gate.weight"),
    "ff.up_proj.weight": ("mlp.up_proj.weight", "ffn_up.weight"),
    "ff.down_proj.weight": ("mlp.down_proj.weight", "ffn_down.weight"),
}
_FAMILIES = {
    "hf": (0, "model.layers.{i}.", "half"),
    "gguf": (1, "blk.{i}.", "interleaved"),
}


def llama_names(
    n_layers: int, family: str, *, bias: bool = False, ff_bias: bool | None = None
) -> dict[str, str]:
    """Our parameter names -> the checkpoint's, for ``family`` "hf" or "gguf"; with
    ``bias`` the attention's biases too, with ``ff_bias`` (default ``bias``) the
    feed-forward's (each weight's name with "bias" for "weight")."""
    _validation.one_of("family", family, _FAMILIES)
    col, prefix, _ = _FAMILIES[family]
    ff_bias = bias if ff_bias is None else ff_bias
    names = {mine: theirs[col] for mine, theirs in _LLAMA.items()}
    for i in range(n_layers):
        for mine, theirs in _LLAMA_LAYER.items():
            names[f"layers.{i}.{mine}"] = prefix.format(i=i) + theirs[col]
            if (bias and "attn." in mine) or (ff_bias and "ff." in mine):
                names[f"layers.{i}.{mine[:-6]}bias"] = (
                    names[f"layers.{i}.{mine}"][:-6] + "bias"
                )
    return names


def _llama_names_of(model: DecoderOnlyLM, family: str) -> dict[str, str]:
    cfg = model.cfg
    return llama_names(len(model.layers), family, bias=cfg.bias, ff_bias=cfg.ff_bias)


def _check_layout(model: DecoderOnlyLM, family: str) -> None:
    stored = _FAMILIES[family][2]
    if model.cfg.rope_layout != stored:
        raise ValueError(
            f"rope_layout: a {family} checkpoint stores W^Q and W^K rows in the "
            f"{stored!r} RoPE layout, the model uses {model.cfg.rope_layout!r}: build it "
            f"with rope_layout={stored!r} (or convert rows with permute_rotary_rows)"
        )


def _refuse_unused(names: Mapping[str, str], stored, source: str, skip=()) -> None:
    """Every tensor of the checkpoint (``stored``, its names) is one the table copied
    (``names``' values) or one of ``skip`` (name fragments): a tensor nothing reads
    would make the model differ from the reference. Raises ValueError naming it."""
    used = set(names.values())
    for name in stored:
        if name not in used and not any(part in name for part in skip):
            raise ValueError(
                f"{source}: tensor {name!r} has no place in the model (a bias, expert or "
                f"other part this loader does not build), so it is refused"
            )


def load_hf_llama(
    model: DecoderOnlyLM, sd: Mapping[str, Tensor], *, check_layout: bool = True
) -> DecoderOnlyLM:
    """Copy a Hugging Face ``LlamaForCausalLM`` state dict into ``model`` (a
    ``DecoderOnlyLM`` with a Llama config, ``llama_config_from_hf``), biases too when
    ``model.cfg`` has them. Returns it.

    Raises:
        KeyError / ValueError: a missing or mis-shaped tensor, named (``_load_table``).
        ValueError: a tensor of ``sd`` the model has no place for (a bias of a model
            built without, an output projection of its own for a model with tied
            embeddings), named; ``model.cfg.rope_layout`` is not "half"
            (unless not ``check_layout``: chapter 10 shows what goes wrong).
    """
    if check_layout:
        _check_layout(model, "hf")
    names = _llama_names_of(model, "hf")
    # rotary_emb.inv_freq: the frequencies old transformers saved; recomputed, as theirs
    _refuse_unused(names, sd.keys(), "sd", skip=("rotary_emb.inv_freq",))
    head, embed = sd.get("lm_head.weight"), sd.get("model.embed_tokens.weight")
    tied_here = head is None or (embed is not None and torch.equal(head, embed))
    if model.cfg.tie_embeddings and not tied_here:
        raise ValueError(
            "sd: 'lm_head.weight' differs from 'model.embed_tokens.weight', the model "
            "ties them (build it with tie_embeddings=False)"
        )
    return _load_table(model, names, sd.get, "sd")


def permute_rotary_rows(w: Tensor, n_heads: int, to: str) -> Tensor:
    """Reorder the rows of W^Q or W^K (n_heads * d_k, D) between the RoPE layouts,
    head by head: "interleaved" puts row i of a head's first half at 2i and row i of
    its second half at 2i + 1 (llama.cpp's ``permute``); "half" undoes it.

    Raises ValueError for an unknown ``to`` or rows not divisible into heads of even
    size. Source: llama.cpp ``convert_hf_to_gguf.py``, ``LlamaModel.permute``.
    """
    _validation.one_of("to", to, LAYOUTS)
    if w.dim() != 2 or w.shape[0] % (2 * n_heads):
        raise ValueError(
            f"w: expected (n_heads * d_k, D) with n_heads={n_heads} heads of even "
            f"d_k, got {tuple(w.shape)}"
        )
    d_half = w.shape[0] // n_heads // 2
    split = (n_heads, 2, d_half) if to == "interleaved" else (n_heads, d_half, 2)
    return w.reshape(*split, -1).transpose(1, 2).reshape(w.shape)


def __getattr__(name: str):
    """The GGUF loader's names, kept importable from here: ``gguf_loader`` holds them
    (PEP 562: imported when first asked for, as gguf_loader imports this module)."""
    if name in (
        "gguf_reader",
        "gguf_tensor",
        "llama_config_from_gguf",
        "load_gguf_llama",
    ):
        from transformer_course import gguf_loader

        return getattr(gguf_loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
