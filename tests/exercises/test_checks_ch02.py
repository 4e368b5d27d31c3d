"""Chapter 2 points: scaling, stable softmax, masks, dropout, the library against
PyTorch's SDPA, pitfalls P11 and P12, and the chapter's exercise checks."""

import math

import pytest
import torch

from transformer_course.exercises import (
    CheckError,
    check_masked_attention,
    check_stable_softmax,
)
from transformer_course.exercises import pitfalls as P

param = pytest.mark.parametrize


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


def _softmax_dim0(scores, mask=None, dim=-1):
    return torch.softmax(scores, 0)


def test_checks_accept_right_answers(capsys):
    assert check_stable_softmax(stable_softmax) is True
    assert check_masked_attention(attention_ok) is True
    assert capsys.readouterr().out.count("passed") == 2


def test_checks_say_not_attempted(capsys):
    assert check_stable_softmax(stub) is False
    assert check_masked_attention(stub) is False
    assert capsys.readouterr().out.count("not attempted yet") == 2


@param(
    "fn, words",
    [
        (P.softmax_no_max_shift, "overflowed"),
        (P.softmax_unguarded, "NaN"),
        (P.softmax_large_negative, "P6"),
        (_softmax_dim0, "last axis"),
    ],
)
def test_stable_softmax_check_rejects(fn, words):
    with pytest.raises(CheckError, match=words):
        check_stable_softmax.strict(fn)


@param(
    "fn, words",
    [
        (P.attention_unscaled, "P12"),
        (P.attention_softmax_over_batch, "P11"),
        (P.attention_softmax_over_queries, "P11"),
        (P.attention_inverted_mask, "inverted"),
        (P.attention_no_guard, "P1"),
    ],
)
def test_masked_attention_check_rejects(fn, words):
    with pytest.raises(CheckError, match=words):
        check_masked_attention.strict(fn)


def test_chapter_2_find_the_bug_code_is_rejected():
    with pytest.raises(CheckError, match="P11"):  # the exercise's code, in pitfalls
        check_masked_attention.strict(P.attention_buggy)


# --------------------------------------------- learner trial 2026-12-03 (issue 39)


def softmax_logsumexp(scores, mask=None, dim=-1):
    """A right answer in logsumexp form: off by 2.5e-5 at scores near 1000 (float32's
    precision there), which the trial saw rejected against a 1e-5 tolerance."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.exp(scores - scores.logsumexp(dim, keepdim=True)).nan_to_num(0.0)


def test_the_logsumexp_softmax_is_accepted(capsys):
    big = torch.randn(2, 3, 5) * 10 + 1000.0
    off = (softmax_logsumexp(big) - torch.softmax(big.double(), -1)).abs().max()
    assert off > 1e-5  # the precision loss is real: the old tolerance rejected it
    assert check_stable_softmax(softmax_logsumexp) is True


def test_one_maximum_for_the_whole_tensor_is_rejected():
    """Finding 1a: accepted in the trial; the check's large scores shifted every row
    by the same 1000."""
    with pytest.raises(CheckError, match="the whole tensor's") as err:
        check_stable_softmax.strict(P.softmax_global_max)
    assert "amax(dim, keepdim=True)" in err.value.hint


def test_a_scale_of_sqrt_d_v_is_named():
    """Finding 5: generic in the trial (the (B, T, H, d) exercise, d_v != d_k)."""
    from transformer_course.exercises import check_attention_bthd

    def bthd_sqrt_dv(q, k, v, key_padding_mask=None):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, None], -math.inf)
        w = torch.softmax(scores, -1).nan_to_num(0.0)
        return (w @ v).transpose(1, 2), w

    with pytest.raises(CheckError, match=r"sqrt\(d_v\)"):
        check_attention_bthd.strict(bthd_sqrt_dv)
