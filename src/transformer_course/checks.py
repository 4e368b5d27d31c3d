"""Self-checks for the exercises: run a learner's function on random inputs, compare
with the library's reference, and say what is wrong (which dimension, which axis, where
a NaN appears) with a hint. A check never shows the solution code.

Every check prints a line starting with "passed" on success and raises ``CheckError``
(an ``AssertionError``) with a message and a hint on failure, so it works in a notebook,
under pytest and under the otter-grader autograder alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from transformer_course.attention import masked_softmax, scaled_dot_product_attention

Tensor = torch.Tensor


class CheckError(AssertionError):
    """A self-check failed; the message says what is wrong and gives a hint."""


def _fail(message: str, hint: str | None = None) -> None:
    raise CheckError(message + (f"\nHint: {hint}" if hint else ""))


def _passed(what: str) -> bool:
    print(f"passed: {what}")
    return True


# ------------------------------------------------------------------ generic checks


def check_shape(x, expected: Sequence[int | None], name: str = "x") -> bool:
    """Check that ``x`` is a tensor of shape ``expected`` (``None`` matches any size).

    Raises:
        CheckError: naming the first dimension that differs, e.g.
            "dimension 1 of weights is 5, expected 4".
    """
    if not isinstance(x, Tensor):
        _fail(f"{name} is a {type(x).__name__}, expected a torch.Tensor")
    shape, want = tuple(x.shape), tuple(expected)
    if len(shape) != len(want):
        _fail(
            f"{name} has {len(shape)} dimensions {shape}, expected {len(want)} {want}",
            "check for a missing or extra batch/head dimension (unsqueeze/squeeze).",
        )
    for dim, (got, exp) in enumerate(zip(shape, want)):
        if exp is not None and got != exp:
            _fail(
                f"dimension {dim} of {name} is {got}, expected {exp} "
                f"(shape {shape}, expected {want})",
                "print the shape after every step and compare with the comments.",
            )
    return True


def check_close(
    actual, expected: Tensor, *, atol: float = 1e-5, rtol: float = 1e-5, name: str = "x"
) -> bool:
    """Check that ``actual`` equals ``expected`` within ``atol + rtol * |expected|``.

    Raises:
        CheckError: for a wrong shape, NaN/inf (with the first position), or values
            out of tolerance (with the largest difference and where it is).
    """
    check_shape(actual, expected.shape, name)
    actual = actual.detach().to(expected.dtype)
    bad = ~torch.isfinite(actual)
    if bad.any():
        where = tuple(torch.nonzero(bad)[0].tolist())
        _fail(
            f"{name} has {int(bad.sum())} NaN/inf values, the first at index {where}",
            "a softmax over a row whose keys are all masked gives NaN; "
            "look for a division by zero or exp of a large number.",
        )
    diff = (actual - expected).abs()
    tol = atol + rtol * expected.abs()
    if (diff > tol).any():
        where = tuple(torch.nonzero(diff > tol)[0].tolist())
        _fail(
            f"{name} differs from the reference: max |difference| = "
            f"{diff.max().item():.3g}; first wrong entry at index {where}: "
            f"got {actual[where].item():.5g}, expected {expected[where].item():.5g}"
        )
    return True


# ------------------------------------------------------- chapter 1: queries, keys, values


def _random_qkv(gen: torch.Generator, lead: tuple[int, ...], t: int, s: int, d: int, dv: int):
    q = torch.randn(*lead, t, d, generator=gen)
    k = torch.randn(*lead, s, d, generator=gen)
    v = torch.randn(*lead, s, dv, generator=gen)
    return q, k, v


def check_soft_lookup(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> bool:
    """Chapter 1, exercise "soft lookup": ``fn(query, keys, values)`` with query (d,),
    keys (S, d), values (S, d_v) must return the (d_v,) weighted sum of the values with
    weights softmax(keys @ query / sqrt(d)).

    Raises:
        CheckError: with a hint that names the mistake (hard lookup, missing scale,
            wrong shape).
    """
    gen = torch.Generator().manual_seed(1)
    for s, d, dv in ((5, 4, 3), (1, 8, 2), (7, 16, 5)):
        q = torch.randn(d, generator=gen)
        keys = torch.randn(s, d, generator=gen)
        values = torch.randn(s, dv, generator=gen)
        out = fn(q, keys, values)
        check_shape(out, (dv,), "output")
        scores = keys @ q
        ref = torch.softmax(scores / math.sqrt(d), dim=0) @ values
        if torch.allclose(out, ref, atol=1e-5):
            continue
        if torch.allclose(out, values[scores.argmax()], atol=1e-5):
            _fail(
                "your output is the value of the best-matching key only: a hard lookup",
                "a soft lookup mixes every value, weighted by the softmax of the scores.",
            )
        if torch.allclose(out, torch.softmax(scores, 0) @ values, atol=1e-5):
            _fail(
                "your output matches softmax(keys @ query) @ values without scaling",
                "divide the scores by sqrt(d), the size of the query vector.",
            )
        check_close(out, ref, atol=1e-5, name="output")
    return _passed("soft lookup matches the reference on 3 random inputs")


def check_dot_product_attention(
    fn: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
) -> bool:
    """Chapter 1, exercise "batched attention": ``fn(q, k, v)`` with q (B, T, d),
    k (B, S, d), v (B, S, d_v) must return ``(out, weights)``: out (B, T, d_v) and
    weights (B, T, S) = softmax(q k^T / sqrt(d)) over the keys.

    Raises:
        CheckError: naming a wrong shape, a softmax over the wrong axis, a missing scale,
            batch items that leak into each other, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(2)
    for b, t, s, d, dv in ((2, 3, 4, 8, 5), (1, 1, 6, 4, 2), (3, 5, 2, 16, 3)):
        q, k, v = _random_qkv(gen, (b,), t, s, d, dv)
        result = fn(q, k, v)
        if not (isinstance(result, tuple) and len(result) == 2):
            _fail(
                f"expected fn to return a tuple (out, weights), got {type(result).__name__}",
                "return both the output and the attention weights.",
            )
        out, weights = result
        check_shape(weights, (b, t, s), "weights")
        check_shape(out, (b, t, dv), "out")
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        if not torch.allclose(weights.sum(-1), torch.ones(b, t), atol=1e-5):
            if t > 1 and torch.allclose(weights.sum(-2), torch.ones(b, s), atol=1e-5):
                _fail(
                    "each column of weights sums to 1: the softmax ran over the query "
                    "axis (dim=-2)",
                    "normalise over the keys: softmax(..., dim=-1).",
                )
            _fail(
                "the weights of a query do not sum to 1 over the keys",
                "apply softmax over the last dimension (the keys).",
            )
        raw = masked_softmax(q @ k.transpose(-2, -1))
        if torch.allclose(weights, raw, atol=1e-5) and d > 1:
            _fail(
                "your weights are softmax(q k^T) without the 1/sqrt(d) scale",
                "divide the scores by sqrt(d_k) before the softmax.",
            )
        check_close(weights, ref_w, atol=1e-5, name="weights")
        check_close(out, ref_out, atol=1e-5, name="out")
        if b > 1:
            perm = torch.randperm(b, generator=gen)
            out_p, _ = fn(q[perm], k[perm], v[perm])
            if not torch.allclose(out_p, out[perm], atol=1e-5):
                _fail(
                    "permuting the batch does not permute the outputs: items leak into "
                    "each other",
                    "use batched matmul (q @ k.transpose(-2, -1)), not a reshape that "
                    "mixes the batch.",
                )
    return _passed("batched dot-product attention matches the reference on 3 random inputs")
