"""Tiled attention (flash.py, chapter 7) against PyTorch's own
``F.scaled_dot_product_attention``: every tile shape the benchmark sweeps, the
all-rows-at-once path (``block_q=None``), masks, causal, bias and gradients; the
backward pass (``TiledAttention``): gradcheck in float64, SDPA's gradients in float32,
a backward without D rejected, and its memory. Speed is measured in benchmarks/run.py,
never asserted here."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from transformer_course.attention import scaled_dot_product_attention
from transformer_course.flash import (
    TiledAttention,
    Tiles,
    tiled_attention,
    tiled_backward,
)
from transformer_course.masks import causal_mask
from transformer_course.measure import peak_tensor_bytes

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


# ------------------------------------------- the backward pass (TiledAttention, issue 29)


class NoDeltaAttention(TiledAttention):
    """Known wrong: the backward without D = rowsum(dO * O) (passing a zero output
    makes D = 0), i.e. dS = P * dP instead of P * (dP - D)."""

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, mask, bias = ctx.saved_tensors
        grads = tiled_backward(
            d_out, q, k, v, torch.zeros_like(out), lse, mask, bias, ctx.tiles
        )
        return *grads[:3], None, None, None


def grad_inputs(b, h, t, s, d, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_()
        for n in (t, s, s)
    )


def key_padding(b, s, seed):
    """(B, 1, 1, S) padding mask with random lengths; the last item sees no key."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, s + 1, (b,), generator=g)
    lengths[-1] = 0  # a fully masked batch item: every query row has no key
    return (torch.arange(s)[None, :] < lengths[:, None])[:, None, None, :]


# (B, H, T, S, d, block_q, block_k): T and S multiples of no block
GRADCHECK_SHAPES = [
    (1, 2, 7, 9, 4, 3, 4),
    (2, 1, 11, 5, 3, 4, 2),
    (1, 1, 5, 13, 6, None, 5),
    (2, 1, 9, 8, 3, 2, 3),
]


@param("b, h, t, s, d, block_q, block_k", GRADCHECK_SHAPES)
@param("masking", ["none", "causal", "padding", "padding+causal", "empty row"])
def test_gradcheck_float64(b, h, t, s, d, block_q, block_k, masking):
    q, k, v = grad_inputs(b, h, t, s, d, seed=t * 100 + s)
    mask = key_padding(b, s, seed=t) if "padding" in masking else None
    if masking == "empty row":
        mask = torch.ones(t, s, dtype=torch.bool)
        mask[t // 2] = False  # one query row sees no key at all
    causal = "causal" in masking

    def fn(q, k, v):
        return tiled(q, k, v, mask, block_q=block_q, block_k=block_k, causal=causal)

    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_gradcheck_bias_gradient():
    q, k, v = grad_inputs(2, 2, 7, 6, 4, seed=3)
    bias = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)  # (H, T, S)

    def fn(q, k, v, bias):
        return tiled(q, k, v, block_q=3, block_k=4, bias=bias, causal=True)

    assert torch.autograd.gradcheck(fn, (q, k, v, bias), fast_mode=True)


def test_backward_without_delta_fails_gradcheck():
    q, k, v = grad_inputs(1, 2, 7, 9, 4, seed=5)
    tiles = Tiles(3, 4, False, 0.5)
    right = partial(TiledAttention.apply, mask=None, bias=None, tiles=tiles)
    wrong = partial(NoDeltaAttention.apply, mask=None, bias=None, tiles=tiles)
    assert torch.autograd.gradcheck(
        lambda q, k, v: right(q, k, v), (q, k, v), fast_mode=True
    )
    assert not torch.autograd.gradcheck(
        lambda q, k, v: wrong(q, k, v), (q, k, v), raise_exception=False, fast_mode=True
    )


def sdpa_grads(q, k, v, d_out, mask=None, causal=False):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return torch.autograd.grad(out, (q, k, v), d_out)


