"""Chapter 7, making attention fast: online softmax, streaming, repeat_kv, int8."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.attention import repeat_kv
from transformer_course.exercises import pitfalls
from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    check_close,
    check_shape,
    close,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import (
    forbids,
    loops_over,
    torch_calls,
    whole_row_reductions,
)
from transformer_course.flash import online_softmax, tiled_attention
from transformer_course.quantize import quantize_int8


def _read_at_once(calls: list, block: int, size: int) -> None:
    """Fail when the call reduced over more than one block of the ``size`` scores."""
    names = whole_row_reductions(calls, block)
    if names:
        fail(
            "with block={block} your function calls {function}() on more than "
            "{block} entries at once: it reads all {size} scores together, "
            "which the exercise asks you not to do",
            "keep only a running maximum m and a running sum l, and update both "
            "from one block of scores at a time.",
            block=block,
            function=names[0],
            size=size,
        )


def _stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """(m, l) of each row of x (T, S): the maximum and sum_j exp(x_j - m); a row that
    is all -inf has m = -inf and l = 0."""
    m = x.amax(-1)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return m, torch.exp(x - shift[:, None]).sum(-1)


@exercise_check
@forbids(online_softmax)
def check_online_softmax(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 7, exercise "merging two halves of a row" (FlashDecoding's split of the
    keys): ``fn(m_a, l_a, m_b, l_b)`` with the running maxima and sums (T,) of two
    halves of T rows of scores must return ``(m, l)`` (T,) of the whole rows: m =
    max(m_a, m_b), l = l_a exp(m_a - m) + l_b exp(m_b - m), without NaN when a half
    (or a whole row) is all -inf (m = -inf, l = 0), and without overflow for scores
    around 1000.

    Raises:
        CheckError: naming sums added without rescaling, a rescale with the wrong
            sign, NaN from a half that is all -inf, overflow, a wrong maximum, a call
            to the library's ``online_softmax``, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(7)
    inf = float("-inf")
    x = torch.randn(5, 12, generator=gen) * 3
    x[1, :6] = inf  # row 1: its first half is all masked
    x[2, 6:] = inf  # row 2: its second half
    x[3] = inf  # row 3: the whole row
    x[4] = x[4] * 10 + 1000.0  # row 4: large scores
    (m_a, l_a), (m_b, l_b) = _stats(x[:, :6]), _stats(x[:, 6:])
    want_m, want_l = _stats(x)
    result = fn(m_a.clone(), l_a.clone(), m_b.clone(), l_b.clone())
    if not (isinstance(result, tuple) and len(result) == 2):
        fail(
            "expected fn to return a tuple (m, l)",
            "return the maximum and the sum of the whole rows.",
            kind=ShapeError,
        )
    m, l = result
    check_shape(m, (5,), "m")
    check_shape(l, (5,), "l")
    if not torch.equal(m, want_m):
        fail(
            "m = {m}, expected {want_m}",
            "the row's maximum is over all its scores, so over both halves.",
            m=m.tolist(),
            want_m=want_m.tolist(),
        )
    rows = torch.tensor([0, 4])  # both halves visible, no -inf: the cheap cases first
    if close(l[rows], (l_a + l_b)[rows]):
        fail(
            "l = l_a + l_b: the two sums were added without rescaling them to the "
            "common maximum",
            "each half's sum is relative to its own maximum: rescale both to m before "
            "adding.",
        )
    reversed_ = l_a * torch.exp(want_m - m_a) + l_b * torch.exp(want_m - m_b)
    if close(l[rows], reversed_[rows], atol=1e-3):
        fail(
            "your factors are exp(m - m_a) and exp(m - m_b): the exponents are "
            "reversed, so a half with a smaller maximum weighs more, not less",
            "rescaling to a larger maximum shrinks a sum: each factor is at most 1.",
        )
    if not torch.isfinite(l[4]):
        fail(
            "l is {value} for row 4, whose scores are around 1000 and have no -inf: "
            "a number such as exp(m_a) or exp(m) overflowed float32 (exp(89) is "
            "already inf)",
            "never exponentiate a maximum itself: only differences to the common "
            "maximum, exp(m_a - m) and exp(m_b - m), which are at most 1.",
            value=l[4].item(),
        )
    if torch.isinf(l).any():
        fail(
            "l overflows for the row of scores around 1000",
            "the factors exp(m_a - m) and exp(m_b - m) are at most 1: which way round "
            "are your exponents?",
        )
    if torch.isnan(l[3]):
        fail(
            "l is NaN for row 3, which is all -inf: exp(m_a - m) with m_a = m = -inf "
            "is exp(-inf + inf)",
            "a half with l = 0 adds nothing, whatever its factor: guard the factor "
            "where m is -inf.",
        )
    if torch.isnan(l).any():
        row = int(torch.nonzero(torch.isnan(l))[0])
        fail(
            "l is NaN for row {row}, one of whose halves is all -inf (its m is -inf "
            "and its l is 0) while the row's m is finite: the right factor of that "
            "half, exp(-inf - m), is exactly 0, so the NaN comes from another term, "
            "such as 0 * exp(+inf) or -inf - (-inf)",
            "print each term of the merge for that row: m_a, l_a, m_b, l_b, m and "
            "the two factors.",
            row=row,
        )
    check_close(l, want_l, rtol=1e-5, name="l")
    return passed(
        "merged (m, l) match the whole rows, masked halves and large scores included"
    )


def _attend(q, k, v, keep, scale=True):
    """softmax over the kept keys of k q (/ sqrt(d) if ``scale``) times v, (d_v,);
    zeros when no key is kept."""
    if not keep.any():
        return torch.zeros(v.shape[1])
    s = k @ q / (math.sqrt(q.shape[0]) if scale else 1.0)
    return torch.softmax(s.masked_fill(~keep, -math.inf), 0) @ v


def _keep(pattern: str) -> Tensor:
    """A key padding mask (S,) from a string: "1" = kept, "0" = masked."""
    return torch.tensor([c == "1" for c in pattern])


# (S, d, d_v, block, keep): first the inputs whose first block holds a kept key (the
# buggy code of the exercise is right on them), then a first block that is all masked,
# then no kept key at all; blocks that do not divide S, and one longer than S
_STREAMING_CASES = (
    (12, 8, 5, 4, "111111111111"),
    (7, 4, 3, 3, "1010001"),
    (5, 16, 2, 8, "11011"),
    (10, 8, 4, 4, "0000101101"),
    (9, 4, 3, 2, "000001011"),
    (6, 4, 3, 4, "000000"),
)


@exercise_check
@forbids(tiled_attention, online_softmax)
def check_streaming_attention(fn: Callable[..., Tensor]) -> bool:
    """Chapter 7, exercise "find the bug" (one query, streamed with the online softmax
    of Milakov and Gimelshein 2018, as FlashAttention, Dao et al. 2022, streams keys):
    ``fn(q, k, v, keep, block)`` with q (d,), k (S, d), v (S, d_v) and a key padding
    mask keep (S,) bool (True = attend) must return softmax over the kept keys of
    k q / sqrt(d), times v: (d_v,), reading k and v ``block`` rows at a time, for any
    block (one that does not divide S included); a query with no kept key gets zeros.

    Raises:
        CheckError: naming NaN from a first block that is all masked (the exercise's
            bug), NaN or an average of the values where no key is kept, an unrescaled
            output accumulator, a rescale factor that overflows, a mask that is
            ignored or inverted, scores without 1/sqrt(d), an average of per-block
            attentions, a softmax or maximum over all the scores at once, a call to
            the library's tiled attention, a wrong shape, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(8)
    for s, d, dv, block, pattern in _STREAMING_CASES:
        q = torch.randn(d, generator=gen) * 2
        k = torch.randn(s, d, generator=gen) * 2
        v = torch.randn(s, dv, generator=gen)
        keep = _keep(pattern)
        out, calls = torch_calls(fn, q, k, v, keep.clone(), block)
        check_shape(out, (dv,), "output")
        _read_at_once(calls, block, s)
        if not keep.any():
            _check_no_key_kept(out, v)
            continue
        if torch.isnan(out).any() and not keep[:block].any():
            fail(
                "the output is NaN for keep = {keep} with block = {block}: the first "
                "block is all masked, so before any kept key m = m_new = -inf, and "
                "exp(m - m_new) is exp(-inf + inf)",
                "a block of masked keys adds nothing, whatever its shift: guard the "
                "shift while the running maximum is still -inf.",
                keep=pattern,
                block=block,
            )
        ref = _attend(q, k, v, keep)
        if not close(out, ref):
            _name_streaming_mistake(out, q, k, v, keep, block, pattern)
        check_close(
            out,
            ref,
            atol=1e-5,
            name="output",
            nan_hint="a rescale factor overflowed: when the maximum grows from m to "
            "m_new the old terms shrink, so their factor is at most 1. Which way round "
            "is your exponent?",
        )
    return passed(
        "streaming attention equals softmax over the kept keys for 6 inputs, a "
        "first block that is all masked and a query with no kept key (zeros) included"
    )


