"""Masks (chapter 5): hypothesis property tests for shapes, broadcasting and polarity of
masks.py, the mask pitfalls P1-P7 on every attention backend, and the chapter's
property checks in transformer_course.exercises (each passes the library and rejects a
broken function)."""

from __future__ import annotations

import pytest
import torch

from transformer_course import exercises
from transformer_course.attention import (
    ATTENTION_BACKENDS,
    scaled_dot_product_attention,
)
from transformer_course.exercises import pitfalls
from transformer_course.masks import (
    causal_mask,
    padding_mask,
)

param = pytest.mark.parametrize


BACKENDS = sorted(ATTENTION_BACKENDS)


def _library(q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, mask)


# the known-wrong functions come from the exercises' pitfalls module
_mask_after_softmax = pitfalls.attention_mask_after_softmax


_inverted = pitfalls.attention_inverted_mask


_ignores_mask = pitfalls.attention_ignores_mask


_minus_inf_nan = pitfalls.attention_no_guard


_large_negative = pitfalls.attention_large_negative


def _stub(q, k, v, mask):
    raise NotImplementedError("your code here")


_top_left = pitfalls.causal_mask_top_left


@param("backend", BACKENDS)
def test_property_checks_pass_every_backend(backend, capsys):
    assert exercises.check_attention_properties(
        ATTENTION_BACKENDS[backend], name=backend, library_ok=True
    )
    assert "all four mask properties hold" in capsys.readouterr().out


@param(
    "check, broken, message",
    [
        (
            exercises.check_causal_leakage,
            _mask_after_softmax,
            "future leaked into position 0",
        ),
        (exercises.check_causal_leakage, _inverted, "future leaked"),
        (exercises.check_causal_leakage, _ignores_mask, "future leaked"),
        (exercises.check_padding_invariance, _ignores_mask, "padding leaked"),
        (exercises.check_padding_invariance, _mask_after_softmax, "padding leaked"),
        (exercises.check_mask_polarity, _inverted, "polarity is inverted"),
        (exercises.check_mask_polarity, _ignores_mask, "mask had no effect"),
        (exercises.check_fully_masked_rows, _minus_inf_nan, "gives NaN"),
        (exercises.check_fully_masked_rows, _large_negative, "uniform"),
    ],
)
def test_property_checks_catch_broken_functions(check, broken, message):
    assert check(_library)
    with pytest.raises(exercises.CheckError, match=message):
        check.strict(broken)


def test_property_checks_not_attempted(capsys):
    assert exercises.check_attention_properties(_stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def _own_causal(t, s):
    return torch.ones(t, s, dtype=torch.bool).tril(s - t)


def _own_padding(ids, pad):
    return (ids != pad)[:, None, None, :]


@param(
    "fn, message",
    [
        (lambda t, s: ~_own_causal(t, s), "inverted"),
        (
            lambda t, s: torch.ones(t, s, dtype=torch.bool).tril(s - t - 1),
            "hides the diagonal",
        ),
        (lambda t, s: _own_causal(t, s).float(), "dtype"),
        (_top_left, "aligned top-left"),
    ],
)
def test_check_causal_mask(fn, message):
    assert exercises.check_causal_mask(_own_causal)
    with pytest.raises(exercises.CheckError, match=message):
        exercises.check_causal_mask.strict(fn)


@param(
    "fn, message",
    [
        (lambda ids, pad: (ids != pad)[:, None, :, None], "hides padded queries"),
        (lambda ids, pad: (ids == pad)[:, None, None, :], "inverted"),
        (lambda ids, pad: (ids != pad)[:, None, :], "dimensions"),
    ],
)
def test_check_padding_mask(fn, message):
    assert exercises.check_padding_mask(_own_padding)
    with pytest.raises(exercises.CheckError, match=message):
        exercises.check_padding_mask.strict(fn)


# ------------------------------------------------ learner trial 2026-12-03 (issue 39)


@param(
    "check, answer, library",
    [
        (exercises.check_causal_mask, causal_mask, "masks.causal_mask"),
        (
            exercises.check_causal_mask,
            lambda t, s: causal_mask(t, s),
            "masks.causal_mask",
        ),
        (exercises.check_padding_mask, padding_mask, "masks.padding_mask"),
        (
            exercises.check_attention_properties,
            lambda q, k, v, mask: scaled_dot_product_attention(q, k, v, mask)[0],
            "attention.scaled_dot_product_attention",
        ),
        (
            exercises.check_attention_properties,
            lambda q, k, v, mask: ATTENTION_BACKENDS["sdpa"](q, k, v, mask)[0],
            "attention.sdpa_attention",
        ),
    ],
    ids=["causal-alias", "causal-wrapper", "padding", "attention", "sdpa-backend"],
)
def test_the_librarys_own_version_is_refused(check, answer, library, capsys):
    """Finding 2: ``causal_mask`` (imported by the chapter's first cell) and the
    library's attention passed the exercises that ask for them."""
    assert check(answer) is False
    assert (
        f"calls the library's transformer_course.{library}" in capsys.readouterr().out
    )


def _decoder(causal, padding):
    def fn(tokens, pad_id):
        t = tokens.shape[1]
        return causal(t) & padding(tokens, pad_id)

    return fn


def _tril(t):
    return torch.ones(t, t, dtype=torch.bool).tril()


def _keys(tokens, pad):
    return (tokens != pad)[:, None, None, :]


def _queries(tokens, pad):
    return (tokens != pad)[:, None, :, None]


@param(
    "fn, message",
    [
        (
            _decoder(_tril, lambda x, p: _keys(x, p) & _queries(x, p)),
            None,  # hides padded keys and padded queries' rows: defensible, accepted
        ),
        (_decoder(_tril, _queries), "left-padded sequence"),  # finding 6
        (_decoder(_tril, lambda x, p: ~_keys(x, p)), "padding part is inverted"),
        (
            _decoder(lambda t: torch.ones(t, t, dtype=torch.bool).triu(), _keys),
            "upper-triangular",
        ),
    ],
    ids=["keys-and-queries", "queries", "inverted-padding", "triu"],
)
def test_decoder_mask_messages_are_true_for_their_input(fn, message, capsys):
    if message is None:
        assert exercises.check_decoder_mask(fn) is True
        return
    with pytest.raises(exercises.CheckError, match=message):
        exercises.check_decoder_mask.strict(fn)


def test_a_causal_mask_off_by_one_is_named():
    with pytest.raises(exercises.CheckError, match="one key too many"):
        exercises.check_causal_mask.strict(
            lambda t, s: torch.ones(t, s, dtype=torch.bool).tril(s - t + 1)
        )