@param("block_q, block_k", BLOCKS)
@param("t, s", [(75, 53), (53, 75), (130, 130)])
@param("causal", [False, True])
def test_gradients_equal_sdpa_float32(block_q, block_k, t, s, causal):
    q, k, v = grad_inputs(2, 3, t, s, 16, seed=t + s, dtype=torch.float32)
    d_out = torch.randn(2, 3, t, 16, generator=torch.Generator().manual_seed(9))
    pad = torch.ones(2, 1, 1, s, dtype=torch.bool)
    pad[1, ..., s // 2 :] = False  # item 1: padding keys
    mask = pad & causal_mask(t, s) if causal else pad
    visible = mask.any(-1, keepdim=True)  # (B, 1, T, 1): rows SDPA can handle
    ref = sdpa_grads(q, k, v, d_out * visible, mask | ~visible)
    out = tiled(q, k, v, pad, block_q=block_q, block_k=block_k, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out * visible)
    for a, b_ in zip(grads, ref):
        assert err(a, b_) < 1e-5
    # known wrong: the gradient of unmasked attention is far from it
    unmasked = torch.autograd.grad(
        tiled(q, k, v, block_q=block_q, block_k=block_k), (q, k, v), d_out * visible
    )
    assert err(unmasked[1], ref[1]) > 1e-2


def test_fully_masked_rows_get_zero_gradients():
    q, k, v = grad_inputs(2, 2, 6, 6, 4, seed=1, dtype=torch.float32)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    mask[1] = False  # item 1: no query sees any key
    mask[0, :, 2] = False  # item 0: query 2 sees no key
    out = tiled(q, k, v, mask, block_q=4, block_k=4)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.equal(dq[1], torch.zeros_like(dq[1])) and not dk[1].any()
    assert not dv[1].any() and not dq[0, :, 2].any()
    assert dq[0, :, 3].abs().sum() > 0  # the check can fail: other rows do get one


def test_tiled_autograd_function_is_what_training_goes_through():
    from transformer_course.attention import MultiHeadAttention

    mha = MultiHeadAttention(32, 4, backend="tiled")
    x = torch.randn(2, 9, 32, requires_grad=True)
    out, _ = mha(x, x, x, causal_mask(9))
    nodes, seen = [out.grad_fn], set()
    while nodes:  # walk the graph: a TiledAttention node must be in it
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes += [n for n, _ in node.next_functions]
    names = {type(n).__name__ for n in seen}
    assert "TiledAttentionBackward" in names
    mha.backend = "naive"
    out, _ = mha(x, x, x, causal_mask(9))
    assert "TiledAttentionBackward" not in {type(out.grad_fn).__name__}


def test_backward_stores_no_t_by_t_matrix():
    def forward_backward_bytes(fn, t):
        q, k, v = grad_inputs(1, 1, t, t, 16, seed=0, dtype=torch.float32)
        d_out = torch.randn(1, 1, t, 16)

        def run():
            with torch.enable_grad():
                return torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)

        return peak_tensor_bytes(run)

    def tiled32(q, k, v):
        return tiled_attention(q, k, v, block_q=32, block_k=32)[0]

    def naive(q, k, v):
        return scaled_dot_product_attention(q, k, v)[0]

    (n1, t1), (n2, t2) = [
        (forward_backward_bytes(naive, t), forward_backward_bytes(tiled32, t))
        for t in (128, 256)
    ]
    assert n2 / n1 > 3.5  # naive stores (T, T) matrices: x4 for twice the length
    # tiled: linear in T. Autograd through the loop (before issue 29) kept every
    # tile for the backward: 2.9 x here, and 436,320 bytes at T = 256 (> n2 / 8)
    assert t2 / t1 < 2.5
    assert t2 < n2 / 8


def test_backward_animation_plays_every_tile_and_rejects_bad_history():
    from transformer_course.viz.animations import flash_backward_animation

    history = [  # a causal 8 x 8 grid of 4 x 4 tiles: 3 of its 4 tiles computed
        (i, j, torch.randn(8, 2), torch.randn(8, 2))
        for j in range(2)
        for i in range(2)
        if j <= i
    ]
    html = flash_backward_animation(history, 4).data
    assert html.count("frames[") >= 3 and "frames[3]" not in html
    assert "Animation in 3 frames" in html and "8 by 8 grid" in html
    with pytest.raises(ValueError, match="history"):
        flash_backward_animation([], 4)
    with pytest.raises(ValueError, match="block"):
        flash_backward_animation(history, 0)
    with pytest.raises(ValueError, match=r"dq \(T, d\)"):
        flash_backward_animation([(0, 0, torch.randn(8), torch.randn(8, 2))], 4)
