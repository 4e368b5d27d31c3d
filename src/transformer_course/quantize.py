"""int8 weights: symmetric per-output-channel quantization of linear layers.

Derived in chapter 7 ("Making attention fast", smaller weights).

Source: Jacob et al. 2018, "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference", section 2 (here with zero point 0, per channel).
"""

from __future__ import annotations

import torch

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
