"""Chapter 1, queries, keys and values: the soft lookup and batched attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.additive import additive_attention
from transformer_course.attention import scaled_dot_product_attention
from transformer_course.exercises import pitfalls
from transformer_course.exercises._common import (
    ShapeError,
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
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids, loops_over


@exercise_check
@forbids(scaled_dot_product_attention)
def check_soft_lookup(fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> bool:
    """Chapter 1, exercise "soft lookup with missing entries": ``fn(query, keys,
    values, valid)`` with query (d,), keys (S, d), values (S, d_v) and a bool valid
    (S,) (False = an entry that is not there) must return the (d_v,) weighted sum of
    the values, with weights softmax(keys @ query / sqrt(d)) over the valid keys only
    (0 for the others).

    Raises:
        CheckError: with a hint that names the mistake (hard lookup, missing or wrong
            scale, no softmax, a plain mean, ``valid`` ignored or inverted, weights
            zeroed after the softmax, wrong shape, a call to the library's attention).
    """
    gen = torch.Generator().manual_seed(1)
    for s, d, dv, n_missing in (
        (5, 4, 3, 0),
        (1, 8, 2, 0),
        (7, 16, 5, 0),
        (6, 4, 3, 2),
    ):
        q = torch.randn(d, generator=gen)
        keys = torch.randn(s, d, generator=gen)
        values = torch.randn(s, dv, generator=gen) * 3
        valid = torch.ones(s, dtype=torch.bool)
        valid[torch.randperm(s, generator=gen)[:n_missing]] = False
        out = fn(q, keys, values, valid.clone())
        check_shape(out, (dv,), "output")
        scores = keys @ q
        ref = torch.softmax(scores[valid] / math.sqrt(d), dim=0) @ values[valid]
        if torch.allclose(out, ref, atol=1e-5):
            continue
        if n_missing:
            _missing_entries(out, scores / math.sqrt(d), values, valid)
        elif not torch.isfinite(out).all():
            fail(
                "NaN although every entry is valid: your lookup treats them all as "
                "missing, so valid is read the wrong way round",
                "True in valid marks an entry that is there.",
            )
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
        wrong_scale = {
            N_("your scores are divided by d, not sqrt(d)"): d,
            N_(
                "your scores are divided by sqrt(d_v), the size of a value, not sqrt(d)"
            ): math.sqrt(dv),
        }
        for message, by in wrong_scale.items():
            if by != math.sqrt(d) and close(
                out, torch.softmax(scores / by, 0) @ values
            ):
                fail(
                    message,
                    "the scale comes from the vectors that are multiplied: query and "
                    "keys.",
                )
        if s > 1 and close(out, values.mean(0)):
            fail(
                "every value has the same weight: your output is the plain mean of "
                "the values",
                "the weights must depend on how well each key matches the query.",
            )
        if close(out, scores / math.sqrt(d) @ values):
            fail(
                "your weights are the scaled scores themselves: there is no softmax, "
                "so they neither are positive nor sum to 1",
                "turn the scores into weights that are positive and sum to 1.",
            )
        check_close(out, ref, atol=1e-5, name="output")
    return passed("soft lookup matches the reference, with and without missing entries")


def _missing_entries(out: Tensor, scores: Tensor, values: Tensor, valid: Tensor):
    """Name the mistakes about ``valid`` (2 of the 6 entries missing)."""
    if close(out, torch.softmax(scores, 0) @ values):
        fail(
            "the missing entries were mixed in: valid is ignored",
            "a missing entry must get weight 0, and the others share all the weight.",
        )
    if close(out, torch.softmax(scores[~valid], 0) @ values[~valid]):
        fail(
            "only the missing entries were mixed: valid is read the wrong way round",
            "True in valid marks an entry that is there.",
        )
    if close(out, (torch.softmax(scores, 0) * valid) @ values):
        fail(
            "the missing entries' weights were set to 0 after the softmax: the "
            "remaining weights no longer sum to 1",
            "leave the missing entries out before normalising, not after.",
        )
    if close(out, torch.softmax(scores.masked_fill(~valid, 0.0), 0) @ values):
        fail(
            "the missing entries' scores were set to 0 (filled with 0, or multiplied "
            "by valid), not -inf: exp(0) = 1, so they still get weight",
            "a score of -inf is the one whose exp is exactly 0.",
        )


@exercise_check
@forbids(scaled_dot_product_attention)
def check_dot_product_attention(
    fn: Callable[..., tuple[Tensor, Tensor]], *, with_valid: bool = False
) -> bool:
    """Chapter 1, exercises "batched attention" and "find the bug": ``fn(q, k, v)``
    with q (B, T, d), k (B, S, d), v (B, S, d_v) must return ``(out, weights)``: out
    (B, T, d_v) and weights (B, T, S) = softmax(q k^T / sqrt(d)) over the keys. With
    ``with_valid``, ``fn(q, k, v, valid)`` also takes a bool valid (B, S) (False = a
    missing key, weight 0; every item has at least one valid key).

    Raises:
        CheckError: naming a wrong shape, ``(weights, out)`` returned in the wrong
            order, a softmax over the wrong axis, a missing scale, batch items that
            leak into each other, ``valid`` ignored, inverted or applied after the
            softmax, a loop over the batch, a call to the library's attention, or the
            first wrong value.
    """
    gen = torch.Generator().manual_seed(2)
    if with_valid:
        _check_valid_keys(fn, gen)
        full = fn

        def fn(q, k, v):  # every key valid: the checks below apply as they are
            return full(q, k, v, torch.ones(q.shape[0], k.shape[1], dtype=torch.bool))

    for b, t, s, d, dv in ((2, 3, 4, 8, 5), (1, 1, 6, 4, 2), (3, 5, 2, 16, 4)):
        q, k, v = random_qkv(gen, (b,), t, s, d, dv)
        out, weights = out_and_weights(fn(q, k, v))
        _diagnose_order_and_axis(out, weights, (b, t, s, dv))
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
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
    one = random_qkv(gen, (1,), 3, 4, 8, 5)
    four = random_qkv(gen, (4,), 3, 4, 8, 5)
    if loops_over(fn, one, four):
        fail(
            "your function runs more operations for a batch of 4 than for a batch of "
            "1: it loops over the batch, which the exercise asks you not to do",
            "matrix products broadcast over leading axes: one q @ k^T handles every "
            "batch item at once.",
        )
    if with_valid:
        return passed(
            "batched dot-product attention matches the reference on 3 random "
            "inputs, and with missing keys"
        )
    return passed(
        "batched dot-product attention matches the reference on 3 random inputs"
    )


def _diagnose_order_and_axis(out, weights, sizes, valid=None) -> None:
    """The cheap properties first (learner trial 2026-12-03, finding 3a): the pair
    returned in the wrong order, the shapes, and a softmax over the query axis, also
    with missing keys (whose columns are then NaN), before any value is compared."""
    b, t, s, dv = sizes
    if (
        isinstance(out, Tensor)
        and isinstance(weights, Tensor)
        and out.shape == (b, t, s)
        and weights.shape == (b, t, dv)
        and s != dv
    ):
        fail(
            "the pair is swapped: the first tensor has the weights' shape "
            "{weights_shape} and the second the output's {out_shape}",
            "the check unpacks `out, weights = fn(q, k, v)`: return them in that "
            "order.",
            kind=ShapeError,
            weights_shape=(b, t, s),
            out_shape=(b, t, dv),
        )
    check_shape(weights, (b, t, s), "weights")
    check_shape(out, (b, t, dv), "out")
    w = weights.detach()
    keys = torch.ones(b, s) if valid is None else valid.to(w.dtype)
    rows_ok = torch.allclose(torch.nan_to_num(w).sum(-1), torch.ones(b, t), atol=1e-5)
    if not rows_ok:
        columns = torch.nan_to_num(w, nan=0.0).sum(-2)
        if t > 1 and torch.allclose(columns, keys, atol=1e-5):
            fail(
                "each column of weights sums to 1: the softmax ran over the query "
                "axis (dim=-2)",
                "normalise over the keys, the last axis.",
            )
        if valid is None:
            fail(
                "the weights of a query do not sum to 1 over the keys",
                "apply softmax over the last dimension (the keys).",
            )


def _check_valid_keys(fn: Callable, gen: torch.Generator) -> None:
    q, k, v = random_qkv(gen, (3,), 2, 5, 8, 4)
    valid = torch.tensor(
        [[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool
    )
    out, weights = out_and_weights(fn(q, k, v, valid.clone()))
    _diagnose_order_and_axis(out, weights, (3, 2, 5, 4), valid)
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, valid[:, None, :])
    if close(weights, ref_w):
        plain_w = scaled_dot_product_attention(q, k, v)[1]
        if close(out, plain_w @ v) and not close(out, ref_out):
            fail(
                "the weights are right, but out was computed from the weights before "
                "the missing keys were hidden: their values are still mixed in",
                "out = weights @ v with the masked weights you return.",
            )
        check_close(out, ref_out, atol=1e-5, name="out")
        return
    plain = scaled_dot_product_attention(q, k, v)[1]
    scaled = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    for wrong, message, hint in (
        (
            plain,
            N_("the missing keys got weights: valid is ignored"),
            N_("a missing key must get weight 0, and the others share all the weight."),
        ),
        (
            scaled_dot_product_attention(q, k, v, ~valid[:, None, :])[1],
            N_("only the missing keys got weights: valid is read the wrong way round"),
            N_("True in valid marks a key that is there."),
        ),
        (
            torch.softmax(
                (q @ k.transpose(-2, -1)).masked_fill(~valid[:, None, :], -math.inf), -1
            ),
            "your weights are softmax(q k^T) without the 1/sqrt(d) scale",
            "divide the scores by sqrt(d_k) before the softmax.",
        ),
        (
            plain * valid[:, None, :],
            N_(
                "the missing keys' weights were set to 0 after the softmax: the "
                "remaining weights no longer sum to 1"
            ),
            N_("leave the missing keys out before normalising, not after."),
        ),
        (
            torch.softmax(scaled.masked_fill(~valid[:, None, :], 0.0), -1),
            N_(
                "the missing keys' scores were set to 0 (filled with 0, or multiplied "
                "by valid), not -inf: exp(0) = 1, so they still get weight"
            ),
            N_("a score of -inf is the one whose exp is exactly 0."),
        ),
    ):
        if close(weights, wrong):
            fail(message, hint)
    check_close(weights, ref_w, atol=1e-5, name=gettext("weights (with missing keys)"))


@exercise_check
@forbids(additive_attention)
def check_encoder_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 1, exercise "attention over the encoder states": ``fn(dec, memory, w_q,
    w_k, w_score)`` with decoder states dec (B, T, H), encoder states memory (B, S, H),
    w_q and w_k (A, H), w_score (A,) must return ``(context, weights)``, (B, T, H) and
    (B, T, S): additive attention with the encoder states as keys and values
    (``additive.additive_attention``; Bahdanau et al. 2015, section 3.1).

    Raises:
        CheckError: with a hint for the usual mistakes: the softmax over the decoder
            steps instead of the encoder states, a missing tanh, only the last encoder
            state (the fixed-size bottleneck), wrong shapes, or a call to the
            library's ``additive_attention``.
    """
    gen = torch.Generator().manual_seed(19)
    for b, t, s, h, a in ((2, 3, 5, 4, 6), (1, 4, 7, 8, 3), (3, 1, 7, 5, 2)):
        dec = torch.randn(b, t, h, generator=gen)
        memory = torch.randn(b, s, h, generator=gen)
        w_q = torch.randn(a, h, generator=gen)
        w_k = torch.randn(a, h, generator=gen)
        w_score = torch.randn(a, generator=gen)
        result = fn(dec, memory, w_q, w_k, w_score)
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(
                "expected a tuple (context, weights)",
                "return the weighted sum of the encoder states and the weights.",
                kind=ShapeError,
            )
        context, weights = result
        check_shape(weights, (b, t, s), "weights")
        check_shape(context, (b, t, h), "context")
        want, want_w = additive_attention(dec, memory, memory, w_q, w_k, w_score)
        if torch.allclose(weights, want_w, atol=1e-5):
            check_close(context, want, atol=1e-5, name="context")
            continue
        # (B, T, 1, A) + (B, 1, S, A) -> (B, T, S, A)
        features = (dec @ w_q.T).unsqueeze(-2) + (memory @ w_k.T).unsqueeze(-3)
        wrong_axis = (features.tanh() @ w_score).softmax(1)
        if t > 1 and torch.allclose(weights, wrong_axis, atol=1e-5):
            fail(
                "your weights sum to 1 over the decoder steps, not over the encoder "
                "states",
                "which axis of the scores holds the keys?",
            )
        if torch.allclose(weights, (features @ w_score).softmax(-1), atol=1e-5):
            fail(
                "your scores miss the tanh",
                "compare your score with equation (6) of Bahdanau et al.",
            )
        if torch.allclose(context, memory[:, -1:].expand(b, t, h), atol=1e-5):
            fail(
                "your context is the last encoder state for every step: that is the "
                "fixed-size bottleneck attention removes",
                "every encoder state should contribute, by its weight.",
            )
        check_close(weights, want_w, atol=1e-5, name="weights")
    return passed(
        "attention over the encoder states matches additive_attention on 3 random inputs"
    )
