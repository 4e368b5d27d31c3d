"""What each key of a Llama checkpoint's configuration does to the model: read into a
``TransformerConfig`` field, accepted at one value only, skipped for a stated reason,
or refused by name (chapter 10).

A loaded model is never silently different from the reference implementation: a key
that would change it and that this library does not build is refused with an error
naming it. The tables are readable on their own: ``HF_LLAMA_KEYS`` (a Hugging Face
``LlamaConfig``) with ``HF_ROPE_TYPES`` (its RoPE parameters) here, and
``gguf_loader.GGUF_LLAMA_KEYS`` (a GGUF file's metadata); ``check_keys`` checks a
config against one. RoPE scaling of type "linear" and "llama3" becomes
``TransformerConfig.rope_freq_factors``, computed as transformers'
``modeling_rope_utils`` computes the frequencies; ``attention_bias`` and ``mlp_bias``
become ``bias`` and ``ff_bias``. The weights themselves are copied by ``interop``.

Sources: transformers 5, ``models/llama/configuration_llama.py`` and
``modeling_rope_utils.py`` (``_compute_linear_scaling_rope_parameters``,
``_compute_llama3_parameters``); Grattafiori et al. 2024, "The Llama 3 Herd of Models".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from transformer_course.model import TransformerConfig

# What the Llama loaders do with each key of a checkpoint's configuration: "read"
# (it sets the TransformerConfig field named), "must" (only that value is accepted:
# another one would make a model this library does not build, so it is refused by
# name), "skip" (it changes nothing in the logits, for the reason given). A key in no
# table is refused by name; "prefix.*" covers every key under a prefix.
READ, MUST, SKIP = "read", "must", "skip"

#: The keys of a Hugging Face ``LlamaConfig`` (``to_dict()`` in transformers 5, or a
#: config.json; the 4.x names ``rope_theta``, ``rope_scaling``, ``torch_dtype`` too).
HF_LLAMA_KEYS = {
    "model_type": (MUST, "llama"),
    "vocab_size": (READ, "tgt_vocab_size"),
    "hidden_size": (READ, "d_model"),
    "intermediate_size": (READ, "d_ff"),
    "num_hidden_layers": (READ, "n_layers"),
    "num_attention_heads": (READ, "n_heads"),
    "num_key_value_heads": (READ, "n_kv_heads"),
    "head_dim": (READ, "head_dim"),
    "max_position_embeddings": (READ, "max_len"),
    "rms_norm_eps": (READ, "layer_norm_eps"),
    "tie_word_embeddings": (READ, "tie_embeddings"),
    "attention_bias": (READ, "bias"),  # q, k, v and o projections
    "mlp_bias": (READ, "ff_bias"),  # gate, up and down projections
    "rope_parameters": (READ, "rope_base, rope_freq_factors (HF_ROPE_TYPES)"),
    "rope_theta": (READ, "rope_base"),  # transformers 4
    "rope_scaling": (READ, "rope_freq_factors (HF_ROPE_TYPES)"),  # transformers 4
    "hidden_act": (MUST, "silu"),  # SwiGLU's gate
    "is_encoder_decoder": (MUST, False),
    "pruned_heads": (MUST, {}),  # transformers 4
    "attention_dropout": (SKIP, "dropout acts in training only; built with 0"),
    "initializer_range": (SKIP, "the initialisation of new weights; these are loaded"),
    "pretraining_tp": (SKIP, "transformers 5's Llama never reads it (4.x: same sums)"),
    "chunk_size_feed_forward": (SKIP, "Llama never reads it"),
    "pad_token_id": (SKIP, "padding is marked by attention_mask"),
    "bos_token_id": (SKIP, "generation's tokens, not the forward"),
    "eos_token_id": (SKIP, "generation's tokens, not the forward"),
    "use_cache": (SKIP, "the cache changes the cost, not the logits"),
    "dtype": (SKIP, "the stored dtype; weights are copied into the model's own"),
    "torch_dtype": (SKIP, "the stored dtype (transformers 4)"),
    "output_attentions": (SKIP, "what a forward returns, not what it computes"),
    "output_hidden_states": (SKIP, "what a forward returns, not what it computes"),
    "return_dict": (SKIP, "what a forward returns, not what it computes"),
    "id2label": (SKIP, "labels of a classification head, which is not built"),
    "label2id": (SKIP, "labels of a classification head, which is not built"),
    "problem_type": (SKIP, "the loss of a classification head, which is not built"),
    "architectures": (SKIP, "class names; model_type says what the model is"),
    "_name_or_path": (SKIP, "where it was loaded from"),
    "transformers_version": (SKIP, "the version that wrote it"),
}
#: The RoPE types of ``rope_parameters`` built (as transformers'
#: ``modeling_rope_utils`` computes them) and the keys each reads; another type
#: ("dynamic", "yarn", "longrope", ...) or another key is refused by name.
HF_ROPE_TYPES = {
    "default": ("rope_theta",),
    "linear": ("rope_theta", "factor"),
    "llama3": (
        "rope_theta",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
}


def check_keys(present: Mapping, table: Mapping, source: str) -> None:
    """Every key of ``present`` (a config's or file's keys and values) is in
    ``table`` (exactly, or under a "prefix.*"), and every "must" key has its value.

    Raises ValueError naming the first key that is unknown or has another value.
    (A value is read only to check or name it: a GGUF token list is long.)"""
    prefixes = {k[:-1]: rule for k, rule in table.items() if k.endswith(".*")}
    for key in present:
        rule = table.get(key)
        if rule is None:
            rule = next((r for p, r in prefixes.items() if key.startswith(p)), None)
        if rule is None:
            raise ValueError(
                f"{source}: key {key!r} = {_short(present[key])} is not one this "
                "loader knows, so it is refused (it may change the model; see the "
                "loader's table of keys)"
            )
        kind, detail = rule
        if kind == MUST and present[key] != detail:
            raise ValueError(
                f"{source}: key {key!r} must be {detail!r} for the model this library "
                f"builds, got {_short(present[key])}"
            )


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def llama3_freq_factors(
    d_k: int,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> tuple[float, ...]:
    """Llama 3's RoPE scaling as d_k/2 factors dividing the frequencies theta_i:
    1 for wavelengths 2 pi / theta_i under original / high_freq_factor, ``factor``
    above original / low_freq_factor, and in between 1 / ((1 - s) / factor + s) with
    s = (original / wavelength - low) / (high - low). Source: transformers'
    ``_compute_llama3_parameters``; llama.cpp's converter writes the same factors as
    a GGUF's ``rope_freqs``."""
    theta = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (d/2,)
    wavelength = 2 * math.pi / theta
    s = (original_max_position_embeddings / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    f = 1 / ((1 - s) / factor + s)  # the band between
    f = torch.where(
        wavelength < original_max_position_embeddings / high_freq_factor, 1.0, f
    )
    f = torch.where(
        wavelength > original_max_position_embeddings / low_freq_factor, factor, f
    )
    return tuple(f.tolist())


def _hf_rope(d: Mapping, d_k: int) -> tuple[float, tuple[float, ...] | None]:
    """(rope_base, rope_freq_factors) of an HF config's RoPE parameters."""
    rope = d.get("rope_parameters")
    if rope is None:  # transformers 4: rope_theta and rope_scaling apart
        rope = {
            "rope_theta": d.get("rope_theta", 10000.0),
            **(d.get("rope_scaling") or {}),
        }
    rope = dict(rope)
    kind = rope.pop("rope_type", rope.pop("type", "default"))
    if kind not in HF_ROPE_TYPES:
        raise ValueError(
            f"rope_parameters: rope_type {kind!r} is not built by this library (it "
            f"would be loaded wrongly, so it is refused); built: {sorted(HF_ROPE_TYPES)}"
        )
    if rope.get("partial_rotary_factor", 1.0) == 1.0:
        rope.pop("partial_rotary_factor", None)  # every coordinate rotates: the default
    for key in rope:
        if key not in HF_ROPE_TYPES[kind]:
            raise ValueError(
                f"rope_parameters: key {key!r} = {_short(rope[key])} is not read for "
                f"rope_type {kind!r} (it may change the model), so it is refused"
            )
    base = float(rope.get("rope_theta", 10000.0))
    if kind == "default":
        return base, None
    try:
        if kind == "linear":
            return base, (float(rope["factor"]),) * (d_k // 2)
        return base, llama3_freq_factors(
            d_k, base, **{k: rope[k] for k in HF_ROPE_TYPES[kind][1:]}
        )
    except KeyError as err:
        raise ValueError(
            f"rope_parameters: rope_type {kind!r} needs {err.args[0]!r}, it is missing"
        ) from None


_HF_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
LLAMA_SWITCHES = {  # what every Llama-family model has
    "positional": "rope",
    "norm": "rms",
    "activation": "swiglu",
    "dropout": 0.0,
    "scale_embeddings": False,
    "norm_first": True,
    "src_vocab_size": 1,  # no encoder
    "pad_id": 0,
}


def llama_config_from_hf(hf) -> TransformerConfig:
    """The ``TransformerConfig`` of a Hugging Face ``LlamaConfig`` (or its config.json
    as a dict): half RoPE layout, every key handled as ``HF_LLAMA_KEYS`` says, RoPE
    scaling of type "linear" or "llama3" as ``rope_freq_factors``, the biases of
    ``attention_bias`` and ``mlp_bias``.

    Raises:
        ValueError: a key not in ``HF_LLAMA_KEYS``, a "must" key with another value
            (model_type, hidden_act, ...), a RoPE type or RoPE key not built, each
            named.
    """
    d = dict(hf.to_dict() if hasattr(hf, "to_dict") else hf)
    check_keys(d, HF_LLAMA_KEYS, "hf config")
    for key in _HF_REQUIRED:
        if key not in d:
            raise ValueError(
                f"hf config: key {key!r} is missing (a config.json without it gets "
                "LlamaConfig's default: load it with LlamaConfig.from_dict)"
            )
    fields = {
        field: d[key]
        for key, (kind, field) in HF_LLAMA_KEYS.items()
        if kind == READ and key in d and not key.startswith("rope")
    }
    fields.setdefault("n_kv_heads", fields["n_heads"])
    d_k = fields.get("head_dim") or fields["d_model"] // fields["n_heads"]
    rope_base, factors = _hf_rope(d, d_k)
    fields["bias"] = bool(fields.get("bias", False))
    fields["ff_bias"] = bool(fields.get("ff_bias", False))
    fields["tie_embeddings"] = bool(fields.get("tie_embeddings", False))
    fields["layer_norm_eps"] = float(fields.get("layer_norm_eps", 1e-6))
    return TransformerConfig(
        **fields,
        rope_base=rope_base,
        rope_freq_factors=factors,
        **LLAMA_SWITCHES,
    )
