"""Tiled (FlashAttention-style), sliding-window and grouped-query attention against the
naive reference and PyTorch (chapter 7). Pitfalls P1, P17, P18."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course.attention import (
    ATTENTION_BACKENDS,
    MultiHeadAttention,
    repeat_kv,
    scaled_dot_product_attention,
)
from transformer_course.flash import online_softmax, tiled_attention
from transformer_course.local import sliding_window_attention
from transformer_course.masks import causal_mask, padding_mask, sliding_window_mask
from transformer_course.measure import kv_cache_bytes_per_token, peak_tensor_bytes
from transformer_course.quantize import dequantize_int8, quantize_int8

param = pytest.mark.parametrize


def qkv(b=2, h=2, t=130, s=None, d=64, dtype=torch.float32):
    s = t if s is None else s
    return (
        torch.randn(b, h, t, d, dtype=dtype),
        torch.randn(b, h, s, d, dtype=dtype),
        torch.randn(b, h, s, d, dtype=dtype),
    )


def naive(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)[0]


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


# ------------------------------------------------------------------ tiled vs naive


@param("block_q, block_k", [(64, 64), (32, 48), (11, 7), (200, 200)])
def test_tiled_equals_naive_float32_p17(block_q, block_k):
    q, k, v = qkv()  # T = 130 is not a multiple of any block
    out, weights = tiled_attention(q, k, v, block_q=block_q, block_k=block_k)
    assert weights is None
    assert max_err(out, naive(q, k, v)) < 1e-5
    wrong, _ = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, scale=1.0)
    assert max_err(wrong, naive(q, k, v)) > 1e-2  # the check can fail


@param("t, s", [(70, 70), (5, 67), (67, 5)])
def test_tiled_masks_equal_naive(t, s):
    q, k, v = qkv(t=t, s=s)
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


def test_tiled_float16_error_bounded_p17():
    q, k, v = qkv(dtype=torch.float16)
    ref = naive(q.float(), k.float(), v.float())
    naive_err = max_err(naive(q, k, v), ref)
    out, _ = tiled_attention(q, k, v, causal=False, block_q=32, block_k=48)
    assert out.dtype == torch.float16
    assert max_err(out, ref) <= 2 * naive_err + 1e-3
    # float32 tolerances are the wrong yardstick for float16 (flash-attention #410)
    assert max_err(out, ref) > 1e-5


def test_tiled_fully_masked_rows_are_zero_p1():
    q, k, v = qkv(t=3, s=3, d=4)
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


def test_tiled_gradients_equal_naive():
    q, k, v = (x.requires_grad_() for x in qkv(b=1, h=2, t=37, d=16))
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


@param("backend", ["naive", "sdpa", "tiled"])
def test_backends_agree_for_every_length_p18(backend):
    fn = ATTENTION_BACKENDS[backend]
    max_len = 24
    q, k, v = qkv(b=1, h=2, t=max_len, d=8)
    for t in range(1, max_len + 1):
        mask = causal_mask(t)
        args = (q[..., :t, :], k[..., :t, :], v[..., :t, :])
        kwargs = {"block_q": 5, "block_k": 7} if backend == "tiled" else {}
        out, _ = fn(*args, mask, **kwargs)
        assert max_err(out, naive(*args, mask)) < 1e-5, f"T = {t}"


@param("backend", ["naive", "sdpa", "tiled"])
def test_earlier_outputs_ignore_later_tokens_p18(backend):
    fn = ATTENTION_BACKENDS[backend]
    q, k, v = qkv(b=1, h=2, t=16, d=8)
    mask = causal_mask(16)
    out, _ = fn(q, k, v, mask)
    for t in (1, 7, 15):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[..., t:, :] = torch.randn_like(x[..., t:, :])
        out2, _ = fn(q2, k2, v2, mask)
        assert torch.allclose(out2[..., :t, :], out[..., :t, :], atol=1e-6)
        leaky, _ = fn(q2, k2, v2)  # no causal mask: the future leaks in
        assert not torch.allclose(leaky[..., :t, :], out[..., :t, :], atol=1e-3)


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


# ------------------------------------------------------------ sliding window


@param("window, block", [(1, None), (4, None), (5, 3), (16, 7), (40, None)])
def test_sliding_window_equals_masked_attention(window, block):
    q, k, v = qkv(t=33, d=16)
    out, _ = sliding_window_attention(q, k, v, window, block=block)
    assert max_err(out, naive(q, k, v, sliding_window_mask(33, window))) < 1e-5


def test_sliding_window_with_cache_and_padding():
    q, k, v = qkv(t=6, s=20, d=16)  # the last 6 of 20 positions, as with a KV cache
    pad = padding_mask(torch.tensor([20, 17]), max_len=20)
    out, _ = sliding_window_attention(q, k, v, 5, pad, block=4)
    ref = naive(q, k, v, sliding_window_mask(6, 5, 20) & pad)
    assert max_err(out, ref) < 1e-5


@param("window", [33, 34, 100])
def test_sliding_window_at_least_length_is_full_causal(window):
    q, k, v = qkv(t=33, d=16)
    out, _ = sliding_window_attention(q, k, v, window)
    assert max_err(out, naive(q, k, v, causal_mask(33))) < 1e-5
    short, _ = sliding_window_attention(q, k, v, 8)
    assert max_err(short, naive(q, k, v, causal_mask(33))) > 1e-2


# --------------------------------------------------------- grouped-query attention


def test_repeat_kv():
    x = torch.randn(2, 3, 5, 4)
    y = repeat_kv(x, 4)
    assert y.shape == (2, 12, 5, 4)
    assert torch.equal(y, x.repeat_interleave(4, dim=1))
    assert torch.equal(y[:, 7], x[:, 1])
    assert not torch.equal(y, x.repeat(1, 4, 1, 1))  # tiling heads is the wrong order
    assert repeat_kv(x, 1) is x


def test_gqa_with_n_kv_heads_equal_n_heads_is_multihead():
    mha = MultiHeadAttention(32, 4).eval()
    gqa = MultiHeadAttention(32, 4, n_kv_heads=4).eval()
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 7, 32)
    mask = causal_mask(7)
    (out, w), (ref, w_ref) = gqa(x, x, x, mask), mha(x, x, x, mask)
    assert max_err(out, ref) < 1e-6 and max_err(w, w_ref) < 1e-6
    other = MultiHeadAttention(32, 4, n_kv_heads=4).eval()
    assert max_err(other(x, x, x, mask)[0], ref) > 1e-3


@param("n_kv_heads", [1, 2, 4])
@param("backend", ["naive", "sdpa", "tiled"])
def test_gqa_matches_pytorch_enable_gqa(n_kv_heads, backend):
    d_model, n_heads, d_k = 32, 4, 8
    gqa = MultiHeadAttention(
        d_model, n_heads, n_kv_heads=n_kv_heads, backend=backend
    ).eval()
    assert gqa.k_proj.weight.shape == (n_kv_heads * d_k, d_model)
    x = torch.randn(2, 9, d_model)
    out, _ = gqa(x, x, x, causal_mask(9))
    q = gqa.q_proj(x).view(2, 9, n_heads, d_k).transpose(1, 2)  # (B, H, T, d_k)
    k = gqa.k_proj(x).view(2, 9, n_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
    v = gqa.v_proj(x).view(2, 9, n_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = gqa.out_proj(ref.transpose(1, 2).reshape(2, 9, d_model))  # (B, T, D)
    assert max_err(out, ref) < 1e-5


@param("n_kv_heads", [1, 2])
def test_gqa_cache_stores_kv_heads_and_matches_full(n_kv_heads, list_cache):
    gqa = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(1, 6, 32)
    full, _ = gqa(x, x, x, causal_mask(6))
    cache, steps = list_cache(), []
    for t in range(6):
        step = x[:, t : t + 1]
        out, _ = gqa(step, step, step, causal_mask(1, t + 1), cache=cache)
        steps.append(out)
    assert cache.k.shape == (1, n_kv_heads, 6, 8)
    assert max_err(torch.cat(steps, dim=1), full) < 1e-5


def test_kv_cache_bytes_per_token():
    assert kv_cache_bytes_per_token(4, 8, 64, torch.float16) == 2 * 4 * 8 * 64 * 2
    assert kv_cache_bytes_per_token(4, 1, 64) == 2 * 4 * 1 * 64 * 4
    with pytest.raises(ValueError, match="n_kv_heads"):
        kv_cache_bytes_per_token(4, 0, 64)


# ----------------------------------------------------------- int8 and memory


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


def test_peak_tensor_bytes_grows_quadratically_for_naive_only():
    def peaks(t):
        q, k, v = qkv(b=1, h=1, t=t, d=16)
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


# ---------------------------------------------------------------------- bad input


def test_bad_input_gives_clear_errors():
    q, k, v = qkv(t=8, d=16)
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


def test_language_model_with_gqa_layers_cached_equals_uncached(tiny_config):
    from transformer_course.decoding import new_caches
    from transformer_course.model import DecoderOnlyLM

    lm = DecoderOnlyLM(tiny_config(tgt_vocab_size=20)).eval()
    for layer in lm.layers:
        layer.self_attn = MultiHeadAttention(32, 4, n_kv_heads=2)
    ids = torch.randint(4, 20, (2, 10))
    with torch.no_grad():
        full = lm(ids)  # (B, T, V)
        caches = new_caches(lm)
        steps = [lm(ids[:, :4], caches=caches)]
        steps += [lm(ids[:, t : t + 1], caches=caches) for t in range(4, 10)]
    assert caches[0].k.shape == (2, 2, 10, 8)  # the cache holds H_kv = 2 heads
    assert max_err(torch.cat(steps, dim=1), full) < 1e-5


# ---------------------- int8 of a whole model, saved bytes, generation steps (issue 24)


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
