"""Chapter 1's self-checks (the soft lookup, batched attention, additive attention of
the encoder): a right answer passes, the stub is "not attempted", and each trial
mistake is rejected with its own message."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_course.additive import additive_attention
from transformer_course.attention import scaled_dot_product_attention
from transformer_course.exercises import (
    CheckError,
    check_close,
    check_dot_product_attention,
    check_encoder_attention,
    check_shape,
    check_soft_lookup,
)
from transformer_course.exercises import pitfalls as P

param = pytest.mark.parametrize


def _encoder_attention(dec, memory, w_q, w_k, w_score, *, axis=-1, tanh=True):
    features = (dec @ w_q.T).unsqueeze(-2) + (memory @ w_k.T).unsqueeze(-3)  # (B,T,S,A)
    scores = (features.tanh() if tanh else features) @ w_score  # (B, T, S)
    weights = scores.softmax(axis)
    return weights @ memory, weights


def _valid_only(lookup):
    """A three-argument lookup, made to take ``valid`` (it reads only valid entries)."""

    def fn(q, K, V, valid):
        return lookup(q, K[valid], V[valid])

    return fn


def _transpose_bug(q, k, v):  # the chapter's "find the bug" code
    w = torch.softmax(q @ k.transpose(0, 1) / math.sqrt(q.shape[-1]), dim=1)
    return w @ v, w


def _lookup(scores_of, weights_of=torch.softmax):
    def fn(q, K, V, valid):
        return weights_of(scores_of(q, K[valid]), 0) @ V[valid]

    return fn


def _right(q, K, V, valid):
    scores = (K @ q / math.sqrt(len(q))).masked_fill(~valid, float("-inf"))
    return torch.softmax(scores, 0) @ V


def _pair(weights_of):
    def fn(q, k, v):
        w = weights_of(q, k)
        return w @ v, w

    return fn


def _loop_over_batch(q, k, v):
    rows = [
        torch.softmax(q[b] @ k[b].T / math.sqrt(q.shape[-1]), -1) for b in range(len(q))
    ]
    w = torch.stack(rows)
    return w @ v, w


def _swapped(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
    return w, w @ v


def _encoder(features_of, axis=-1):
    def fn(dec, memory, w_q, w_k, w_score):
        f = (dec @ w_q.T).unsqueeze(-2) + (memory @ w_k.T).unsqueeze(-3)
        w = torch.softmax(features_of(f, w_score), dim=axis)
        return w @ memory, w

    return fn


def _library_lookup(q, K, V, valid):
    return scaled_dot_product_attention(q[None], K, V, valid[None])[0][0]


def _library_attention(q, k, v):
    return scaled_dot_product_attention(q, k, v)


def _library_encoder(dec, memory, w_q, w_k, w_score):
    return additive_attention(dec, memory, memory, w_q, w_k, w_score)


_SQRT = math.sqrt


TRIAL_CH1 = [
    (check_soft_lookup, _lookup(lambda q, K: K @ q), "without scaling"),
    (check_soft_lookup, _lookup(lambda q, K: K @ q / len(q)), "divided by d"),
    (
        check_soft_lookup,
        _valid_only(lambda q, K, V: torch.softmax(K @ q / _SQRT(V.shape[-1]), 0) @ V),
        "sqrt(d_v)",
    ),
    (
        check_soft_lookup,
        _valid_only(lambda q, K, V: torch.softmax(K @ q, 0)),
        "dimension 0",
    ),
    (
        check_soft_lookup,
        _valid_only(lambda q, K, V: V[(K @ q).argmax()]),
        "hard lookup",
    ),
    (check_soft_lookup, _valid_only(lambda q, K, V: V.mean(0)), "same weight"),
    (
        check_soft_lookup,
        _valid_only(lambda q, K, V: (K @ q / _SQRT(len(q))) @ V),
        "no softmax",
    ),
    (
        check_soft_lookup,
        lambda q, K, V, valid: _lookup(lambda q, K: K @ q)(q, K, V, valid)[None],
        "dimensions",
    ),
    (check_soft_lookup, _library_lookup, "calls the library's"),
    (
        check_soft_lookup,
        lambda q, K, V, valid: torch.softmax(K @ q / _SQRT(len(q)), 0) @ V,
        "valid is ignored",
    ),
    (check_soft_lookup, lambda q, K, V, valid: _right(q, K, V, ~valid), "wrong way"),
    (
        check_soft_lookup,
        lambda q, K, V, valid: (torch.softmax(K @ q / _SQRT(len(q)), 0) * valid) @ V,
        "after the softmax",
    ),
    (
        check_dot_product_attention,
        _pair(
            lambda q, k: torch.softmax(q @ k.transpose(-2, -1) / _SQRT(q.shape[-1]), 1)
        ),
        "query axis",
    ),
    (
        check_dot_product_attention,
        _pair(lambda q, k: torch.softmax(q @ k.mT, -1)),
        "without the 1/sqrt(d) scale",
    ),
    (check_dot_product_attention, _swapped, "the pair is swapped"),
    (check_dot_product_attention, lambda q, k, v: _swapped(q, k, v)[1], "tuple"),
    (check_dot_product_attention, _loop_over_batch, "loops over the batch"),
    (check_dot_product_attention, _library_attention, "calls the library's"),
    (check_encoder_attention, _encoder(lambda f, w: f @ w), "miss the tanh"),
    (
        check_encoder_attention,
        _encoder(lambda f, w: f.tanh() @ w, axis=1),
        "over the decoder steps",
    ),
    (check_encoder_attention, _library_encoder, "calls the library's"),
]


def _with_valid(weights_of):
    def fn(q, k, v, valid):
        w = weights_of(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), valid)
        return w @ v, w

    return fn


def _masked(scores, valid):
    return torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), -1)


def _loop_with_valid(q, k, v, valid):
    outs = [
        _with_valid(_masked)(q[b : b + 1], k[b : b + 1], v[b : b + 1], valid[b : b + 1])
        for b in range(len(q))
    ]
    return torch.cat([o for o, _ in outs]), torch.cat([w for _, w in outs])


def test_check_encoder_attention_passes_the_reference():
    assert check_encoder_attention(_encoder_attention) is True


@param(
    "wrong,match",
    [
        (lambda *a: _encoder_attention(*a, axis=1), "decoder steps"),
        (lambda *a: _encoder_attention(*a, tanh=False), "tanh"),
        (
            lambda d, m, *a: (
                m[:, -1:].expand_as(d),
                _encoder_attention(d, m, *a)[1] * 0,
            ),
            "bottleneck",
        ),
        (lambda *a: _encoder_attention(*a)[0], "tuple"),
    ],
)
def test_check_encoder_attention_names_the_mistake(wrong, match):
    with pytest.raises(CheckError, match=match):
        check_encoder_attention.strict(wrong)


def test_check_encoder_attention_reports_a_stub_as_not_attempted():
    def stub(*args):
        raise NotImplementedError

    assert check_encoder_attention(stub) is False


def test_stub_is_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert check_soft_lookup(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_stub_message_fits_the_page_column(capsys):
    """The page's output column holds about 76 characters; the stub's message (shown
    under every coding exercise of the book) must not scroll sideways."""

    def encoder_attention(*args):  # the longest stub name of chapter 1
        raise NotImplementedError

    check_encoder_attention(encoder_attention)
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(map(len, lines)) <= 76, lines


@pytest.mark.parametrize(
    "fn, words",
    [
        (P.attention_unscaled, "sqrt"),
        (P.attention_softmax_over_queries, "query axis"),
        (_transpose_bug, ""),
        (P.attention_out_only, "tuple"),
    ],
)
def test_wrong_attention_is_rejected_with_a_hint(fn, words):
    with pytest.raises((CheckError, RuntimeError)) as info:
        check_dot_product_attention.strict(fn)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "fn, words",
    [
        (_valid_only(lambda q, K, V: V[(K @ q).argmax()]), "hard lookup"),
        (_valid_only(lambda q, K, V: torch.softmax(K @ q, 0) @ V), "without scaling"),
        (
            _valid_only(lambda q, K, V: torch.softmax(K @ q, 0)[:, None] * V),
            "dimensions",
        ),
    ],
)
def test_wrong_soft_lookup_is_rejected(fn, words):
    with pytest.raises(CheckError, match=words):
        check_soft_lookup.strict(fn)


def test_check_shape_and_close_name_the_problem():
    with pytest.raises(CheckError, match="dimension 1 of w is 5, expected 4"):
        check_shape(torch.zeros(2, 5), (2, 4), "w")
    assert check_shape(torch.zeros(2, 5), (2, None), "w")
    with pytest.raises(CheckError, match="NaN"):
        check_close(torch.tensor([1.0, float("nan")]), torch.ones(2))
    with pytest.raises(CheckError, match="index \\(1,\\)"):
        check_close(torch.tensor([1.0, 3.0]), torch.ones(2))
    assert check_close(torch.ones(2), torch.ones(2))


@pytest.mark.parametrize(
    "check, wrong, message", TRIAL_CH1, ids=[str(i) for i in range(len(TRIAL_CH1))]
)
def test_each_trial_mistake_of_chapter_1_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert "Traceback" not in printed


def test_the_right_soft_lookup_passes(quiet_check):
    assert quiet_check(check_soft_lookup, _right) is True


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_with_valid(lambda s, valid: torch.softmax(s, -1)), "valid is ignored"),
        (_with_valid(lambda s, valid: _masked(s, ~valid)), "wrong way round"),
        (
            _with_valid(lambda s, valid: torch.softmax(s, -1) * valid[:, None, :]),
            "after the softmax",
        ),
        (_loop_with_valid, "loops over the batch"),
        (
            lambda q, k, v, valid: _with_valid(_masked)(
                q * math.sqrt(q.shape[-1]), k, v, valid
            ),
            "without the 1/sqrt(d) scale",
        ),
        (
            lambda q, k, v, valid: scaled_dot_product_attention(
                q, k, v, valid[:, None]
            ),
            "calls the library's",
        ),
    ],
    ids=["ignored", "inverted", "after-softmax", "loop", "unscaled", "library"],
)
def test_each_mistake_with_missing_keys_gets_its_own_message(wrong, message, capsys):
    assert check_dot_product_attention(wrong, with_valid=True) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed


def test_batched_attention_with_missing_keys_passes(quiet_check):
    def check(fn):
        return check_dot_product_attention(fn, with_valid=True)

    assert quiet_check(check, _with_valid(_masked)) is True


# ----------------------------------------------- learner trial 2026-12-03 (issue 39)


def _transposed_scores(q, k, v, valid):
    """The scores built as k q^T (B, S, T), keys hidden along their own axis, softmax
    over the last axis (the queries), transposed back: a softmax over the queries."""
    scores = (k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        ~valid[:, :, None], float("-inf")
    )
    weights = torch.softmax(scores, dim=-1).transpose(-2, -1)
    return weights @ v, weights


def _scores_zeroed(q, k, v, valid):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~valid[:, None, :], 0.0), -1)
    return weights @ v, weights


def _scores_times_valid(q, k, v, valid):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores * valid[:, None, :], -1)
    return weights @ v, weights


def _lookup_zeroed(query, keys, values, valid):
    scores = keys @ query / math.sqrt(query.shape[-1])
    return torch.softmax(scores.masked_fill(~valid, 0.0), 0) @ values


def _lookup_times_valid(query, keys, values, valid):
    scores = keys @ query / math.sqrt(query.shape[-1])
    return torch.softmax(scores * valid, 0) @ values


TRIAL_2026_12_03 = [
    # finding 3a: with_valid=True reached the NaN hint or a shape message first
    (P.attention_valid_softmax_over_queries, "the softmax ran over the query axis"),
    (_transposed_scores, "the softmax ran over the query axis"),
    (P.attention_valid_swapped, "the pair is swapped"),
    # finding 5: generic in the trial
    (_scores_zeroed, "scores were set to 0 (filled with 0, or multiplied"),
    (_scores_times_valid, "multiplied by valid"),
]


@pytest.mark.parametrize(
    "wrong, message", TRIAL_2026_12_03, ids=[str(i) for i in range(5)]
)
def test_each_mistake_of_the_2026_12_03_trial_gets_its_own_message(
    wrong, message, capsys
):
    assert check_dot_product_attention(wrong, with_valid=True) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert len(printed.strip().splitlines()) == 2, printed


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_lookup_zeroed, r"scores were set to 0 \(filled with 0, or multiplied"),
        (_lookup_times_valid, "multiplied by valid"),  # the same weights
    ],
)
def test_the_soft_lookups_generic_answers_are_named(wrong, message):
    with pytest.raises(CheckError, match=message):
        check_soft_lookup.strict(wrong)


def test_out_from_the_unmasked_weights_is_named():
    """Learner trial 2026-12-03, finding 5: generic in the trial."""

    def unmasked_out(q, k, v, valid):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        out = torch.softmax(scores, -1) @ v
        weights = torch.softmax(scores.masked_fill(~valid[:, None, :], -math.inf), -1)
        return out, weights

    with pytest.raises(CheckError, match="before the missing keys were hidden"):
        check_dot_product_attention.strict(unmasked_out, with_valid=True)
