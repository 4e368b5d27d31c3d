"""MultiHeadAttention: parity with torch.nn.MultiheadAttention (copied weights) and the
head pitfalls P2, P3, P8, P9, P10, P13, P14 from ../shared/cases/PITFALLS.md."""

import pytest

from transformer_course.exercises import pitfalls

param = pytest.mark.parametrize


D, H = 16, 4


def split_ok(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)


split_p8 = pitfalls.split_heads_view_only


def merge_ok(heads):
    B, H, T, d = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * d)


merge_p9 = pitfalls.merge_heads_no_transpose


def mha_ok(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
    from transformer_course.attention import scaled_dot_product_attention

    q, k, v = (
        split_ok(x @ w.T, n_heads) for x, w in ((query, w_q), (key, w_k), (value, w_v))
    )
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return merge_ok(out) @ w_o.T, weights


mha_averaged = pitfalls.multi_head_averaged_weights


mha_p9 = pitfalls.multi_head_merge_no_transpose


def test_ch3_checks_accept_right_answers_and_skip_stubs(capsys):
    from transformer_course.exercises import (
        check_merge_heads,
        check_multi_head_attention,
        check_split_heads,
    )

    def stub(*args):
        raise NotImplementedError("your code here")

    assert check_split_heads(split_ok) and check_merge_heads(merge_ok)
    assert check_multi_head_attention(mha_ok)
    assert not any(
        c(stub)
        for c in (check_split_heads, check_merge_heads, check_multi_head_attention)
    )
    out = capsys.readouterr().out
    assert out.count("passed") == 3 and out.count("not attempted yet") == 3


@param(
    "check_name, fn, words",
    [
        ("check_split_heads", split_p8, "P8"),
        ("check_merge_heads", merge_p9, "P9"),
        ("check_multi_head_attention", mha_averaged, "P13"),
        ("check_multi_head_attention", mha_p9, "P9"),
    ],
)
def test_ch3_checks_reject_the_pitfalls(check_name, fn, words):
    from transformer_course import exercises

    with pytest.raises(exercises.CheckError, match=words):
        getattr(exercises, check_name).strict(fn)


def test_the_librarys_multi_head_attention_is_refused(capsys):
    """Learner trial 2026-12-03, finding 2: the library's module, loaded with the four
    weights, passed the exercise."""
    import torch

    from transformer_course import exercises
    from transformer_course.attention import MultiHeadAttention

    def library(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
        mha = MultiHeadAttention(query.shape[-1], n_heads, bias=False)
        with torch.no_grad():
            for lin, w in zip(
                (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj), (w_q, w_k, w_v, w_o)
            ):
                lin.weight.copy_(w)
            return mha(query, key, value, mask)

    assert exercises.check_multi_head_attention(library) is False
    printed = capsys.readouterr().out
    assert "transformer_course.attention.MultiHeadAttention" in printed


def _mha_with(merge=None, use_mask=True):
    import torch

    def fn(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
        q, k, v = (
            split_ok(x @ w.T, n_heads)
            for x, w in ((query, w_q), (key, w_k), (value, w_v))
        )
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if use_mask and mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, -1)
        merged = (merge or merge_ok)(weights @ v)
        return merged @ w_o.T, weights

    return fn


@param(
    "fn, words",
    [
        (_mha_with(use_mask=False), "the mask had no effect"),
        (
            _mha_with(
                merge=lambda h: h.permute(0, 2, 3, 1).reshape(
                    h.shape[0], h.shape[2], -1
                )
            ),
            "feature by feature",
        ),
    ],
    ids=["mask-ignored", "feature-major-merge"],
)
def test_the_2026_12_03_generic_multi_head_answers_are_named(fn, words):
    from transformer_course import exercises

    with pytest.raises(exercises.CheckError, match=words):
        exercises.check_multi_head_attention.strict(fn)


def test_x_at_w_in_the_input_projections_only_is_named():
    """Learner trial 2026-12-03, finding 5: `x @ w` without `.T` (output projection
    right) got a generic message."""
    from transformer_course import exercises

    with pytest.raises(exercises.CheckError, match="q, k and v projections"):
        exercises.check_multi_head_attention.strict(pitfalls.multi_head_x_at_w_inputs)


def test_a_feature_major_merge_of_folded_heads_is_named():
    """Learner trial 2026-12-03, finding 5: generic in the trial."""
    from transformer_course import exercises

    def feature_major(heads, n_heads):
        bh, t, dk = heads.shape
        b = bh // n_heads
        return heads.view(b, n_heads, t, dk).permute(0, 2, 3, 1).reshape(b, t, -1)

    with pytest.raises(exercises.CheckError, match="feature by feature"):
        exercises.check_merge_folded_heads.strict(feature_major)
