"""int8 weights, and reading llama.cpp's Q4_1 and Q8_0 blocks.

Derived in chapter 7 ("Making attention fast", smaller weights: int8 per output
channel; used on whole models in chapter 7, chapter 9 and ``benchmarks/run.py`` through
``quantize_linear_weights_``) and chapter 10 ("A modern LLM": the 4-bit blocks of a real
GGUF file).

Q4_1 stores a row in blocks of 32 weights, 20 bytes each: a float16 scale d, a float16
minimum m, and 32 unsigned 4-bit codes q packed two per byte (byte j holds weight j in
its low nibble and weight j + 16 in its high one); w = d * q + m. That is 5 bits a
weight. Q8_0 blocks are a float16 scale and 32 int8 codes (8.5 bits a weight).

Sources: Jacob et al. 2018, "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference", section 2 (here with zero point 0, per channel);
ggml's ``block_q4_1``, ``dequantize_row_q4_1`` and ``quantize_row_q4_1_ref``
(ggml-quants.c); Dettmers et al. 2022 (LLM.int8()).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

Tensor = torch.Tensor
BLOCK = 32  # weights per Q4_1 / Q8_0 block
Q4_1_BYTES = 20  # float16 d, float16 m, 16 bytes of 4-bit codes
Q8_0_BYTES = 34  # float16 d, 32 int8 codes


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8 quantization of a weight matrix.

    Row i is divided by scale_i = max_j |w_ij| / 127 and rounded, so the largest
    entry of each row maps to +-127 and zero stays exactly zero.

    Args:
        weight: (d_out, d_in) floating-point weights (an ``nn.Linear.weight``).

    Returns:
        ``(w_int8, scale)``: int8 (d_out, d_in) and float32 (d_out, 1), with
        ``w_int8 * scale`` close to ``weight`` (error at most scale / 2 per entry).
        A row of zeros gets scale 1.

    Raises:
        TypeError: if ``weight`` is not a floating-point tensor.
        ValueError: if it is not 2-D.

    Source: Jacob et al. 2018, "Quantization and Training of Neural Networks for
    Efficient Integer-Arithmetic-Only Inference", section 2 (with zero point 0).
    """
    if not isinstance(weight, Tensor) or not weight.dtype.is_floating_point:
        raise TypeError("weight: expected a floating-point torch.Tensor")
    if weight.dim() != 2:
        raise ValueError(
            f"weight: expected shape (d_out, d_in), got {tuple(weight.shape)}"
        )
    w = weight.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127.0  # (d_out, 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    w_int8 = torch.round(w / scale).clamp(-127, 127).to(torch.int8)  # (d_out, d_in)
    return w_int8, scale


def dequantize_int8(w_int8: Tensor, scale: Tensor) -> Tensor:
    """float32 weights back from ``quantize_int8``: w_int8 * scale, (d_out, d_in)."""
    return w_int8.float() * scale


def quantize_linear_weights_(module: nn.Module) -> int:
    """Round every ``nn.Linear`` weight inside ``module`` to int8, in place.

    Each weight is replaced by ``dequantize_int8(*quantize_int8(weight))``: the model
    then runs in float32 with exactly the values an int8 file would restore.

    Returns:
        The bytes ``module``'s parameters take stored that way: each linear weight as
        int8 plus one float32 scale per output row, every other parameter (biases,
        norms, embeddings) at its own element size. A parameter shared by two modules
        counts once.
    """
    linear = {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear)}
    n_bytes = 0
    with torch.no_grad():
        for p in module.parameters():
            if id(p) in linear:
                w_int8, scale = quantize_int8(p)
                p.copy_(dequantize_int8(w_int8, scale))
                n_bytes += w_int8.numel() + scale.numel() * scale.element_size()
            else:
                n_bytes += p.numel() * p.element_size()
    return n_bytes


