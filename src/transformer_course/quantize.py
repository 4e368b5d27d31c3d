"""int8 weights: symmetric per-output-channel quantization of linear layers.

Derived in chapter 7 ("Making attention fast", smaller weights); used on whole models
in chapter 7, chapter 9 and ``benchmarks/run.py`` (``quantize_linear_weights_``).

Source: Jacob et al. 2018, "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference", section 2 (here with zero point 0, per channel).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

Tensor = torch.Tensor


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
