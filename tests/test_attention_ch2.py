"""Chapter 2 points: scaling, stable softmax, masks, dropout, the library against
PyTorch's SDPA, pitfalls P11 and P12, and the chapter's exercise checks."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_course.attention import (
    ATTENTION_BACKENDS,
    masked_softmax,
    scaled_dot_product_attention,
)
from transformer_course.exercises import (
    CheckError,
    check_masked_attention,
    check_stable_softmax,
)

param = pytest.mark.parametrize


# ------------------------------------------------------------------------------ the idea


def test_dot_product_variance_grows_like_d_k():
    for d_k in (4, 64, 256):
        q, k = torch.randn(20000, d_k), torch.randn(20000, d_k)
        var = (q * k).sum(-1).var().item()
        assert abs(var / d_k - 1) < 0.1
        assert abs((q * k).sum(-1).div(math.sqrt(d_k)).var().item() - 1) < 0.1


def test_unscaled_softmax_saturates_and_its_gradient_vanishes():
    d_k = 512
    q, k = torch.randn(256, d_k), torch.randn(256, 16, d_k)
    raw = (k @ q[:, :, None]).squeeze(-1)  # (N, S)

    def grad_norm(scores):
        s = scores.clone().requires_grad_(True)
        w = torch.softmax(s, -1)
        (w * torch.randn_like(w)).sum().backward()
        return s.grad.norm(dim=-1).mean().item()

    assert grad_norm(raw) < 0.3 * grad_norm(raw / math.sqrt(d_k))

    def entropy(scores):
        w = torch.softmax(scores, -1)
        return -(w * w.clamp_min(1e-12).log()).sum(-1).mean().item()

    assert entropy(raw) < 0.5 * entropy(raw / math.sqrt(d_k))


def test_stable_softmax_handles_large_scores_and_naive_does_not():
    s = torch.tensor([[1000.0, 1001.0, 999.0]])
    naive = torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)
    assert torch.isnan(naive).all()  # the known-wrong version
    assert torch.allclose(masked_softmax(s), torch.softmax(s, -1))


def test_fully_masked_row_is_zero_not_nan_or_uniform():
    scores = torch.randn(1, 1, 4)
    mask = torch.zeros(1, 1, 4, dtype=torch.bool)
    assert torch.equal(masked_softmax(scores, mask), torch.zeros(1, 1, 4))  # P1, P6
    wrong = torch.softmax(scores.masked_fill(~mask, -1e9), -1)  # P6's bug
    assert torch.allclose(wrong, torch.full((1, 1, 4), 0.25))
    assert torch.isnan(
        torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    ).all()


def test_dropout_on_weights_only_in_training():
    q, k, v = torch.randn(3, 2, 5, 8).unbind(0)
    a, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    c, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert not torch.allclose(a, b)
    assert torch.allclose(c, scaled_dot_product_attention(q, k, v)[0])
    # expected value is preserved: survivors are scaled by 1 / (1 - p)
    runs = torch.stack(
        [scaled_dot_product_attention(q, k, v, dropout_p=0.5)[0] for _ in range(2000)]
    )
    assert torch.allclose(runs.mean(0), c, atol=0.1)


@param("backend", ["naive", "sdpa"])
@param("with_mask", [False, True])
def test_library_equals_pytorch_sdpa(backend, with_mask):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    mask = torch.rand(2, 1, 5, 7) > 0.3 if with_mask else None
    if mask is not None:
        mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out, _ = ATTENTION_BACKENDS[backend](q, k, v, mask)
    assert torch.allclose(out, ref, atol=1e-5)
    wrong_scale, _ = ATTENTION_BACKENDS[backend](q, k, v, mask, scale=1.0)
    assert not torch.allclose(wrong_scale, ref, atol=1e-3)


# ----------------------------------------------------------------------------- pitfalls


def test_p11_softmax_over_keys_not_batch():
    q, k = torch.randn(1, 1, 3), torch.randn(1, 2, 3)
    v = torch.randn(1, 2, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(3)  # (1, 1, 2)
    wrong = torch.softmax(scores, dim=0)  # over the batch of size 1
    assert torch.equal(wrong, torch.ones(1, 1, 2))  # every weight is 1
    _, w = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(w.sum(-1), torch.ones(1, 1))
    qb, kb, vb = torch.randn(4, 3, 8), torch.randn(4, 5, 8), torch.randn(4, 5, 2)
    perm = torch.tensor([2, 0, 3, 1])
    out_b, _ = scaled_dot_product_attention(qb, kb, vb)
    out_p, _ = scaled_dot_product_attention(qb[perm], kb[perm], vb[perm])
    assert torch.allclose(out_p, out_b[perm], atol=1e-6)


def test_p12_missing_scale():
    q = torch.ones(1, 4)
    k = torch.stack([torch.ones(4), torch.zeros(4)])
    v = torch.tensor([[1.0], [0.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(w, torch.tensor([[0.881, 0.119]]), atol=1e-3)
    assert abs(out.item() - 0.881) < 1e-3
    wrong = torch.softmax(q @ k.T, -1) @ v
    assert abs(wrong.item() - 0.982) < 1e-3


# ------------------------------------------------------------------------------ checks


def stable_softmax(scores, mask=None, dim=-1):
    """A right answer written out: the checks refuse a call into the library."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = (scores - top).exp()
    total = e.sum(dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def attention_ok(q, k, v, mask=None):
    weights = stable_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
    return weights @ v, weights


def stub(*args):
    raise NotImplementedError("your code here")


def test_checks_accept_right_answers(capsys):
    assert check_stable_softmax(stable_softmax) is True
    assert check_masked_attention(attention_ok) is True
    assert capsys.readouterr().out.count("passed") == 2


def test_checks_say_not_attempted(capsys):
    assert check_stable_softmax(stub) is False
    assert check_masked_attention(stub) is False
    assert capsys.readouterr().out.count("not attempted yet") == 2


def _softmax_naive(scores, mask=None, dim=-1):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(scores)
    return e / e.sum(dim, keepdim=True)


def _softmax_shifted_nan(scores, mask=None, dim=-1):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim)


