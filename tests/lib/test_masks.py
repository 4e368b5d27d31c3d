"""Masks (chapter 5): hypothesis property tests for shapes, broadcasting and polarity of
masks.py, the mask pitfalls P1-P7 on every attention backend, and the chapter's
property checks in transformer_course.exercises (each passes the library and rejects a
broken function)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_course.attention import (
    ATTENTION_BACKENDS,
    scaled_dot_product_attention,
)
from transformer_course.masks import (
    causal_mask,
    combine_masks,
    from_key_padding_mask,
    padding_mask,
    sliding_window_mask,
)

param = pytest.mark.parametrize


BACKENDS = sorted(ATTENTION_BACKENDS)


lengths = st.integers(1, 12)


def _run(backend, q, k, v, mask):
    return ATTENTION_BACKENDS[backend](q, k, v, mask)[0]


@settings(max_examples=40, deadline=None)
@given(t=lengths, s=lengths)
def test_causal_mask_bottom_right(t, s):
    m = causal_mask(t, s)
    assert m.shape == (t, s) and m.dtype == torch.bool
    assert torch.equal(m, torch.ones(t, s, dtype=torch.bool).tril(s - t))
    i, j = torch.meshgrid(torch.arange(t), torch.arange(s), indexing="ij")
    assert torch.equal(m, j <= i + s - t)  # the documented rule, written another way
    if s >= t:
        assert m[-1].all()  # the newest query sees every key


def test_causal_mask_square_equals_pytorch():
    ref = nn.Transformer.generate_square_subsequent_mask(5)  # float, -inf = blocked
    assert torch.equal(causal_mask(5), ref == 0)
    assert not torch.equal(causal_mask(5), ref != 0)  # the opposite polarity (P3)


@settings(max_examples=40, deadline=None)
@given(t=lengths, s=lengths, window=st.integers(1, 14))
def test_sliding_window_within_causal(t, s, window):
    m = sliding_window_mask(t, window, s)
    assert m.shape == (t, s)
    assert not (m & ~causal_mask(t, s)).any()  # never sees the future
    assert (m.sum(-1) <= window).all()
    if window >= s:
        assert torch.equal(m, causal_mask(t, s))


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(0, 8), min_size=1, max_size=5), t=lengths)
def test_padding_mask_lengths_tokens_and_broadcast(lens, t):
    s = max(max(lens), 1)
    lengths_t = torch.tensor(lens)
    m = padding_mask(lengths_t, max_len=s)
    assert m.shape == (len(lens), 1, 1, s) and m.dtype == torch.bool
    assert m.sum(-1).flatten().tolist() == lens
    tokens = torch.where(m[:, 0, 0], torch.randint(1, 9, (len(lens), s)), 0)
    assert torch.equal(padding_mask(tokens, pad_id=0), m)
    both = combine_masks(causal_mask(t, s), m)
    assert both.shape == (len(lens), 1, t, s)
    assert torch.equal(both, causal_mask(t, s) & m)


def test_mask_errors_name_the_argument():
    with pytest.raises(TypeError, match="masks\\[1\\].*bool"):
        combine_masks(causal_mask(3), torch.zeros(3, 3))  # a float additive mask (P4)
    with pytest.raises(ValueError, match="do not broadcast"):
        combine_masks(causal_mask(3), causal_mask(4))
    with pytest.raises(ValueError, match="q_len"):
        causal_mask(0)
    with pytest.raises(TypeError, match="tokens_or_lengths"):
        padding_mask(torch.tensor([[1.0, 0.0]]))


def test_p3_from_key_padding_mask_matches_multihead_attention():
    torch.manual_seed(0)
    d, h = 8, 2
    mha = nn.MultiheadAttention(d, h, batch_first=True, bias=False)
    x = torch.randn(2, 4, d)
    kpm = torch.tensor([[False, False, True, True], [False] * 4])  # True = ignore
    ref, _ = mha(x, x, x, key_padding_mask=kpm)
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)

    def heads(t):
        return t.view(2, 4, h, d // h).transpose(1, 2)  # (B, H, T, d_k)

    def run(mask):
        out, _ = scaled_dot_product_attention(
            heads(x @ w_q.T), heads(x @ w_k.T), heads(x @ w_v.T), mask
        )
        return out.transpose(1, 2).reshape(2, 4, d) @ mha.out_proj.weight.T

    torch.testing.assert_close(run(from_key_padding_mask(kpm)), ref)
    assert not torch.allclose(run(kpm[:, None, None, :]), ref, atol=1e-3)  # unconverted


@param("backend", BACKENDS)
@param("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_p1_fully_masked_item_is_zero_and_grads_finite(backend, dtype, qkv):
    q, k, v = qkv(2, 1, 3, d=4, dtype=dtype, requires_grad=True)
    mask = torch.ones(2, 1, 1, 3, dtype=torch.bool)
    mask[1] = False
    out = _run(backend, q, k, v, mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    out[0].float().sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    alone = _run(backend, q[:1].detach(), k[:1].detach(), v[:1].detach(), mask[:1])
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[0].detach(), alone[0], atol=tol, rtol=tol)


@param("backend", BACKENDS)
def test_p2_one_head_fully_masked(backend, qkv):
    q, k, v = qkv(1, 3, 5, d=4)
    mask = torch.ones(1, 3, 5, 5, dtype=torch.bool)
    mask[:, 2] = False  # head 2 may see nothing
    out = _run(backend, q, k, v, mask)
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))
    torch.testing.assert_close(out[:, :2], _run("naive", q, k, v, mask)[:, :2])
    _, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(w[:, 2], torch.zeros_like(w[:, 2]))


@param("backend", BACKENDS)
def test_p4_float_additive_mask_rejected(backend):
    q = k = v = torch.randn(1, 1, 3, 4)
    additive = torch.tensor([[0.0, 0.0, -math.inf]])
    with pytest.raises(TypeError, match="bool"):
        ATTENTION_BACKENDS[backend](q, k, v, additive)
    both = combine_masks(causal_mask(3), additive == 0)  # the documented conversion
    _, w = scaled_dot_product_attention(q, k, v, both)
    assert torch.equal(w[..., 2], torch.zeros(1, 1, 3))


@param("backend", BACKENDS)
def test_p5_padding_hides_keys_not_queries(backend):
    ids = torch.tensor([[5, 7, 0, 0]])
    mask = combine_masks(causal_mask(4), padding_mask(ids, pad_id=0))
    assert mask.shape == (1, 1, 4, 4)
    q = k = torch.randn(1, 1, 4, 4)
    v = torch.eye(4)[None, None]  # output row = that query's weights
    w = _run(backend, q, k, v, mask)
    assert torch.isfinite(w).all()
    assert torch.equal(w[..., 2:], torch.zeros(1, 1, 4, 2))
    wrong = padding_mask(ids, pad_id=0).transpose(-1, -2)  # (B, 1, T, 1): the bug
    w_wrong = _run(backend, q, k, v, wrong)  # an encoder, no causal mask
    assert w_wrong[0, 0, 0, 2] > 0  # real query 0 attends to padded key 2
    assert torch.equal(
        _run(backend, q, k, v, padding_mask(ids))[..., 2:], torch.zeros(1, 1, 4, 2)
    )


@param("backend", BACKENDS)
def test_p6_zero_valid_length_gives_zero_weights(backend):
    scores_q = torch.randn(1, 1, 1, 4)
    v = torch.eye(4)[None, None]
    mask = padding_mask(torch.tensor([0]), max_len=4)  # valid length 0
    out = _run(backend, scores_q, torch.randn(1, 1, 4, 4), v, mask)
    assert torch.equal(out, torch.zeros(1, 1, 1, 4))  # not 0.25 each
    uniform = torch.softmax(torch.full((4,), torch.finfo(torch.float32).min), -1)
    assert torch.allclose(
        uniform, torch.full((4,), 0.25)
    )  # the large-negative-fill bug


@param("backend", BACKENDS)
@param("dtype", [torch.float16, torch.bfloat16])
def test_p7_combined_masks_never_overflow(backend, dtype, qkv):
    q, k, v = qkv(1, 1, 2, d=8, dtype=dtype)
    pad = torch.tensor([[False, True]])[:, None, None, :]  # left padded: [pad, t1]
    mask = combine_masks(causal_mask(2), pad)
    out = _run(backend, q, k, v, mask)
    assert torch.isfinite(out).all()
    alone = _run(backend, q[..., 1:, :], k[..., 1:, :], v[..., 1:, :], None)
    torch.testing.assert_close(out[..., 1:, :], alone, atol=1e-2, rtol=1e-2)
    fmin = torch.finfo(dtype).min  # the bug: adding two finfo.min masks
    added = torch.tensor(fmin, dtype=dtype) + torch.tensor(fmin, dtype=dtype)
    assert torch.isinf(added)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    t=lengths,
    s=lengths,
    seed=st.integers(0, 999),
    shape=st.sampled_from(["ts", "b11s", "bhts"]),
)
def test_random_masks_every_backend_agrees(b, h, t, s, seed, shape):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, 8, generator=gen)
    k, v = (
        torch.randn(b, h, s, 8, generator=gen),
        torch.randn(b, h, s, 5, generator=gen),
    )
    size = {"ts": (t, s), "b11s": (b, 1, 1, s), "bhts": (b, h, t, s)}[shape]
    mask = torch.rand(size, generator=gen) < 0.6
    ref, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(w == 0, (w == 0) | ~mask.expand_as(w))  # masked keys weigh 0
    empty = ~mask.expand(b, h, t, s).any(-1)
    assert torch.equal(ref[empty], torch.zeros_like(ref[empty]))
    for name in BACKENDS:
        torch.testing.assert_close(_run(name, q, k, v, mask), ref, atol=1e-5, rtol=1e-5)
