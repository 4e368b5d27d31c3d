"""Tiled (FlashAttention-style), sliding-window and grouped-query attention against the
naive reference and PyTorch (chapter 7). Pitfalls P1, P17, P18."""

import torch

from transformer_course.quantize import dequantize_int8, quantize_int8


def test_quantize_int8_per_channel():
    w = torch.randn(6, 10) * torch.logspace(-3, 1, 6)[:, None]  # rows of many sizes
    w[2] = 0.0
    w_int8, scale = quantize_int8(w)
    assert w_int8.dtype == torch.int8 and scale.shape == (6, 1)
    assert w_int8.abs().amax(dim=1).tolist() == [127, 127, 0, 127, 127, 127]
    err = (dequantize_int8(w_int8, scale) - w).abs()
    assert (err <= scale / 2 + 1e-7).all()
    per_tensor = w.abs().max() / 127  # one scale for all rows loses the small rows
    coarse = torch.round(w / per_tensor) * per_tensor
    assert (coarse - w)[0].abs().max() > err[0].max() * 10


def test_quantize_linear_weights_rounds_in_place_and_counts_int8_bytes():
    from transformer_course.quantize import quantize_linear_weights_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    w = model[0].weight.detach().clone()
    n_bytes = quantize_linear_weights_(model)
    # 12 int8 weights + 3 float32 scales + 3 float32 biases + the norm's 6 floats
    assert n_bytes == 12 + 3 * 4 + 3 * 4 + 6 * 4
    assert n_bytes != 4 * sum(p.numel() for p in model.parameters())  # not float32
    torch.testing.assert_close(model[0].weight, dequantize_int8(*quantize_int8(w)))
    assert not torch.equal(model[0].weight, w)  # really rounded
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False))
    tied.append(torch.nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    assert quantize_linear_weights_(tied) == 16 + 4 * 4  # a shared weight counts once