def _softmax_big_negative(scores, mask=None, dim=-1):
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    return torch.softmax(scores, dim)


def _softmax_dim0(scores, mask=None, dim=-1):
    return torch.softmax(scores, 0)


@param(
    "fn, words",
    [
        (_softmax_naive, "overflowed"),
        (_softmax_shifted_nan, "NaN"),
        (_softmax_big_negative, "P6"),
        (_softmax_dim0, "last axis"),
    ],
)
def test_stable_softmax_check_rejects(fn, words):
    with pytest.raises(CheckError, match=words):
        check_stable_softmax.strict(fn)


def _att(scale=True, dim=-1, invert=False, guard=True):
    def fn(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        if scale:
            s = s / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(mask if invert else ~mask, float("-inf"))
        w = torch.softmax(s, dim=dim)
        if guard:
            w = torch.nan_to_num(w)
        return w @ v, w

    return fn


@param(
    "fn, words",
    [
        (_att(scale=False), "P12"),
        (_att(dim=0), "P11"),
        (_att(dim=1), "P11"),
        (_att(invert=True), "inverted"),
        (_att(guard=False), "P1"),
    ],
)
def test_masked_attention_check_rejects(fn, words):
    with pytest.raises(CheckError, match=words):
        check_masked_attention.strict(fn)


# ------------------------------------------------- the chapter's find-the-bug exercise


def test_chapter_2_find_the_bug_code_is_rejected():
    def attention_buggy(q, k, v, mask=None):  # as printed in the exercise
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.softmax(scores, dim=0)
        return weights @ v, weights

    with pytest.raises(CheckError, match="P11"):
        check_masked_attention.strict(attention_buggy)
