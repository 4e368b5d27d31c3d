"""Chapter 1, queries, keys and values: the soft lookup and batched attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.attention import scaled_dot_product_attention
from transformer_course.exercises import pitfalls
from transformer_course.exercises._common import (
    Tensor,
    check_close,
    check_shape,
    close,
    exercise_check,
    fail,
    out_and_weights,
    passed,
    random_qkv,
)


@exercise_check
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
            fail(
                "your output is the value of the best-matching key only: a hard lookup",
                "a soft lookup mixes every value, weighted by the softmax of the scores.",
            )
        if torch.allclose(out, torch.softmax(scores, 0) @ values, atol=1e-5):
            fail(
                "your output matches softmax(keys @ query) @ values without scaling",
                "divide the scores by sqrt(d), the size of the query vector.",
            )
        check_close(out, ref, atol=1e-5, name="output")
    return passed("soft lookup matches the reference on 3 random inputs")


@exercise_check
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
    for b, t, s, d, dv in ((2, 3, 4, 8, 5), (1, 1, 6, 4, 2), (3, 5, 2, 16, 4)):
        q, k, v = random_qkv(gen, (b,), t, s, d, dv)
        out, weights = out_and_weights(fn(q, k, v))
        check_shape(weights, (b, t, s), "weights")
        check_shape(out, (b, t, dv), "out")
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        if not torch.allclose(weights.sum(-1), torch.ones(b, t), atol=1e-5):
            if t > 1 and torch.allclose(weights.sum(-2), torch.ones(b, s), atol=1e-5):
                fail(
                    "each column of weights sums to 1: the softmax ran over the query "
                    "axis (dim=-2)",
                    "normalise over the keys, the last axis.",
                )
            fail(
                "the weights of a query do not sum to 1 over the keys",
                "apply softmax over the last dimension (the keys).",
            )
        raw = pitfalls.attention_unscaled(q, k, v)[1]
        if close(weights, raw) and d > 1:
            fail(
                "your weights are softmax(q k^T) without the 1/sqrt(d) scale",
                "divide the scores by sqrt(d_k) before the softmax.",
            )
        check_close(weights, ref_w, atol=1e-5, name="weights")
        check_close(out, ref_out, atol=1e-5, name="out")
        if b > 1:
            perm = torch.randperm(b, generator=gen)
            out_p, _ = out_and_weights(fn(q[perm], k[perm], v[perm]))
            if not torch.allclose(out_p, out[perm], atol=1e-5):
                fail(
                    "permuting the batch does not permute the outputs: items leak into "
                    "each other",
                    "transpose only the last two axes of k, and never reshape across "
                    "the batch.",
                )
    return passed("batched dot-product attention matches the reference on 3 random inputs")
