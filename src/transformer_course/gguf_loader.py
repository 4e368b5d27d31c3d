"""GGUF files, llama.cpp's format, into a Llama-family ``DecoderOnlyLM`` (chapter 10).

Read through the ``gguf`` package, as llama.cpp reads them (``llama_model::
load_hparams`` and the "llama" architecture's tensors in ``src/llama-model.cpp``):

- every metadata key is handled as ``GGUF_LLAMA_KEYS`` says (``checkpoint_keys.check_keys``:
  read, one value accepted, or skipped for a stated reason; an unknown key is refused
  by name), with llama.cpp's defaults for the optional ones: ``rope.freq_base`` 10000,
  ``head_count_kv`` = ``head_count``, ``vocab_size`` = the token list's length,
  ``key_length`` = ``value_length`` = ``embedding_length / head_count``;
- every tensor is one the model has (the biases too, which llama.cpp loads when a
  file has them) or ``rope_freqs.weight``, the factors that divide RoPE's frequencies
  (``ggml_rope_ext``'s freq_factors; llama.cpp's converter writes Llama 3's scaling
  so), or the file is refused naming it;
- a big-endian file (the ``gguf`` reader reports it) has its F32 and F16 tensors
  read in its own byte order; its quantized tensors are refused by name (their
  blocks would need llama.cpp's ``gguf_convert_endian``).

The names of the tensors, the copy routine and the RoPE layout check are
``interop``'s (GGUF stores W^Q and W^K rows "interleaved"). Sources: llama.cpp
``src/llama-model.cpp``, ``convert_hf_to_gguf.py`` (``LlamaModel``); gguf-py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from transformer_course.checkpoint_keys import (
    LLAMA_SWITCHES,
    MUST,
    READ,
    SKIP,
    check_keys,
)
from transformer_course.interop import (
    _check_layout,
    _llama_names_of,
    _load_table,
    _refuse_unused,
)
from transformer_course.model import DecoderOnlyLM, TransformerConfig

Tensor = torch.Tensor

#: The metadata keys of a "llama" GGUF file and what the loader does with each
#: (``checkpoint_keys``' READ / MUST / SKIP); "prefix.*" covers a whole prefix.
GGUF_LLAMA_KEYS = {
    "general.architecture": (MUST, "llama"),
    "general.*": (SKIP, "the file's description (name, license, file type)"),
    "GGUF.*": (SKIP, "the header (version, counts), read by gguf"),
    "tokenizer.*": (SKIP, "the tokenizer (chat.gguf_tokenizer), not the network"),
    "llama.vocab_size": (READ, "tgt_vocab_size"),  # default: the token list's length
    "llama.context_length": (READ, "max_len"),
    "llama.embedding_length": (READ, "d_model"),
    "llama.block_count": (READ, "n_layers"),
    "llama.feed_forward_length": (READ, "d_ff"),
    "llama.attention.head_count": (READ, "n_heads"),
    "llama.attention.head_count_kv": (READ, "n_kv_heads"),  # default: head_count
    "llama.attention.key_length": (READ, "head_dim"),  # default: d_model / n_heads
    "llama.attention.value_length": (READ, "head_dim (must equal key_length)"),
    "llama.rope.dimension_count": (READ, "must be the head size (no partial RoPE)"),
    "llama.attention.layer_norm_rms_epsilon": (READ, "layer_norm_eps"),
    "llama.rope.freq_base": (READ, "rope_base"),  # default: 10000
    "llama.rope.scaling.type": (READ, "'none', or 'linear' (the default)"),
    "llama.rope.scaling.factor": (READ, "rope_freq_factors when linear"),
    "llama.rope.scale_linear": (READ, "rope_freq_factors (scaling.factor's old name)"),
    "llama.rope.scaling.original_context_length": (SKIP, "YaRN's only (refused)"),
    "llama.rope.scaling.finetuned": (
        SKIP,
        "a note; llama.cpp computes nothing from it",
    ),
    "llama.expert_count": (MUST, 0),  # mixture of experts: not built
    "llama.expert_used_count": (MUST, 0),
}
_REQUIRED = (  # llama.cpp refuses a "llama" file without these
    "llama.context_length",
    "llama.embedding_length",
    "llama.block_count",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.layer_norm_rms_epsilon",
)
ROPE_FREQS = "rope_freqs.weight"  # (d_k / 2,) factors dividing RoPE's frequencies


def gguf_reader(path: str | Path):
    """A ``gguf.GGUFReader`` of the file at ``path`` (raises ImportError naming the
    pip command when the ``gguf`` package is missing)."""
    try:
        import gguf
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("GGUF files are read with `pip install gguf`") from err
    return gguf.GGUFReader(str(path))


def gguf_tensor(reader, name: str) -> Tensor | None:
    """The tensor ``name`` of a GGUF file, dequantized to float32 (rows, cols) as an
    ``nn.Linear.weight`` is laid out (GGUF's shape lists the sizes reversed), or None
    when the file has no such tensor. A big-endian file's F32/F16 tensors are read in
    its byte order.

    Raises ValueError naming a quantized tensor of a file in the other byte order."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    for t in reader.tensors:
        if t.name != name:
            continue
        data = t.data
        if getattr(reader, "byte_order", "I") == "S":  # not the host's byte order
            if t.tensor_type not in (
                GGMLQuantizationType.F32,
                GGMLQuantizationType.F16,
            ):
                raise ValueError(
                    f"gguf file: tensor {name!r} is {t.tensor_type.name} in a file of "
                    f"the other byte order ({reader.endianess.name}); only F32 and F16 "
                    "tensors are swapped here (convert with gguf_convert_endian)"
                )
            data = data.astype(data.dtype.newbyteorder("="))  # the values, host order
        return torch.from_numpy(dequantize(data, t.tensor_type).copy()).float()
    return None


class _Metadata(Mapping):
    """A reader's metadata as key -> value, each value read only when asked for (the
    token list has tens of thousands of entries)."""

    def __init__(self, reader):
        self.fields = reader.fields

    def __getitem__(self, key):
        return self.fields[key].contents()

    def __iter__(self):
        return iter(self.fields)

    def __len__(self):
        return len(self.fields)


def _one(meta: Mapping, key: str, cast, default=None):
    """The value of ``key`` (one for every layer), cast; ``default`` when absent."""
    if key not in meta:
        if default is None:
            raise ValueError(f"gguf file: metadata key {key!r} is missing")
        return default
    value = meta[key]
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(
                f"gguf file: {key!r} differs between layers ({value[:6]}...), this "
                "library builds one size for every layer"
            )
        value = value[0]
    return cast(value)


def _rope_freq_factors(reader, meta: Mapping, d_k: int) -> tuple[float, ...] | None:
    """``rope_freqs.weight`` times the linear scaling factor, or None for neither."""
    kind = _one(meta, "llama.rope.scaling.type", str, "linear")
    if kind not in ("none", "linear"):
        raise ValueError(
            f"gguf file: 'llama.rope.scaling.type' = {kind!r} is not built by this "
            "library (only 'none' and 'linear'), so it is refused"
        )
    scale = 1.0
    if kind == "linear":  # llama.cpp: freq_scale = 1 / factor, 0 meaning none
        key = "llama.rope.scaling.factor"
        key = key if key in meta else "llama.rope.scale_linear"
        scale = _one(meta, key, float, 0.0) or 1.0
    freqs = gguf_tensor(reader, ROPE_FREQS)
    if freqs is None and scale == 1.0:
        return None
    if freqs is None:
        freqs = torch.ones(d_k // 2)
    if freqs.numel() != d_k // 2:
        raise ValueError(
            f"gguf file: {ROPE_FREQS!r} has {freqs.numel()} factors, expected "
            f"d_k / 2 = {d_k // 2}"
        )
    return tuple((freqs.double().flatten() * scale).tolist())


def llama_config_from_gguf(reader) -> TransformerConfig:
    """The ``TransformerConfig`` of a GGUF "llama" file: sizes from its metadata (as
    ``GGUF_LLAMA_KEYS`` says, llama.cpp's defaults for the optional keys), the
    interleaved RoPE layout, ``rope_freq_factors`` from ``rope_freqs.weight`` and
    linear scaling, biases when the file has them, tied embeddings when it has no
    ``output.weight``.

    Raises ValueError if the architecture is not "llama", naming a key the table
    refuses, a required key that is missing, a value length or RoPE dimension other
    than the head size, or a RoPE scaling type other than "none" and "linear"."""
    meta = _Metadata(reader)
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(
            f"reader: expected a 'llama' GGUF file (general.architecture), got {arch!r}"
        )
    check_keys(meta, GGUF_LLAMA_KEYS, "gguf file")
    for key in _REQUIRED:
        _one(meta, key, int if "epsilon" not in key else float)  # raises if missing
    d_model = _one(meta, "llama.embedding_length", int)
    n_heads = _one(meta, "llama.attention.head_count", int)
    d_k = _one(meta, "llama.attention.key_length", int, d_model // n_heads)
    for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
        if _one(meta, key, int, d_k) != d_k:
            raise ValueError(
                f"gguf file: {key!r} = {meta[key]} differs from the head size {d_k} "
                "(key_length), which this library's attention needs, so it is refused"
            )
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens.data) if tokens is not None else None
    names = {t.name for t in reader.tensors}
    return TransformerConfig(
        tgt_vocab_size=_one(meta, "llama.vocab_size", int, n_tokens),
        d_model=d_model,
        d_ff=_one(meta, "llama.feed_forward_length", int),
        n_layers=_one(meta, "llama.block_count", int),
        n_heads=n_heads,
        n_kv_heads=_one(meta, "llama.attention.head_count_kv", int, n_heads),
        head_dim=d_k if "llama.attention.key_length" in meta else None,
        layer_norm_eps=_one(meta, "llama.attention.layer_norm_rms_epsilon", float),
        max_len=_one(meta, "llama.context_length", int),
        rope_base=_one(meta, "llama.rope.freq_base", float, 10000.0),
        rope_freq_factors=_rope_freq_factors(reader, meta, d_k),
        bias="blk.0.attn_q.bias" in names,
        ff_bias="blk.0.ffn_up.bias" in names,
        tie_embeddings="output.weight" not in names,
        rope_layout="interleaved",
        **LLAMA_SWITCHES,
    )


def load_gguf_llama(
    model: DecoderOnlyLM, reader, *, check_layout: bool = True
) -> DecoderOnlyLM:
    """Copy the tensors of a GGUF "llama" file (a ``gguf_reader``) into ``model``,
    dequantized to float32 and in GGUF's own (interleaved) RoPE layout. Returns it.

    Raises: as ``interop.load_hf_llama``, with "interleaved" as the layout it needs;
    ValueError when the model's RoPE frequencies (``rope_base``,
    ``rope_freq_factors``), norm epsilon or ``tie_embeddings`` differ from the file's
    (build the model from ``llama_config_from_gguf``), or for a tensor of the file the
    model has no place for, each named.
    """
    if check_layout:
        _check_layout(model, "gguf")
    theirs = llama_config_from_gguf(reader)
    for field in ("rope_base", "rope_freq_factors", "layer_norm_eps", "tie_embeddings"):
        mine, stored = getattr(model.cfg, field), getattr(theirs, field)
        if not _close(mine, stored):
            raise ValueError(
                f"{field}: the model has {mine}, the gguf file {stored} (build the "
                "model from llama_config_from_gguf(reader))"
            )
    names = _llama_names_of(model, "gguf")
    stored_names = [t.name for t in reader.tensors]
    _refuse_unused(names, stored_names, "gguf file", skip=(ROPE_FREQS,))
    return _load_table(model, names, lambda n: gguf_tensor(reader, n), "gguf file")


def _close(a, b) -> bool:
    if a is None or b is None or isinstance(a, bool):
        return a == b
    a, b = (a,) if isinstance(a, float) else a, (b,) if isinstance(b, float) else b
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b)
    )
