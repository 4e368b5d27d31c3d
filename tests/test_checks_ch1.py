"""Chapter 1's exercise checks reject wrong answers with a useful message (that the
chapter's reference solutions pass is checked for every chapter in test_exercises.py)."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_course.exercises import (
    CheckError,
    check_close,
    check_dot_product_attention,
    check_shape,
    check_soft_lookup,
)


def test_stub_is_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert check_soft_lookup(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def _unscaled(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return w @ v, w


def _wrong_axis(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=1)
    return w @ v, w


def _transpose_bug(q, k, v):  # the chapter's "find the bug" code
    w = torch.softmax(q @ k.transpose(0, 1) / math.sqrt(q.shape[-1]), dim=1)
    return w @ v, w


def _no_tuple(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v


@pytest.mark.parametrize(
    "fn, words",
    [
        (_unscaled, "sqrt"),
        (_wrong_axis, "query axis"),
        (_transpose_bug, ""),
        (_no_tuple, "tuple"),
    ],
)
def test_wrong_attention_is_rejected_with_a_hint(fn, words):
    with pytest.raises((CheckError, RuntimeError)) as info:
        check_dot_product_attention.strict(fn)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda q, K, V: V[(K @ q).argmax()], "hard lookup"),
        (lambda q, K, V: torch.softmax(K @ q, 0) @ V, "without scaling"),
        (lambda q, K, V: torch.softmax(K @ q, 0)[:, None] * V, "dimensions"),
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
