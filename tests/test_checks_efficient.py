"""Chapter 7's exercise checks: a right answer passes, the stub is "not attempted",
and each typical mistake is rejected with its own message."""

import math

import pytest
import torch

from transformer_course.attention import repeat_kv
from transformer_course.exercises import (
    CheckError,
    check_online_softmax,
    check_quantize_int8,
    check_repeat_kv,
    check_streaming_attention,
)
from transformer_course.flash import online_softmax
from transformer_course.quantize import quantize_int8


def stub(*args):
    raise NotImplementedError("your code here")


def softmax_no_rescale(x, block):
    m, l = x.new_tensor(float("-inf")), x.new_tensor(0.0)
    for j in range(0, len(x), block):
        m = torch.maximum(m, x[j : j + block].max())
        l = l + torch.exp(x[j : j + block] - m).sum()
    return torch.exp(x - m) / l


def softmax_nan_on_masked_block(x, block):
    m, l = x.new_tensor(float("-inf")), x.new_tensor(0.0)
    for j in range(0, len(x), block):
        m_new = torch.maximum(m, x[j : j + block].max())
        l = l * torch.exp(m - m_new) + torch.exp(x[j : j + block] - m_new).sum()
        m = m_new
    return torch.exp(x - m) / l


def streaming(q, k, v, block, rescale_output=True):
    m, l, acc = -math.inf, 0.0, torch.zeros(v.shape[-1])
    s = k @ q / math.sqrt(q.shape[-1])
    for j in range(0, len(s), block):
        m_new = max(m, s[j : j + block].max().item())
        p = torch.exp(s[j : j + block] - m_new)
        alpha = math.exp(m - m_new)
        l = l * alpha + p.sum().item()
        acc = (acc * alpha if rescale_output else acc) + p @ v[j : j + block]
        m = m_new
    return acc / l


def test_online_softmax_check(capsys):
    assert check_online_softmax(lambda x, b: online_softmax(x, b)[0])
    assert check_online_softmax(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(CheckError, match="not rescaled"):
        check_online_softmax.strict(softmax_no_rescale)
    with pytest.raises(CheckError, match="all -inf gives NaN"):
        check_online_softmax.strict(softmax_nan_on_masked_block)
    with pytest.raises(CheckError, match="overflow"):
        check_online_softmax.strict(lambda x, b: torch.exp(x) / torch.exp(x).sum())


def test_streaming_attention_check():
    assert check_streaming_attention(streaming)
    assert check_streaming_attention(stub) is False
    with pytest.raises(CheckError, match="partial output is not rescaled"):
        check_streaming_attention.strict(
            lambda q, k, v, b: streaming(q, k, v, b, rescale_output=False)
        )


def test_repeat_kv_check():
    assert check_repeat_kv(repeat_kv)
    assert check_repeat_kv(stub) is False
    with pytest.raises(CheckError, match="tiled"):
        check_repeat_kv.strict(lambda x, n: x.repeat(1, n, 1, 1))
    with pytest.raises(CheckError, match="dimension 1"):
        check_repeat_kv.strict(lambda x, n: x)


def test_quantize_int8_check():
    assert check_quantize_int8(quantize_int8)
    assert check_quantize_int8(stub) is False

    def per_tensor(w):
        scale = w.abs().max() / 127 * torch.ones(w.shape[0], 1)
        return torch.round(w / scale).to(torch.int8), scale

    def truncating(w):
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        return (w / scale).to(torch.int8), scale

    def no_int8(w):
        w_int8, scale = quantize_int8(w)
        return w_int8.float(), scale

    with pytest.raises(CheckError, match="per-tensor"):
        check_quantize_int8.strict(per_tensor)
    with pytest.raises(CheckError, match="truncated"):
        check_quantize_int8.strict(truncating)
    with pytest.raises(CheckError, match="torch.int8"):
        check_quantize_int8.strict(no_int8)
