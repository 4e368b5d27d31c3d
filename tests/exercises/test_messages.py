"""Each common mistake gets its own message (issue 18): the known-wrong functions of
``transformer_course.exercises.pitfalls`` are fed to the checks, and each must be
rejected with the message that names that mistake, as two lines (message and hint)
and a return value of False, without a traceback."""

from __future__ import annotations

import pytest
import torch

from transformer_course.attention import masked_softmax, scaled_dot_product_attention
from transformer_course.exercises import (
    CheckError,
    ShapeError,
    check_attention_bthd,
    check_attention_properties,
    check_causal_mask,
    check_decoder_mask,
    check_dot_product_attention,
    check_masked_attention,
    check_merge_folded_heads,
    check_merge_heads,
    check_multi_head_attention,
    check_padding_mask,
    check_split_heads,
    check_split_qkv,
    check_stable_softmax,
    public_test,
)
from transformer_course.exercises import pitfalls as P

param = pytest.mark.parametrize


def _any_dim(softmax):
    """A pitfall softmax over the last axis, made to take ``dim`` as the exercise asks."""

    def fn(scores, mask=None, dim=-1):
        if mask is not None:
            mask = mask.expand_as(scores).movedim(dim, -1)
        return softmax(scores.movedim(dim, -1), mask).movedim(-1, dim)

    fn.__name__ = softmax.__name__
    return fn


