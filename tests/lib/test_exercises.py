"""The checks look at how an answer computes (``exercises._method``): a call into the
library's own implementation, a loop where the exercise forbids one, a row read at once
where it is to be streamed. Each detector is shown catching its wrong answer and letting
a right one through; the re-check's static reading of a notebook is tested the same way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from transformer_course import distill
from transformer_course.distill import mean_pool
from transformer_course.exercises import CheckError, check_mean_pool
from transformer_course.exercises._method import (
    library_use,
    loops_over,
    own_code,
    torch_calls,
    whole_row_reductions,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from course_grading import recheck


def _own_pool(h, m):
    m = m[..., None].to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp(min=1)


def _helper(h, m):
    return distill.mean_pool(h, m)


@pytest.mark.parametrize(
    "answer",
    [
        mean_pool,  # imported under the expected name
        lambda h, m: mean_pool(h, m),  # a one-line wrapper
        lambda h, m: _helper(h, m),  # through a helper of the learner's
        lambda h, m: distill.mean_pool(h, m) + 0,  # through the module
    ],
    ids=["alias", "wrapper", "helper", "module"],
)
def test_an_answer_that_calls_the_library_is_refused(answer, capsys):
    assert check_mean_pool(answer) is False
    printed = capsys.readouterr().out
    assert "calls the library's transformer_course.distill.mean_pool" in printed


def test_own_code_watches_only_the_learners_call():
    def reference_after(h, m):  # the check may use the library itself afterwards
        return _own_pool(h, m)

    wrapped = own_code(reference_after, mean_pool)
    h, m = torch.randn(2, 3, 4), torch.ones(2, 3, dtype=torch.bool)
    assert torch.allclose(wrapped(h, m), mean_pool(h, m))
    with pytest.raises(CheckError, match="calls the library's"):
        own_code(_helper, mean_pool)(h, m)


NOTEBOOK_WRAPPER = """import torch
from transformer_course import distill

def helper(h, m):
    return distill.mean_pool(h, m)

def my_mean_pool(h, m):
    return helper(h, m)
"""
NOTEBOOK_OWN = """import torch

def my_mean_pool(h, m):
    m = m[..., None].to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp(min=1)
"""


@pytest.mark.parametrize(
    "source, expected",
    [
        (NOTEBOOK_WRAPPER, "transformer_course.distill.mean_pool"),
        (
            "from transformer_course.distill import mean_pool as my_mean_pool",
            "mean_pool",
        ),
        (
            "import transformer_course as tc\nmy_mean_pool = tc.distill.mean_pool",
            "mean",
        ),
        ("from transformer_course.distill import *\nmy_mean_pool = mean_pool", "mean"),
        (NOTEBOOK_OWN, None),
        (  # a local variable named like a notebook variable computed by the library
            (
                "from transformer_course import distill\n"
                "pooled = distill.mean_pool(h, m)\n"
                "def my_mean_pool(h, m):\n"
                "    pooled = (h * m[..., None]).sum(1)\n"
                "    return pooled / m.sum(1, keepdim=True)\n"
            ),
            None,
        ),
        ("def my_mean_pool(h, m:\n", None),  # a syntax error reads as nothing found
    ],
    ids=[
        "helper",
        "import-alias",
        "assignment",
        "star",
        "own",
        "local",
        "syntax-error",
    ],
)
def test_library_use_reads_a_notebook_without_running_it(source, expected):
    found = library_use(source, "my_mean_pool", (mean_pool,))
    assert (found is None) if expected is None else (expected in found)


def test_a_proxy_with_the_notebook_source_is_judged_by_that_source(capsys):
    """The instructor's re-check calls the learner's function in a worker process;
    its proxy carries the notebook's code, which the check reads."""

    def proxy(source):
        def my_mean_pool(h, m):  # the worker's answer: right numbers either way
            return _own_pool(h, m)

        my_mean_pool.__learner_source__ = source
        return my_mean_pool

    assert check_mean_pool(proxy(NOTEBOOK_WRAPPER)) is False
    assert "calls the library's" in capsys.readouterr().out
    assert check_mean_pool(proxy(NOTEBOOK_OWN)) is True


def test_an_answer_imported_under_the_expected_name_is_named_as_such():
    """Regression (instructor trial 2026-12-01, finding 3): an imported answer was
    reported as "not defined" while it scored "passed"."""
    cell = "from transformer_course.attention import masked_softmax as my_softmax\n"
    notebook = {"cells": [{"cell_type": "code", "source": cell}]}
    message = recheck._missing(notebook, ["my_softmax"])
    assert "bound by an import from the library" in message
    assert "transformer_course.attention.masked_softmax" in message
    assert "is not defined" not in message
    assert "is not defined" in recheck._missing({"cells": []}, ["my_softmax"])


def _batched(q, k):
    return (q @ k.transpose(-2, -1)).softmax(-1)


def _looped(q, k):
    return torch.stack([(q[b] @ k[b].T).softmax(-1) for b in range(len(q))])


def test_loops_over_sees_a_loop_over_the_batch():
    one, four = torch.randn(1, 3, 4), torch.randn(4, 3, 4)
    assert loops_over(_looped, (one, one), (four, four))
    assert not loops_over(_batched, (one, one), (four, four))


def test_whole_row_reductions_see_a_softmax_over_more_than_a_block():
    x = torch.randn(10)

    def streamed(x, block):
        return [x[j : j + block].max() for j in range(0, len(x), block)]

    assert whole_row_reductions(torch_calls(torch.softmax, x, 0)[1], 3) == ["softmax"]
    assert whole_row_reductions(torch_calls(streamed, x, 3)[1], 3) == []
    assert "max" in whole_row_reductions(torch_calls(streamed, x, 3)[1], 2)
