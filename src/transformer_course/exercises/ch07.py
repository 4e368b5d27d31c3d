"""Chapter 7, making attention fast: online softmax, streaming, repeat_kv, int8."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.attention import repeat_kv
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
from transformer_course.exercises._method import (
    loops_over,
    own_code,
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
            f"with block={block} your function calls {names[0]}() on more than "
            f"{block} entries at once: it reads all {size} scores together, which the "
            "exercise asks you not to do",
            "keep only a running maximum m and a running sum l, and update both "
            "from one block of scores at a time.",
        )


def _softmax_never_corrected(x: Tensor, block: int) -> Tensor:
    """Each block exponentiated against the running maximum at its time, the sum
    rescaled correctly: the early weights are too large."""
    m, l, parts = float("-inf"), 0.0, []
    for j in range(0, len(x), block):
        m_new = max(m, x[j : j + block].max().item())
        l = l * math.exp(m - m_new) + torch.exp(x[j : j + block] - m_new).sum().item()
        parts.append(torch.exp(x[j : j + block] - m_new))
        m = m_new
    return torch.cat(parts) / l


def _softmax_no_rescale(x: Tensor, block: int) -> Tensor:
    """The classic online-softmax bug: the running sum is not rescaled when the
    running maximum grows."""
    m, l = float("-inf"), 0.0
    for j in range(0, len(x), block):
        m = max(m, x[j : j + block].max().item())
        l = l + torch.exp(x[j : j + block] - m).sum().item()
    return torch.exp(x - m) / l


@exercise_check
def check_online_softmax(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 7, exercise "online softmax": ``fn(scores, block)`` reads one row of
    scores (S,) ``block`` entries at a time, keeping a running maximum and a running
    sum, and returns softmax(scores) (S,). Entries equal to -inf (masked keys) get
    weight 0; a row that is all -inf gives zeros; scores around 1000 must not overflow.

    Raises:
        CheckError: naming a missing rescale of the running sum, overflow, NaN from a
            block that is all -inf, a softmax or maximum over the whole row at once,
            a call to the library's ``online_softmax``, or the first wrong value.
    """
    fn = own_code(fn, online_softmax)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(10, generator=gen) * 3
    for block in (1, 3, 10, 16):
        w, calls = torch_calls(fn, x.clone(), block)
        check_shape(w, (10,), "weights")
        _read_at_once(calls, block, len(x))
        ref = torch.softmax(x, 0)
        buggy = _softmax_no_rescale(x, block)
        if not torch.allclose(w, ref, atol=1e-5) and torch.allclose(
            w, buggy, atol=1e-5
        ):
            fail(
                f"with block={block} your weights do not sum to 1: the running sum "
                "was not rescaled when the running maximum grew",
                "when a block raises the maximum from m to m_new, multiply the sum so "
                "far by exp(m - m_new) before adding the new block's exp(x - m_new).",
            )
        if block < len(x) and close(w, _softmax_never_corrected(x, block)):
            fail(
                f"with block={block} each block's weights use the running maximum of "
                "their own time, never corrected when a later block raised it",
                "the weights are computed once, at the end, from the final maximum "
                "and the final sum.",
            )
        check_close(w, ref, name=f"weights (block={block})")
    big = x * 10 + 1000.0
    w = fn(big, 4)
    if not torch.isfinite(w).all():
        fail(
            "scores around 1000 give NaN or inf: exp() overflowed",
            "exponentiate x - m (m the running maximum), never x itself.",
        )
    check_close(w, torch.softmax(big, 0), name="weights for large scores")
    inf = float("-inf")
    masked = torch.tensor([inf, inf, 1.0, inf, 2.0, 0.5])
    w = fn(masked, 2)
    if torch.isnan(w).any():
        fail(
            "a first block whose scores are all -inf gives NaN",
            "while the maximum is still -inf, exp(-inf - (-inf)) is NaN: skip such "
            "a block (nothing is visible yet) or treat m = -inf as 0.",
        )
    check_close(w, torch.softmax(masked, 0), name="weights with -inf entries")
    w = fn(torch.full((4,), inf), 2)
    if torch.isnan(w).any() or (w != 0).any():
        fail(
            f"a row that is all -inf gives {w.tolist()}, expected zeros",
            "if the running sum is 0 at the end, return zeros (no key is visible).",
        )
    return passed(
        "online softmax matches torch.softmax for every block size, "
        "large scores and masked entries"
    )


def _stream_no_output_rescale(q, k, v, block):
    m, l, acc = float("-inf"), 0.0, torch.zeros(v.shape[-1])
    s = k @ q / math.sqrt(q.shape[-1])
    for j in range(0, len(s), block):
        m_new = max(m, s[j : j + block].max().item())
        p = torch.exp(s[j : j + block] - m_new)
        l = l * math.exp(m - m_new) + p.sum().item()
        acc = acc + p @ v[j : j + block]  # bug: acc not rescaled
        m = m_new
    return acc / l


