"""flash: tiled attention and the online softmax against the naive reference and
PyTorch's SDPA, forward and backward (the autograd Function that recomputes the
tiles), with masks, fully masked rows and T not a multiple of the tile (P1, P17)."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course.attention import (
    ATTENTION_BACKENDS,
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from transformer_course.flash import (
    TiledAttention,
    Tiles,
    online_softmax,
    tiled_attention,
    tiled_backward,
)
from transformer_course.local import sliding_window_attention
from transformer_course.masks import causal_mask, padding_mask
from transformer_course.measure import peak_tensor_bytes

param = pytest.mark.parametrize


def naive(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)[0]


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


# T = 75 and S = 53 are multiples of none of these blocks (pitfall P17)
BLOCKS = [(16, 16), (32, 24), (None, 16), (None, 64), (7, None), (200, 200)]


def tiled(q, k, v, mask=None, *, block_q, block_k, **kw):
    block_k = k.shape[-2] if block_k is None else block_k
    return tiled_attention(q, k, v, mask, block_q=block_q, block_k=block_k, **kw)[0]


def err(a, b):
    return (a - b).abs().max().item()


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


def sdpa_grads(q, k, v, d_out, mask=None, causal=False):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return torch.autograd.grad(out, (q, k, v), d_out)


@param("block_q, block_k", [(64, 64), (32, 48), (11, 7), (200, 200)])
def test_tiled_equals_naive_float32_p17(block_q, block_k, qkv):
    q, k, v = qkv(2, 2, 130, d=64)  # T = 130 is not a multiple of any block
    out, weights = tiled_attention(q, k, v, block_q=block_q, block_k=block_k)
    assert weights is None
    assert max_err(out, naive(q, k, v)) < 1e-5
    wrong, _ = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, scale=1.0)
    assert max_err(wrong, naive(q, k, v)) > 1e-2  # the check can fail


@param("t, s", [(70, 70), (5, 67), (67, 5)])
def test_tiled_masks_equal_naive(t, s, qkv):
    q, k, v = qkv(2, 2, t, s, 64)
    lengths = torch.tensor([s, max(1, s // 3)])
    pad = padding_mask(lengths, max_len=s)  # (B, 1, 1, S)
    causal = causal_mask(t, s)  # (T, S)
    per_head = torch.rand(2, 2, t, s) > 0.3  # (B, H, T, S)
    for mask in (pad, causal, pad & causal, per_head):
        out, _ = tiled_attention(q, k, v, mask, block_q=16, block_k=24)
        assert max_err(out, naive(q, k, v, mask)) < 1e-5
    flag, _ = tiled_attention(q, k, v, pad, causal=True, block_q=16, block_k=24)
    assert max_err(flag, naive(q, k, v, pad & causal)) < 1e-5
    unmasked, _ = tiled_attention(q, k, v, block_q=16, block_k=24)
    assert max_err(unmasked, naive(q, k, v, pad & causal)) > 1e-2


def test_tiled_float16_error_bounded_p17(qkv):
    q, k, v = qkv(2, 2, 130, d=64, dtype=torch.float16)
    ref = naive(q.float(), k.float(), v.float())
    naive_err = max_err(naive(q, k, v), ref)
    out, _ = tiled_attention(q, k, v, causal=False, block_q=32, block_k=48)
    assert out.dtype == torch.float16
    assert max_err(out, ref) <= 2 * naive_err + 1e-3
    # float32 tolerances are the wrong yardstick for float16 (flash-attention #410)
    assert max_err(out, ref) > 1e-5


def test_tiled_fully_masked_rows_are_zero_p1(qkv):
    q, k, v = qkv(2, 2, 3, 3, 4)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        qd, kd, vd = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
        mask = torch.tensor([True, True, False])[None, None, None, :].repeat(2, 1, 1, 1)
        mask[1] = False  # item 1: every key is padding
        out, _ = tiled_attention(qd, kd, vd, mask, block_q=2, block_k=2)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        out[0].sum().backward()
        for x in (qd, kd, vd):
            assert torch.isfinite(x.grad).all()
        ref = naive(q[:1], k[:1], v[:1], mask[:1])
        assert max_err(out[0], ref[0]) < (1e-5 if dtype == torch.float32 else 2e-2)


def test_tiled_first_tile_masked_with_very_negative_scores():
    q = torch.ones(1, 1, 3, 4)
    k = -100.0 * torch.ones(1, 1, 9, 4)  # every score: -400 / sqrt(4) = -200
    v = torch.randn(1, 1, 9, 2)
    mask = torch.arange(9)[None, :] >= 4  # the first tile (keys 0..3) is hidden
    out, _ = tiled_attention(q, k, v, mask, block_q=3, block_k=4)
    ref = naive(q, k, v, mask)
    assert max_err(out, ref) < 1e-6 and ref.abs().max() > 0.1


def test_tiled_gradients_equal_naive(qkv):
    q, k, v = qkv(1, 2, 37, d=16, requires_grad=True)
    mask = causal_mask(37)
    grads = []
    for fn in (tiled_attention, scaled_dot_product_attention):
        out, _ = fn(q, k, v, mask)
        grads.append(torch.autograd.grad((out * out).sum(), (q, k, v)))
    for g_tiled, g_naive in zip(*grads):
        assert max_err(g_tiled, g_naive) < 1e-4


def test_tiled_is_registered_and_used_by_multihead():
    assert ATTENTION_BACKENDS["tiled"] is tiled_attention
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 9, 32)
    ref, _ = mha(x, x, x, causal_mask(9))
    mha.backend = "tiled"
    out, weights = mha(x, x, x, causal_mask(9))
    assert weights is None
    assert max_err(out, ref) < 1e-5


def test_online_softmax_matches_softmax():
    x = torch.randn(11) * 5
    for block in (1, 3, 11, 20):
        w, m, l = online_softmax(x, block)
        assert max_err(w, torch.softmax(x, 0)) < 1e-6
        assert m == x.max() and torch.isclose(l, torch.exp(x - x.max()).sum())
    masked = torch.tensor([float("-inf"), 1.0, float("-inf"), 3.0])
    w, _, _ = online_softmax(masked, 1)
    assert max_err(w, torch.softmax(masked, 0)) < 1e-6
    empty, _, _ = online_softmax(torch.full((4,), float("-inf")), 2)
    assert torch.equal(empty, torch.zeros(4))


def test_bad_input_gives_clear_errors(qkv):
    q, k, v = qkv(2, 2, 8, d=16)
    with pytest.raises(ValueError, match="block_q: expected an int >= 1, got 0"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="block_k"):
        tiled_attention(q, k, v, block_k=-3)
    with pytest.raises(TypeError, match="block_k"):
        tiled_attention(q, k, v, block_k=2.5)
    with pytest.raises(ValueError, match=r"d_k = 16.*\(2, 2, 8, 16\).*\(2, 2, 8, 12\)"):
        tiled_attention(q, k[..., :12], v)
    with pytest.raises(TypeError, match="bool mask"):
        tiled_attention(q, k, v, torch.zeros(8, 8))
    with pytest.raises(ValueError, match="mask"):
        tiled_attention(q, k, v, torch.ones(3, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout_p"):
        tiled_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(q, k, v, 0)
    with pytest.raises(ValueError, match=r"S >= T"):
        sliding_window_attention(q, k[..., :4, :], v[..., :4, :], 3)
    with pytest.raises(ValueError, match="n_kv_heads: expected a divisor of n_heads"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="scores"):
        online_softmax(torch.zeros(2, 3))


def test_state_dict_bytes_counts_the_saved_weights():
    from transformer_course.measure import state_dict_bytes

    small, large = torch.nn.Linear(4, 4), torch.nn.Linear(64, 64)
    assert state_dict_bytes(small) > 4 * 20  # the floats plus the file's framing
    assert state_dict_bytes(large) - state_dict_bytes(small) >= 4 * (4160 - 20)


def test_record_forward_sees_every_generate_step(tiny_config):
    from transformer_course.decoding import generate
    from transformer_course.measure import record_forward
    from transformer_course.model import DecoderOnlyLM

    lm = DecoderOnlyLM(tiny_config()).double().eval()
    prompt = torch.tensor([[4, 5, 6]])
    with record_forward(lm) as cached:
        ids = generate(lm, prompt, 5)
    with record_forward(lm) as plain:
        assert torch.equal(generate(lm, prompt, 5, use_cache=False), ids)
    assert len(cached) == len(plain) == 5 and not lm._forward_hooks  # hook removed
    logits = torch.stack([out for _, out in cached], dim=1)  # (1, 5, V)
    assert torch.equal(logits.argmax(-1), ids[:, 3:])  # each step's logits, in order
    torch.testing.assert_close(logits, torch.stack([o for _, o in plain], dim=1))
    times = [t for t, _ in cached]
    assert times == sorted(times)  # seconds since the block began


@param("block_q, block_k", BLOCKS)
def test_equals_torch_sdpa(block_q, block_k, qkv):
    q, k, v = qkv(2, 3, 75, 53, 16, seed=75_053)
    out = tiled(q, k, v, block_q=block_q, block_k=block_k)
    assert err(out, F.scaled_dot_product_attention(q, k, v)) < 1e-5
    # known-wrong: keys in the wrong order pair scores with the wrong values
    wrong = tiled(q, k.flip(-2), v, block_q=block_q, block_k=block_k)
    assert err(wrong, F.scaled_dot_product_attention(q, k, v)) > 1e-2


@param("block_q, block_k", BLOCKS)
def test_masks_and_causal_equal_torch_sdpa(block_q, block_k, qkv):
    q, k, v = qkv(2, 3, 75, 75, 16, seed=75_075)
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


def test_causal_with_fewer_queries_than_keys_is_bottom_right(qkv):
    # the 20 queries are the last 20 positions
    q, k, v = qkv(2, 3, 20, 53, 16, seed=20_053)
    mask = causal_mask(20, 53)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for block_q, block_k in BLOCKS:
        out = tiled(q, k, v, causal=True, block_q=block_q, block_k=block_k)
        assert err(out, ref) < 1e-5


def test_bias_equals_torch_float_mask(qkv):
    q, k, v = qkv(2, 3, 75, 53, 16, seed=75_053)
    bias = torch.randn(3, 75, 53)  # (H, T, S), broadcast over the batch
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    for block_q, block_k in BLOCKS:
        out = tiled(q, k, v, bias=bias, block_q=block_q, block_k=block_k)
        assert err(out, ref) < 1e-5
    assert err(tiled(q, k, v, block_q=None, block_k=16), ref) > 1e-2


@param("block_q, block_k", BLOCKS)
def test_gradients_equal_torch_sdpa(block_q, block_k, qkv):
    q, k, v = qkv(2, 3, 75, 53, 16, requires_grad=True, seed=75_053)
    mask = torch.ones(75, 53, dtype=torch.bool).tril(diagonal=10)  # (T, S)
    mask[:, 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = tiled(q, k, v, mask, block_q=block_q, block_k=block_k)
    g_ref = torch.autograd.grad((ref * ref).sum(), (q, k, v))
    g_out = torch.autograd.grad((out * out).sum(), (q, k, v))
    for a, b in zip(g_out, g_ref):
        assert err(a, b) < 1e-4
    # the inputs are not modified by the in-place steps inside
    q2, k2, v2 = qkv(2, 3, 75, 53, 16, seed=75_053)
    assert torch.equal(v.detach(), v2)
    assert torch.equal(q.detach(), q2) and torch.equal(k.detach(), k2)


def test_all_rows_at_once_is_one_query_block(qkv):
    q, k, v = qkv(2, 3, 75, 53, 16, seed=75_053)
    assert torch.equal(
        tiled(q, k, v, block_q=None, block_k=16),
        tiled(q, k, v, block_q=75, block_k=16),
    )


def test_bad_blocks_rejected(qkv):
    q, k, v = qkv(2, 3, 75, 53, 16, seed=75_053)
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(TypeError, match="block_k"):
        tiled_attention(q, k, v, block_k=None)
    with pytest.raises(TypeError, match="block_q"):
        tiled_attention(q, k, v, block_q=16.0)
    with pytest.raises(ValueError, match="mask"):
        tiled_attention(q, k, v, torch.ones(75, 52, dtype=torch.bool))


@param("b, h, t, s, d, block_q, block_k", GRADCHECK_SHAPES)
@param("masking", ["none", "causal", "padding", "padding+causal", "empty row"])
def test_gradcheck_float64(b, h, t, s, d, block_q, block_k, masking, qkv):
    q, k, v = qkv(
        b, h, t, s, d, dtype=torch.float64, requires_grad=True, seed=t * 100 + s
    )
    mask = key_padding(b, s, seed=t) if "padding" in masking else None
    if masking == "empty row":
        mask = torch.ones(t, s, dtype=torch.bool)
        mask[t // 2] = False  # one query row sees no key at all
    causal = "causal" in masking

    def fn(q, k, v):
        return tiled(q, k, v, mask, block_q=block_q, block_k=block_k, causal=causal)

    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_gradcheck_bias_gradient(qkv):
    q, k, v = qkv(2, 2, 7, 6, 4, dtype=torch.float64, requires_grad=True, seed=3)
    bias = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)  # (H, T, S)

    def fn(q, k, v, bias):
        return tiled(q, k, v, block_q=3, block_k=4, bias=bias, causal=True)

    assert torch.autograd.gradcheck(fn, (q, k, v, bias), fast_mode=True)


def test_backward_without_delta_fails_gradcheck(qkv):
    q, k, v = qkv(1, 2, 7, 9, 4, dtype=torch.float64, requires_grad=True, seed=5)
    tiles = Tiles(3, 4, False, 0.5)
    # apply's arguments by position: torch < 2.7 takes no keyword arguments there
    assert torch.autograd.gradcheck(
        lambda q, k, v: TiledAttention.apply(q, k, v, None, None, tiles),
        (q, k, v),
        fast_mode=True,
    )
    assert not torch.autograd.gradcheck(
        lambda q, k, v: NoDeltaAttention.apply(q, k, v, None, None, tiles),
        (q, k, v),
        raise_exception=False,
        fast_mode=True,
    )


@param("block_q, block_k", BLOCKS)
@param("t, s", [(75, 53), (53, 75), (130, 130)])
@param("causal", [False, True])
def test_gradients_equal_sdpa_float32(block_q, block_k, t, s, causal, qkv):
    q, k, v = qkv(2, 3, t, s, 16, requires_grad=True, seed=t + s)
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


def test_fully_masked_rows_get_zero_gradients(qkv):
    q, k, v = qkv(2, 2, 6, 6, 4, requires_grad=True, seed=1)
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


def test_backward_stores_no_t_by_t_matrix(qkv):
    def forward_backward_bytes(fn, t):
        q, k, v = qkv(1, 1, t, t, 16, requires_grad=True, seed=0)
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