def _last_axis_softmax(scores, mask=None):
    """Right along the last axis: a learner's own softmax that takes no ``dim``."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    peak = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - torch.where(torch.isfinite(peak), peak, 0.0))
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def _bthd(attention):
    """A (B, H, T, d) pitfall attention, called in the (B, T, H, d) layout."""

    def fn(q, k, v, key_padding_mask=None):
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        out, w = attention(*(x.transpose(1, 2) for x in (q, k, v)), mask)
        return out.transpose(1, 2), w

    return fn


def _bthd_layout_kept(q, k, v, key_padding_mask=None):  # (B, H, T, d) returned
    out, w = _bthd(P.attention_mask_after_softmax)(q, k, v)
    return out.transpose(1, 2), w


def _mha_out_only(*args, **kwargs):
    return P._multi_head(*args, **kwargs)[0]


CASES = [
    # chapter 1
    (check_dot_product_attention, P.attention_unscaled, "without the 1/sqrt(d) scale"),
    (check_dot_product_attention, P.attention_softmax_over_queries, "query axis"),
    (check_dot_product_attention, P.attention_out_only, "expected the tuple"),
    # chapter 2, exercise 1
    (check_stable_softmax, _any_dim(P.softmax_no_max_shift), "overflowed"),
    (check_stable_softmax, _any_dim(P.softmax_unguarded), "gives NaN (pitfall P1)"),
    (check_stable_softmax, _any_dim(P.softmax_large_negative), "uniform row"),
    (check_stable_softmax, _any_dim(P.softmax_inverted_mask), "mask is inverted"),
    (check_stable_softmax, _any_dim(P.softmax_then_zero), "zeroed after the softmax"),
    (check_stable_softmax, _any_dim(P.softmax_over_queries), "ran over the queries"),
    (
        check_stable_softmax,
        lambda s, mask=None, dim=-1: _last_axis_softmax(s, mask),
        "dim argument was ignored",
    ),
    (
        check_stable_softmax,
        lambda s, mask=None: _last_axis_softmax(s, mask),
        "unexpected keyword argument",
    ),
    (check_stable_softmax, masked_softmax, "calls the library's"),
    (
        check_stable_softmax,
        lambda s, mask=None, dim=-1: masked_softmax(s, mask, dim),
        "calls the library's",
    ),
    (check_masked_attention, scaled_dot_product_attention, "calls the library's"),
    # chapter 2, exercises 2 and 3
    (check_masked_attention, P.attention_unscaled, "P12"),
    (check_masked_attention, P.attention_scaled_by_d_k, "divided by d_k"),
    (check_masked_attention, P.attention_softmax_over_queries, "over the queries"),
    (check_masked_attention, P.attention_softmax_over_batch, "over the batch axis"),
    (check_masked_attention, P.attention_buggy, "over the batch axis"),
    (check_masked_attention, P.attention_inverted_mask, "mask is inverted"),
    (check_masked_attention, P.attention_ignores_mask, "mask had no effect"),
    (check_masked_attention, P.attention_no_guard, "gives NaN (pitfall P1)"),
    (check_masked_attention, P.attention_large_negative, "uniform row"),
    (check_masked_attention, P.attention_mask_after_softmax, "after the softmax"),
    (check_masked_attention, P.attention_ignores_qk, "do not depend on q and k"),
    (check_masked_attention, P.attention_out_only, "expected the tuple"),
    (check_attention_bthd, _bthd(P.attention_unscaled), "P12"),
    (check_attention_bthd, _bthd(P.attention_inverted_mask), "mask is inverted"),
    (check_attention_bthd, _bthd(P.attention_no_guard), "gives NaN (pitfall P1)"),
    (check_attention_bthd, _bthd(P.attention_large_negative), "uniform row"),
    (check_attention_bthd, _bthd_layout_kept, "layout asked for"),
    # chapter 3
    (check_split_heads, P.split_heads_view_only, "P8"),
    (check_split_heads, P.split_heads_no_transpose, "still runs over the tokens"),
    (check_split_heads, P.split_heads_interleaved, "every H-th feature"),
    (check_split_qkv, P.split_qkv_per_head, "cut out of each head's slice"),
    (check_merge_heads, P.merge_heads_no_transpose, "P9"),
    (check_merge_heads, P.merge_heads_no_reshape, "not concatenated"),
    (check_merge_heads, P.merge_heads_interleaved, "alternate between heads"),
    (check_merge_folded_heads, P.merge_folded_heads_buggy, "different batch items"),
    (check_multi_head_attention, P.multi_head_x_at_w, "x @ w"),
    (check_multi_head_attention, P.multi_head_split_view_only, "P8"),
    (check_multi_head_attention, P.multi_head_merge_no_transpose, "P9"),
    (check_multi_head_attention, P.multi_head_inverted_mask, "mask is inverted"),
    (check_multi_head_attention, P.multi_head_scaled_by_d_model, "sqrt(d_model)"),
    (check_multi_head_attention, P.multi_head_no_out_proj, "w_o is missing"),
    (check_multi_head_attention, P.multi_head_averaged_weights, "P13"),
    (check_multi_head_attention, _mha_out_only, "expected the tuple"),
    # chapter 5
    (check_attention_properties, P.masked_attention_axis_renorm, "over the queries"),
    (check_attention_properties, P.attention_softmax_over_queries, "over the queries"),
    (check_attention_properties, P.attention_unscaled, "P12"),
    (check_attention_properties, P.attention_ignores_qk, "q and k are not used"),
    (check_attention_properties, P.attention_inverted_mask, "mask is inverted"),
    (check_attention_properties, P.attention_mask_after_softmax, "after the softmax"),
    (check_attention_properties, P.attention_ignores_mask, "mask had no effect"),
    (check_attention_properties, P.attention_no_guard, "gives NaN (pitfall P1)"),
    (check_attention_properties, P.attention_large_negative, "P6"),
    (check_causal_mask, P.causal_mask_top_left, "aligned top-left"),
    (check_causal_mask, P.causal_mask_inverted, "inverted"),
    (check_causal_mask, P.causal_mask_no_diagonal, "hides the diagonal"),
    (check_causal_mask, P.causal_mask_wrong_offset, "offset points the wrong way"),
    (check_padding_mask, P.padding_mask_query_axis, "P5"),
    (check_padding_mask, P.padding_mask_inverted, "inverted"),
    (check_decoder_mask, P.decoder_mask_buggy, "combined with 'or'"),
]


def _id(case):
    check, fn, _ = case
    return f"{check.__name__}-{getattr(fn, '__name__', 'lambda')}"


@param("check, wrong, message", CASES, ids=[_id(c) for c in CASES])
def test_each_mistake_gets_its_own_message(check, wrong, message, capsys):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    failure = printed[printed.index("✗") :]  # after any "passed" lines of sub-checks
    assert message in failure, failure
    assert "Hint: " in failure and "Traceback" not in printed
    assert len(failure.strip().splitlines()) == 2, "only the message and the hint"
    with pytest.raises(CheckError, match=None) as info:
        check.strict(wrong)
    assert message in info.value.message


def test_hints_do_not_print_the_fix():
    """A hint names where to look, never the line to write."""
    fixes = [
        "transpose(1, 2)",
        "[:, None, None, :]",
        "x @ w.T",
        "softmax(scores, dim=-1)",
        "masked_fill(~mask",
        "math.sqrt(q.shape[-1])",
    ]
    for check, wrong, _ in CASES:
        try:
            check.strict(wrong)
        except CheckError as err:
            for fix in fixes:
                assert fix not in (err.hint or ""), (check.__name__, err.hint)


def test_shape_mistakes_are_shape_errors_and_public_test_reports_only_those():
    with pytest.raises(ShapeError):
        check_split_heads.strict(P.split_heads_no_transpose)
    with pytest.raises(AssertionError, match="still runs over the tokens"):
        public_test(check_split_heads, P.split_heads_no_transpose)
    assert public_test(check_split_heads, P.split_heads_view_only)  # values: hidden


def test_sizes_all_differ_so_a_forgotten_transpose_is_named():
    """With T == H a split without the transpose has the shape asked for; the check's
    inputs keep T, H, d_k and B apart, so the message names the forgotten transpose
    instead of pitfall P8."""
    with pytest.raises(ShapeError, match="still runs over the tokens"):
        check_split_heads.strict(P.split_heads_no_transpose)


def test_a_crash_in_the_learners_code_shows_only_the_learners_frames(capsys):
    def attention(q, k, v):  # chapter 1's find-the-bug: transpose(0, 1) on a batch
        w = (q @ k.transpose(0, 1)).softmax(-1)
        return w @ v, w

    assert check_dot_product_attention(attention) is False
    printed = capsys.readouterr().out
    assert printed.startswith("✗ attention raised RuntimeError")
    assert "in attention" in printed and "transformer_course" not in printed
    with pytest.raises(RuntimeError):
        check_dot_product_attention.strict(attention)


def test_a_crash_inside_pytorch_shows_the_learners_line(capsys):
    """Regression (learner trial 2026-12-01, finding 5): an error raised deep inside
    PyTorch used to show only PyTorch's frames; the learner's own line comes first."""
    from transformer_course.exercises import check_teacher_forcing_loss

    def no_flatten(model, src, tgt, criterion):
        logits = model(src, tgt[:, :-1])
        return criterion(logits, tgt[:, 1:])  # (B, T, V) logits: the learner's line

    assert check_teacher_forcing_loss(no_flatten) is False
    printed = capsys.readouterr().out
    assert printed.startswith("✗ no_flatten raised RuntimeError")
    assert "in no_flatten" in printed and "return criterion(logits" in printed
    assert "raised inside PyTorch" in printed and "in cross_entropy" in printed
    assert "torch/nn/" not in printed  # PyTorch's frames themselves are not listed