def _name_streaming_mistake(out, q, k, v, keep, block, pattern) -> None:
    """Fail with the mistake an output other than the right one matches, if any."""
    s, d = k.shape
    if close(out, pitfalls.streaming_attention_no_output_rescale(q, k, v, keep, block)):
        fail(
            "the partial output is not rescaled when the running maximum grows",
            "acc holds sum exp(s_j - m) v_j for the OLD m: multiply it by "
            "exp(m - m_new), exactly like the running sum l.",
        )
    if not keep.all() and close(out, _attend(q, k, v, torch.ones_like(keep))):
        fail(
            "the mask had no effect: your output attends to all {size} keys, "
            "the masked ones of keep = {keep} included",
            "a key where keep is False must add nothing to m, l or acc.",
            size=s,
            keep=pattern,
        )
    if close(out, _attend(q, k, v, ~keep)):
        fail(
            "the mask is inverted: your output attends to the keys where keep "
            "is False (keep = {keep})",
            "here True means 'may attend', the opposite of nn.MultiheadAttention.",
            keep=pattern,
        )
    if close(out, _attend(q, k, v, keep, scale=False)):
        fail(
            "your output is softmax(k q) v: the scores miss the 1/sqrt(d) scale",
            "the buggy code scales the scores; keep that line as it is.",
        )
    if keep.any() and close(out, torch.zeros_like(out)):
        fail(
            "the output is zeros for keep = {keep} with block = {block}, which keeps "
            "some keys: the loop stopped at a block with no kept key (break instead "
            "of skipping it), or that block's NaN reached the output and was "
            "replaced only at the end",
            "a block with no kept key adds nothing: skip it (continue), or guard "
            "its shift inside the loop, so the later blocks still count.",
            keep=pattern,
            block=block,
        )
    whole = s - s % block
    dropped = bool(s % block) and keep[:whole].any()
    dropped = dropped and close(out, _attend(q, k[:whole], v[:whole], keep[:whole]))
    empty = [j for j in range(0, s, block) if not keep[j : j + block].any()]
    stopped = bool(empty) and keep[: empty[0]].any()
    if stopped:
        before = keep.clone()
        before[empty[0] :] = False  # the keys a loop that breaks there has seen
        stopped = close(out, _attend(q, k, v, before))
    if stopped and dropped:
        fail(
            "your output attends only to the keys before position {at} (keep = "
            "{keep}, block = {block}): the loop stopped at a block with no kept key "
            "(break instead of skipping it), or it dropped the last, shorter block",
            "skip a block with no kept key (continue), and let range(0, S, block) "
            "reach the last, shorter block.",
            at=empty[0],
            keep=pattern,
            block=block,
        )
    if stopped:
        fail(
            "your output attends only to the keys before position {at} (keep = "
            "{keep}, block = {block}): the loop stopped at the first block with "
            "no kept key (break instead of skipping it)",
            "a block with no kept key adds nothing: skip it (continue), so the "
            "later blocks still count.",
            at=empty[0],
            keep=pattern,
            block=block,
        )
    if dropped:
        fail(
            "the last {rest} key(s) are missing: with S = {s} and block = {block} the "
            "last block is shorter, and your loop drops it",
            "range(0, S, block) reaches the last, shorter block; slicing "
            "[j : j + block] stops at S by itself.",
            rest=s % block,
            s=s,
            block=block,
        )
    scores = k @ q / math.sqrt(d)
    if not keep.all():
        zeroed = torch.softmax(scores.masked_fill(~keep, 0.0), 0) @ v
        if close(out, zeroed):
            fail(
                "the masked scores were set to 0, not -inf (keep = {keep}): exp(0 - m) "
                "is not 0, so masked keys still get weight",
                "a masked key's score must be -inf, the one value whose exp is 0.",
                keep=pattern,
            )
        if close(out, torch.softmax(scores, 0) @ (v * keep[:, None])):
            fail(
                "the masked keys' values were zeroed, but their scores still count in "
                "the softmax's sum l (keep = {keep}), so the kept keys' weights sum "
                "to less than 1",
                "mask the scores (-inf) before the running maximum and sum, not the "
                "values.",
                keep=pattern,
            )
    per_block = [
        torch.softmax(k[j : j + block] @ q / math.sqrt(d), 0) @ v[j : j + block]
        for j in range(0, s, block)
    ]
    if block < s and keep.all() and close(out, torch.stack(per_block).mean(0)):
        fail(
            "your output is the average of each block's own attention: blocks "
            "with few or weak keys weigh as much as the others",
            "one softmax runs over all S keys: carry the running maximum, sum "
            "and output across blocks instead of finishing each block apart.",
        )


