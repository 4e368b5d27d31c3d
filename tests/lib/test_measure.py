"""Tiled (FlashAttention-style), sliding-window and grouped-query attention against the
naive reference and PyTorch (chapter 7). Pitfalls P1, P17, P18."""

import pytest
import torch

from transformer_course.attention import (
    scaled_dot_product_attention,
)
from transformer_course.flash import tiled_attention
from transformer_course.measure import kv_cache_bytes_per_token, peak_tensor_bytes


def naive(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)[0]


def test_kv_cache_bytes_per_token():
    assert kv_cache_bytes_per_token(4, 8, 64, torch.float16) == 2 * 4 * 8 * 64 * 2
    assert kv_cache_bytes_per_token(4, 1, 64) == 2 * 4 * 1 * 64 * 4
    with pytest.raises(ValueError, match="n_kv_heads"):
        kv_cache_bytes_per_token(4, 0, 64)


def test_peak_tensor_bytes_grows_quadratically_for_naive_only(qkv):
    def peaks(t):
        q, k, v = qkv(1, 1, t, d=16)
        naive_bytes = peak_tensor_bytes(lambda: naive(q, k, v))
        tiled_bytes = peak_tensor_bytes(
            lambda: tiled_attention(q, k, v, block_q=64, block_k=64)[0]
        )
        return naive_bytes, tiled_bytes

    (n1, t1), (n2, t2) = peaks(128), peaks(256)
    assert n1 >= 128 * 128 * 4  # at least the (T, S) float32 scores
    assert 3.5 < n2 / n1 < 4.5
    assert t2 / t1 < 2.5
    assert t2 < n2 / 4