def torchao_int8(model: nn.Module) -> dict[str, nn.Module]:
    """Copies of ``model`` quantized by ``torchao.quantization.quantize_``: int8
    weight-only (activations stay float) and int8 dynamic (activations quantized per
    token at run time, so the matrix products run in int8).

    Raises:
        ImportError when torchao is not installed; whatever torchao raises on a
        machine it cannot quantize for (the chapter and the benchmark report it).
    """
    import logging
    import warnings

    for noisy in ("torchao", "torch.utils._pytree"):  # import-time notices
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization import (
            Int8DynamicActivationInt8WeightConfig,
            Int8WeightOnlyConfig,
            quantize_,
        )
    configs = {
        "torchao int8 weight-only": Int8WeightOnlyConfig(),
        "torchao int8 dynamic": Int8DynamicActivationInt8WeightConfig(),
    }
    out = {}
    for name, config in configs.items():
        out[name] = copy.deepcopy(model)
        quantize_(out[name], config)
    return out


def _blocks(raw, nbytes: int, what: str) -> Tensor:
    raw = torch.as_tensor(raw)
    if raw.dtype != torch.uint8 or raw.dim() < 1 or raw.shape[-1] % nbytes:
        raise ValueError(
            f"raw: expected uint8 (..., n_blocks * {nbytes}) {what} bytes, got "
            f"{raw.dtype} {tuple(raw.shape)}"
        )
    return raw.reshape(*raw.shape[:-1], -1, nbytes)  # (..., n_blocks, nbytes)


def _half(two_bytes: Tensor) -> Tensor:
    """Little-endian float16 from (..., 2) bytes, as float32 (...)."""
    return two_bytes.contiguous().view(torch.float16)[..., 0].float()


def dequantize_q4_1(raw) -> Tensor:
    """float32 weights of Q4_1 rows: w = d * q + m in each block of 32.

    Shapes: raw uint8 (..., n_blocks * 20) (a GGUF tensor's bytes, one row per output
    feature) -> (..., n_blocks * 32).

    Raises ValueError if ``raw`` is not uint8 with a multiple of 20 bytes a row.
    Source: ggml-quants.c, ``dequantize_row_q4_1``.
    """
    b = _blocks(raw, Q4_1_BYTES, "Q4_1")
    d, m = _half(b[..., 0:2])[..., None], _half(b[..., 2:4])[..., None]  # (..., n, 1)
    qs = b[..., 4:].long()  # (..., n, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # (..., n, 32): low nibbles first
    return (d * q + m).flatten(-2)


def quantize_q4_1(w: Tensor) -> Tensor:
    """Q4_1 bytes of float weights (..., k * 32): per block m = min, d = (max - min) /
    15, q = round((w - m) / d) in 0..15. Inverse of ``dequantize_q4_1`` up to d / 2
    (plus float16 rounding of d and m).

    Raises ValueError if the last dimension is not a multiple of 32.
    Source: ggml-quants.c, ``quantize_row_q4_1_ref``.
    """
    if w.shape[-1] % BLOCK:
        raise ValueError(f"w: expected (..., k * {BLOCK}), got {tuple(w.shape)}")
    x = w.detach().float().reshape(*w.shape[:-1], -1, BLOCK)  # (..., n, 32)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = ((x - lo) * inv + 0.5).floor().clamp(0, 15).to(torch.uint8)  # (..., n, 32)
    packed = q[..., :16] | (q[..., 16:] << 4)  # (..., n, 16)
    dm = torch.cat([d, lo], -1).half().view(torch.uint8)  # (..., n, 4)
    return torch.cat([dm, packed], -1).flatten(-2)


def dequantize_q8_0(raw) -> Tensor:
    """float32 weights of Q8_0 rows: w = d * q, q int8, 32 per block.

    Shapes: raw uint8 (..., n_blocks * 34) -> (..., n_blocks * 32).
    Raises ValueError for a size that is not a multiple of 34 bytes.
    Source: ggml-quants.c, ``dequantize_row_q8_0``.
    """
    b = _blocks(raw, Q8_0_BYTES, "Q8_0")
    return (
        _half(b[..., 0:2])[..., None] * b[..., 2:].view(torch.int8).float()
    ).flatten(-2)