@exercise_check
def check_streaming_attention(fn: Callable[..., Tensor]) -> bool:
    """Chapter 7, exercise "find the bug" (one query, FlashAttention-style):
    ``fn(q, k, v, block)`` with q (d,), k (S, d), v (S, d_v) must return
    softmax(k q / sqrt(d)) v, (d_v,), reading k and v ``block`` rows at a time.

    Raises:
        CheckError: naming an unrescaled output accumulator, a rescale factor that
            overflows, a softmax or maximum over all the scores at once, a call to the
            library's tiled attention, a wrong shape, or the first wrong value.
    """
    fn = own_code(fn, tiled_attention, online_softmax)
    gen = torch.Generator().manual_seed(8)
    for s, d, dv, block in ((12, 8, 5, 4), (7, 4, 3, 3), (5, 16, 2, 8)):
        q = torch.randn(d, generator=gen) * 2
        k = torch.randn(s, d, generator=gen) * 2
        v = torch.randn(s, dv, generator=gen)
        out, calls = torch_calls(fn, q, k, v, block)
        check_shape(out, (dv,), "output")
        _read_at_once(calls, block, s)
        ref = torch.softmax(k @ q / math.sqrt(d), 0) @ v
        buggy = _stream_no_output_rescale(q, k, v, block)
        if not torch.allclose(out, ref, atol=1e-5) and torch.allclose(
            out, buggy, atol=1e-5
        ):
            fail(
                "the partial output is not rescaled when the running maximum grows",
                "acc holds sum exp(s_j - m) v_j for the OLD m: multiply it by "
                "exp(m - m_new), exactly like the running sum l.",
            )
        if close(out, torch.softmax(k @ q, 0) @ v):
            fail(
                "your output is softmax(k q) v: the scores miss the 1/sqrt(d) scale",
                "the buggy code scales the scores; keep that line as it is.",
            )
        per_block = [
            torch.softmax(k[j : j + block] @ q / math.sqrt(d), 0) @ v[j : j + block]
            for j in range(0, s, block)
        ]
        if block < s and close(out, torch.stack(per_block).mean(0)):
            fail(
                "your output is the average of each block's own attention: blocks "
                "with few or weak keys weigh as much as the others",
                "one softmax runs over all S keys: carry the running maximum, sum "
                "and output across blocks instead of finishing each block apart.",
            )
        check_close(
            out,
            ref,
            atol=1e-5,
            name="output",
            nan_hint="a rescale factor overflowed: when the maximum grows from m to "
            "m_new the old terms shrink, so their factor is at most 1. Which way round "
            "is your exponent?",
        )
    return passed("streaming attention equals softmax(k q / sqrt(d)) v for 3 inputs")


@exercise_check
def check_repeat_kv(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 7, exercise "repeat_kv": ``fn(x, n_rep)`` with x (B, H_kv, S, d) must
    return (B, H_kv * n_rep, S, d) where head h is x's head h // n_rep (each key/value
    head serves n_rep consecutive query heads).

    Raises:
        CheckError: naming a wrong shape, heads tiled in the wrong order, a loop
            over the heads, or a call to the library's ``repeat_kv``.
    """
    fn = own_code(fn, repeat_kv)
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
    fn = own_code(fn, quantize_int8)
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
            f"w_int8 has dtype {w_int8.dtype}, expected torch.int8",
            "the last step converts to the 8-bit integer type.",
            kind=ShapeError,
        )
    if not isinstance(scale, Tensor) or tuple(scale.shape) != (d_out, n_groups):
        got = tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__
        per_row = n_groups > 1 and got == (d_out, 1)
        fail(
            f"group = {group}: scale has shape {got}, expected {(d_out, n_groups)}: "
            + (
                "one scale per row, so the groups were ignored"
                if per_row
                else f"one per group of {group} weights in each of the {d_out} rows"
            ),
            "view each row as (d_in // group, group) and reduce over the last axis "
            "only.",
            kind=ShapeError,
        )
    scale = scale.float()
    if torch.allclose(scale, scale.flatten()[0].expand_as(scale)):
        fail(
            "every group has the same scale: that is per-tensor quantization",
            "small groups then round to 0; take the maximum of each group.",
        )
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
            f"group = {group}: max |w_int8 * scale - w| = {err.max():.3g} exceeds "
            "half a step",
            "the step of a group is its scale: every weight must land within half a "
            "step of a code.",
        )
    want = w.reshape(d_out, n_groups, group).abs().amax(-1) / 127
    check_close(scale, want, rtol=1e-4, name=f"scale (group = {group})")