def _check_no_key_kept(out: Tensor, v: Tensor) -> None:
    """A query whose keys are all masked: the exercise asks for zeros (d_v,)."""
    if torch.isnan(out).any():
        fail(
            "the output is NaN for a query whose keys are all masked: l = 0 there, "
            "so acc / l is 0 / 0",
            "the exercise asks for zeros when no key is kept, as the code given "
            "returns: never divide by l = 0.",
        )
    if close(out, v.mean(0)):
        fail(
            "a query whose keys are all masked gets the average of the values, "
            "expected zeros: a large finite fill such as -1e9 gives every masked key "
            "the same weight (pitfall P6)",
            "with -inf a masked key adds exactly 0, so l stays 0 when no key is kept.",
        )
    check_close(
        out,
        torch.zeros_like(out),
        name=gettext("output with no kept key"),
        hint="a query whose keys are all masked gets zeros (d_v,).",
    )


@exercise_check
@forbids(repeat_kv)
def check_repeat_kv(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 7, exercise "repeat_kv": ``fn(x, n_rep)`` with x (B, H_kv, S, d) must
    return (B, H_kv * n_rep, S, d) where head h is x's head h // n_rep (each key/value
    head serves n_rep consecutive query heads).

    Raises:
        CheckError: naming a wrong shape, heads tiled in the wrong order, a loop
            over the heads, or a call to the library's ``repeat_kv``.
    """
    gen = torch.Generator().manual_seed(9)
    for shape, n_rep in (((2, 3, 5, 4), 2), ((1, 2, 3, 8), 4), ((2, 4, 1, 2), 1)):
        x = torch.randn(*shape, generator=gen)
        out = fn(x, n_rep)
        b, h_kv, s, d = shape
        check_shape(out, (b, h_kv * n_rep, s, d), "output")
        if n_rep > 1 and torch.equal(out, x.repeat(1, n_rep, 1, 1)):
            fail(
                "the whole stack of heads is tiled (head h gets head h % H_kv)",
                "query heads 0..n_rep-1 share key/value head 0: each head must be "
                "repeated n_rep times in a row, not the whole stack.",
            )
        check_close(
            out, x.repeat_interleave(n_rep, dim=1), atol=0, rtol=0, name="output"
        )
    one = torch.randn(2, 1, 3, 4, generator=gen)
    four = torch.randn(2, 4, 3, 4, generator=gen)
    if loops_over(fn, (one, 2), (four, 2)):
        fail(
            "your function runs more operations for 4 key/value heads than for 1: it "
            "loops over the heads, which the exercise asks you not to do",
            "add an axis for the copies next to the heads, expand it, then merge the "
            "two axes.",
        )
    return passed("repeat_kv gives head h the key/value head h // n_rep")


@exercise_check
@forbids(quantize_int8)
def check_quantize_int8(fn: Callable[[Tensor, int], tuple[Tensor, Tensor]]) -> bool:
    """Chapter 7, exercise "int8 in groups": ``fn(weight, group)`` with weight
    (d_out, d_in), d_in a multiple of group, must return ``(w_int8, scale)``: int8
    (d_out, d_in) and scale (d_out, d_in // group), one symmetric scale per group of
    ``group`` consecutive weights of a row = max |group| / 127, values rounded to
    nearest, so that every weight is within half its group's step of its code times
    that step (the blocks of llama.cpp's formats, chapter 10; group = d_in is the
    per-row int8 of the chapter).

    Raises:
        CheckError: naming a wrong dtype or shape (one scale per row where groups are
            asked for, a 1-D scale), one scale for the whole matrix, truncation instead
            of rounding, codes that wrapped around, a call to the library's
            ``quantize_int8``, or an error larger than half a step.
    """
    gen = torch.Generator().manual_seed(10)
    rows = torch.logspace(-2, 1, 6)[:, None]  # rows of very different sizes ...
    cols = torch.logspace(-1, 1, 4).repeat_interleave(8)  # ... and groups within a row
    w = torch.randn(6, 32, generator=gen) * rows * cols
    for group in (8, 32, 4):
        _check_groups_once(fn, w, group)
    return passed("int8 in groups: one scale per group, error within half a step")


def _check_groups_once(fn, w: Tensor, group: int) -> None:
    d_out, d_in = w.shape
    n_groups = d_in // group
    result = fn(w.clone(), group)
    if not (isinstance(result, tuple) and len(result) == 2):
        fail(
            "expected fn to return a tuple (w_int8, scale)",
            "return both the int8 weights and the scales.",
            kind=ShapeError,
        )
    w_int8, scale = result
    check_shape(w_int8, (d_out, d_in), "w_int8")
    if w_int8.dtype != torch.int8:
        fail(
            "w_int8 has dtype {w_int8_dtype}, expected torch.int8",
            "the last step converts to the 8-bit integer type.",
            kind=ShapeError,
            w_int8_dtype=w_int8.dtype,
        )
    if not isinstance(scale, Tensor) or tuple(scale.shape) != (d_out, n_groups):
        got = tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__
        per_row = n_groups > 1 and got == (d_out, 1)
        fail(
            N_(
                "group = {group}: scale has shape {got}, expected {want}: one scale "
                "per row, so the groups were ignored"
            )
            if per_row
            else N_(
                "group = {group}: scale has shape {got}, expected {want}: one per "
                "group of {group} weights in each of the {d_out} rows"
            ),
            "view each row as (d_in // group, group) and reduce over the last axis "
            "only.",
            kind=ShapeError,
            group=group,
            got=got,
            want=(d_out, n_groups),
            d_out=d_out,
        )
    scale = scale.float()
    if torch.allclose(scale, scale.flatten()[0].expand_as(scale)):
        fail(
            "every group has the same scale: that is per-tensor quantization",
            "small groups then round to 0; take the maximum of each group.",
        )
    grouped = w.reshape(d_out, n_groups, group)
    row_max = w.abs().amax(-1, keepdim=True).expand(d_out, n_groups)
    for wrong, message, hint in (
        (
            w.reshape(d_out, group, n_groups).abs().amax(1) / 127,
            N_(
                "group = {group}: your groups are strided: group j holds every "
                "{n}-th weight of a row (reshape(d_out, group, n)), not {group} "
                "consecutive ones"
            ),
            N_(
                "a group is a run of consecutive weights: reshape each row as "
                "(d_in // group, group)."
            ),
        ),
        (
            row_max / 127,
            N_(
                "group = {group}: every group of a row has the row's scale: the "
                "maximum was taken over the whole row, then repeated"
            ),
            N_("take the maximum of each group of {group} weights on its own."),
        ),
        (
            grouped.amax(-1) / 127,
            N_("group = {group}: the scale is max(w) / 127, not max(|w|) / 127"),
            N_(
                "a symmetric scale must cover the most negative weight too: take the "
                "maximum of the absolute values."
            ),
        ),
        (
            grouped.abs().mean(-1) / 127,
            N_("group = {group}: the scale is the mean |w| / 127, not the max"),
            N_(
                "the largest |w| of a group must still fit in a code: the scale "
                "comes from the maximum."
            ),
        ),
    ):
        right = grouped.abs().amax(-1) / 127
        if torch.allclose(scale, wrong, rtol=1e-4, atol=0.0) and not torch.allclose(
            wrong, right, rtol=1e-4
        ):  # where a mistake gives the right scale (one group a row), it is not one
            fail(message, hint, group=group, n=n_groups)
    step = scale.repeat_interleave(group, dim=1)  # (d_out, d_in): each weight's step
    err = (w_int8.float() * step - w).abs()
    if (err > step / 2 + 1e-6).any():
        if ((w_int8.float() * w < 0) & (w.abs() > step)).any():
            fail(
                "some codes have the opposite sign of their weight: they wrapped "
                "around, because a value outside -128..127 was converted to int8",
                "which integer does the largest |w| of a group become, and does it "
                "fit in int8?",
            )
        if (err < step + 1e-6).all():
            fail(
                "errors reach a whole step (scale): the values were truncated",
                "converting to int8 rounds toward zero: round to nearest first.",
            )
        fail(
            "group = {group}: max |w_int8 * scale - w| = {err:.3g} exceeds half a step",
            "the step of a group is its scale: every weight must land within half a "
            "step of a code.",
            group=group,
            err=err.max(),
        )
    want = w.reshape(d_out, n_groups, group).abs().amax(-1) / 127
    check_close(
        scale,
        want,
        rtol=1e-4,
        name=gettext("scale (group = {group})").format(group=group),
    )
