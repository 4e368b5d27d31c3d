"""scaled_dot_product_attention and the backend registry against PyTorch, and the mask
pitfalls of ../shared/cases/PITFALLS.md (P1, P3, P5, P6) on the attention functions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_course import (
    ATTENTION_BACKENDS,
    causal_mask,
    from_key_padding_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer_course.additive import additive_attention
from transformer_course.attention import masked_softmax

param = pytest.mark.parametrize
B, H, T, S, D = 2, 3, 5, 7, 8


def _qkv(dtype=torch.float32, b=B, h=H, t=T, s=S, d=D):
    return (
        torch.randn(b, h, t, d, dtype=dtype),
        torch.randn(b, h, s, d, dtype=dtype),
        torch.randn(b, h, s, d, dtype=dtype),
    )


def _random_mask(shape):
    mask = torch.rand(shape) > 0.4
    mask[..., 0] = (
        True  # every query sees a key, so PyTorch gives no NaN to compare with
    )
    return mask


@param("mask_shape", [None, (T, S), (B, 1, 1, S), (B, H, T, S), (1, H, T, 1)])
def test_equals_pytorch_sdpa(mask_shape):
    q, k, v = _qkv()
    mask = None if mask_shape is None else _random_mask(mask_shape)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T), atol=1e-6, rtol=0)


def test_parity_check_can_fail():
    # the known-wrong input: a mask with the opposite polarity is not "close"
    q, k, v = _qkv()
    mask = _random_mask((T, S))
    mask[:, -1] = False
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    wrong = F.scaled_dot_product_attention(
        q, k, v, attn_mask=~mask | ~mask.any(-1, True)
    )
    assert not torch.allclose(out, wrong, atol=1e-3)


@param("backend", sorted(ATTENTION_BACKENDS))
def test_backends_agree_with_naive(backend):
    q, k, v = _qkv()
    mask = _random_mask((B, 1, T, S))
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    out, _ = ATTENTION_BACKENDS[backend](q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_scale_argument():
    q, k, v = _qkv()
    out, _ = scaled_dot_product_attention(q, k, v, scale=0.5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.5))


# ------------------------------------------------------------------------- P1


@param("dtype", [torch.float32, torch.float16, torch.bfloat16])
@param("backend", sorted(ATTENTION_BACKENDS))
def test_p1_fully_masked_item_gives_zeros_and_clean_gradients(backend, dtype):
    fn = ATTENTION_BACKENDS[backend]
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, dtype=dtype, requires_grad=True) for _ in range(3))
    keep = torch.tensor(
        [[True, True, True], [False, False, False]]
    )  # item 1: all padding
    mask = keep[:, None, :]  # (B, 1, S)
    out, weights = fn(q, k, v, mask)
    out[0].sum().backward()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    if weights is not None:
        assert torch.equal(weights[1], torch.zeros_like(weights[1]))
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    # item 0 equals running item 0 alone
    q0, k0, v0 = (x.detach()[:1].clone().requires_grad_() for x in (q, k, v))
    out0, _ = fn(q0, k0, v0, None)
    out0.sum().backward()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[0], out0[0], atol=tol, rtol=tol)
    for x, x0 in ((q, q0), (k, k0), (v, v0)):
        torch.testing.assert_close(x.grad[0], x0.grad[0], atol=tol, rtol=tol)


def test_p1_plain_softmax_would_give_nan():
    # the known-wrong implementation this library avoids
    scores = torch.zeros(1, 3).masked_fill(
        torch.ones(1, 3, dtype=torch.bool), float("-inf")
    )
    assert torch.isnan(torch.softmax(scores, -1)).all()
    assert torch.equal(
        masked_softmax(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool)),
        torch.zeros(1, 3),
    )


# ------------------------------------------------------------------------- P3


def test_p3_causal_row_0_sees_only_itself_and_inverted_mask_differs():
    v = torch.eye(3)[None]  # (1, 3, 3)
    q = k = torch.randn(1, 3, 3)
    future = torch.triu(torch.ones(3, 3, dtype=torch.bool), diagonal=1)  # True = future
    mask = ~future  # this library: True = may attend
    assert torch.equal(mask, causal_mask(3))
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[0, 0], v[0, 0])
    inverted, _ = scaled_dot_product_attention(q, k, v, future)  # PyTorch-MHA polarity
    assert not torch.allclose(inverted[0, 0], v[0, 0])


def test_p3_converter_from_pytorch_key_padding_mask():
    kpm = torch.tensor([[False, False, True]])  # PyTorch: True = ignore
    mask = from_key_padding_mask(kpm)
    assert mask.shape == (1, 1, 1, 3)
    assert mask.tolist() == [[[[True, True, False]]]]
    q, k, v = _qkv(b=1, h=2, t=3, s=3)
    ours, _ = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~kpm[:, None, None, :])
    torch.testing.assert_close(ours, ref)


# ------------------------------------------------------------------------- P5


def test_p5_padding_masks_keys_not_queries():
    ids = torch.tensor([[5, 7, 0, 0]])
    mask = padding_mask(ids, pad_id=0) & causal_mask(4)  # (1, 1, 4, 4)
    q, k, v = _qkv(b=1, h=1, t=4, s=4)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(w[..., 2:], torch.zeros_like(w[..., 2:]))
    assert torch.isfinite(out).all()
    # the wrong shape (B, 1, T, 1) hides query rows instead: without the causal part,
    # real queries then attend to the padded keys
    wrong = (ids != 0)[:, None, :, None]  # (B, 1, T, 1)
    _, w_wrong = scaled_dot_product_attention(q, k, v, wrong)
    assert (w_wrong[0, 0, :2, 2:] > 0).all()
    _, w_right = scaled_dot_product_attention(q, k, v, padding_mask(ids, pad_id=0))
    assert torch.equal(w_right[..., 2:], torch.zeros_like(w_right[..., 2:]))


# ------------------------------------------------------------------------- P6


def test_p6_zero_valid_keys_gives_zeros_not_uniform():
    scores = torch.randn(1, 1, 4)
    mask = padding_mask(torch.tensor([0]), max_len=4)[0]  # valid length 0: (1, 1, 4)
    assert torch.equal(masked_softmax(scores, mask), torch.zeros(1, 1, 4))
    # the d2l-style fill with a large finite number gives the wrong, uniform answer
    wrong = torch.softmax(scores.masked_fill(~mask, -1e6), dim=-1)
    torch.testing.assert_close(wrong, torch.full((1, 1, 4), 0.25))


# ------------------------------------------------------------------ bad input


@param(
    "args, error, words",
    [
        (
            (torch.randn(2, 3, 4), torch.randn(2, 5, 6), torch.randn(2, 5, 6)),
            ValueError,
            ["k", "d_k = 4", "(2, 5, 6)"],
        ),
        (
            (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4)),
            ValueError,
            ["v", "S = 5", "(2, 6, 4)"],
        ),
        (
            (
                torch.randn(3, 4),
                torch.randn(5, 4),
                torch.randn(5, 4),
                torch.ones(4, 5, dtype=torch.bool),
            ),
            ValueError,
            ["mask", "(3, 5)", "(4, 5)"],
        ),
        (
            (
                torch.randn(3, 4),
                torch.randn(5, 4),
                torch.randn(5, 4),
                torch.zeros(3, 5),
            ),
            TypeError,
            ["mask", "float32", "bool"],
        ),
        (
            (torch.randn(4), torch.randn(5, 4), torch.randn(5, 4)),
            ValueError,
            ["q", "(4,)"],
        ),
        (
            (torch.ones(3, 4, dtype=torch.long), torch.randn(5, 4), torch.randn(5, 4)),
            TypeError,
            ["q", "int64"],
        ),
    ],
)
@param("backend", sorted(ATTENTION_BACKENDS))
def test_bad_input_names_argument_and_shapes(args, error, words, backend):
    with pytest.raises(error) as info:
        ATTENTION_BACKENDS[backend](*args)
    for word in words:
        assert word in str(info.value)


def test_mask_that_would_grow_the_output_is_rejected():
    q, k, v = _qkv(b=1)
    with pytest.raises(ValueError, match="mask"):
        scaled_dot_product_attention(q, k, v, torch.ones(4, 1, T, S, dtype=torch.bool))


# ------------------------------------------------------------------ additive


def test_additive_attention_equals_explicit_loop():
    q, k, v = torch.randn(3, 5), torch.randn(4, 6), torch.randn(4, 2)
    w_q, w_k, w = torch.randn(7, 5), torch.randn(7, 6), torch.randn(7)
    out, weights = additive_attention(q, k, v, w_q, w_k, w)
    scores = torch.tensor(
        [
            [float(w @ torch.tanh(w_q @ q[i] + w_k @ k[j])) for j in range(4)]
            for i in range(3)
        ]
    )
    ref_w = torch.softmax(scores, -1)
    torch.testing.assert_close(weights, ref_w)
    torch.testing.assert_close(out, ref_w @ v)
    with pytest.raises(ValueError, match="w_k"):
        additive_attention(q, k, v, w_q, torch.randn(7, 5), w)


def test_gradcheck_double():
    q, k, v = (
        torch.randn(1, 3, 4, dtype=torch.double, requires_grad=True) for _ in range(3)
    )
    mask = torch.tensor(
        [[True, False, True], [True, True, False], [False, False, False]]
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v)
    )


def test_dropout_zeroes_and_rescales_only_when_asked():
    q, k, v = _qkv()
    a, _ = scaled_dot_product_attention(q, k, v)
    b, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(a, b)
    torch.manual_seed(3)
    c, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.allclose(a, c)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))  # weights before dropout
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)


def test_scale_default_is_inverse_sqrt_d_k():
    q, k, v = _qkv()
    a, _ = scaled_dot_product_attention(q, k, v)
    b, _ = scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(D))
    c, _ = scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.equal(a, b) and not torch.allclose(a, c)
