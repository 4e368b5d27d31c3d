"""Tiled attention (flash.py, chapter 7) against PyTorch's own
``F.scaled_dot_product_attention``: every tile shape the benchmark sweeps, the
all-rows-at-once path (``block_q=None``), masks, causal, bias and gradients. Speed is
measured in benchmarks/run.py, never asserted here."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course.flash import tiled_attention
from transformer_course.masks import causal_mask

param = pytest.mark.parametrize

# T = 75 and S = 53 are multiples of none of these blocks (pitfall P17)
BLOCKS = [(16, 16), (32, 24), (None, 16), (None, 64), (7, None), (200, 200)]


def qkv(t=75, s=53, d=16, requires_grad=False):
    g = torch.Generator().manual_seed(t * 1000 + s)
    shapes = ((2, 3, t, d), (2, 3, s, d), (2, 3, s, d))
    return tuple(
        torch.randn(*shape, generator=g).requires_grad_(requires_grad)
        for shape in shapes
    )


def tiled(q, k, v, mask=None, *, block_q, block_k, **kw):
    block_k = k.shape[-2] if block_k is None else block_k
    return tiled_attention(q, k, v, mask, block_q=block_q, block_k=block_k, **kw)[0]


def err(a, b):
    return (a - b).abs().max().item()


@param("block_q, block_k", BLOCKS)
def test_equals_torch_sdpa(block_q, block_k):
    q, k, v = qkv()
    out = tiled(q, k, v, block_q=block_q, block_k=block_k)
    assert err(out, F.scaled_dot_product_attention(q, k, v)) < 1e-5
    # known-wrong: keys in the wrong order pair scores with the wrong values
    wrong = tiled(q, k.flip(-2), v, block_q=block_q, block_k=block_k)
    assert err(wrong, F.scaled_dot_product_attention(q, k, v)) > 1e-2


@param("block_q, block_k", BLOCKS)
def test_masks_and_causal_equal_torch_sdpa(block_q, block_k):
    q, k, v = qkv(t=75, s=75)
    g = torch.Generator().manual_seed(1)
    per_head = torch.rand(2, 3, 75, 75, generator=g) > 0.4  # (B, H, T, S)
    per_head[..., 0] = True  # every query sees a key (PyTorch gives NaN otherwise)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=per_head)
    out = tiled(q, k, v, per_head, block_q=block_q, block_k=block_k)
    assert err(out, ref) < 1e-5
    ref_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    flag = tiled(q, k, v, causal=True, block_q=block_q, block_k=block_k)
    as_mask = tiled(q, k, v, causal_mask(75), block_q=block_q, block_k=block_k)
    assert err(flag, ref_causal) < 1e-5 and err(as_mask, ref_causal) < 1e-5
    unmasked = tiled(q, k, v, block_q=block_q, block_k=block_k)
    assert err(unmasked, ref_causal) > 1e-2


def test_causal_with_fewer_queries_than_keys_is_bottom_right():
    q, k, v = qkv(t=20, s=53)  # the 20 queries are the last 20 positions
    mask = causal_mask(20, 53)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for block_q, block_k in BLOCKS:
        out = tiled(q, k, v, causal=True, block_q=block_q, block_k=block_k)
        assert err(out, ref) < 1e-5


def test_bias_equals_torch_float_mask():
    q, k, v = qkv()
    bias = torch.randn(3, 75, 53)  # (H, T, S), broadcast over the batch
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    for block_q, block_k in BLOCKS:
        out = tiled(q, k, v, bias=bias, block_q=block_q, block_k=block_k)
        assert err(out, ref) < 1e-5
    assert err(tiled(q, k, v, block_q=None, block_k=16), ref) > 1e-2


@param("block_q, block_k", BLOCKS)
def test_gradients_equal_torch_sdpa(block_q, block_k):
    q, k, v = qkv(requires_grad=True)
    mask = torch.ones(75, 53, dtype=torch.bool).tril(diagonal=10)  # (T, S)
    mask[:, 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = tiled(q, k, v, mask, block_q=block_q, block_k=block_k)
    g_ref = torch.autograd.grad((ref * ref).sum(), (q, k, v))
    g_out = torch.autograd.grad((out * out).sum(), (q, k, v))
    for a, b in zip(g_out, g_ref):
        assert err(a, b) < 1e-4
    # the inputs are not modified by the in-place steps inside
    q2, k2, v2 = qkv()
    assert torch.equal(v.detach(), v2)
    assert torch.equal(q.detach(), q2) and torch.equal(k.detach(), k2)


def test_all_rows_at_once_is_one_query_block():
    q, k, v = qkv()
    assert torch.equal(
        tiled(q, k, v, block_q=None, block_k=16),
        tiled(q, k, v, block_q=75, block_k=16),
    )


def test_bad_blocks_rejected():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(TypeError, match="block_k"):
        tiled_attention(q, k, v, block_k=None)
    with pytest.raises(TypeError, match="block_q"):
        tiled_attention(q, k, v, block_q=16.0)
    with pytest.raises(ValueError, match="mask"):
        tiled_attention(q, k, v, torch.ones(75, 52, dtype=torch.bool))
