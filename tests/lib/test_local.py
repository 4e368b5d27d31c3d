"""Tiled (FlashAttention-style), sliding-window and grouped-query attention against the
naive reference and PyTorch (chapter 7). Pitfalls P1, P17, P18."""

import pytest
import torch

from transformer_course.attention import (
    scaled_dot_product_attention,
)
from transformer_course.local import sliding_window_attention
from transformer_course.masks import causal_mask, padding_mask, sliding_window_mask

param = pytest.mark.parametrize


def naive(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)[0]


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


@param("window, block", [(1, None), (4, None), (5, 3), (16, 7), (40, None)])
def test_sliding_window_equals_masked_attention(window, block, qkv):
    q, k, v = qkv(2, 2, 33, d=16)
    out, _ = sliding_window_attention(q, k, v, window, block=block)
    assert max_err(out, naive(q, k, v, sliding_window_mask(33, window))) < 1e-5


def test_sliding_window_with_cache_and_padding(qkv):
    q, k, v = qkv(2, 2, 6, 20, 16)  # the last 6 of 20 positions, as with a KV cache
    pad = padding_mask(torch.tensor([20, 17]), max_len=20)
    out, _ = sliding_window_attention(q, k, v, 5, pad, block=4)
    ref = naive(q, k, v, sliding_window_mask(6, 5, 20) & pad)
    assert max_err(out, ref) < 1e-5


@param("window", [33, 34, 100])
def test_sliding_window_at_least_length_is_full_causal(window, qkv):
    q, k, v = qkv(2, 2, 33, d=16)
    out, _ = sliding_window_attention(q, k, v, window)
    assert max_err(out, naive(q, k, v, causal_mask(33))) < 1e-5
    short, _ = sliding_window_attention(q, k, v, 8)
    assert max_err(short, naive(q, k, v, causal_mask(33))) > 1e-2
