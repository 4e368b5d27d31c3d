"""Chapter 4, positional encoding: the sinusoidal table, rotary, positions under a cache."""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    check_close,
    check_shape,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_
from transformer_course.exercises._method import forbids
from transformer_course.positional import (
    apply_rotary,
    position_ids,
    sinusoidal_encoding,
)


@exercise_check
@forbids(sinusoidal_encoding)
def check_sinusoidal_encoding(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 4, exercise "the sinusoidal rows of given positions": ``fn(positions,
    d_model)`` with integer positions (T,), in any order and from any offset, must
    return the (T, d_model) rows PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i),
    w_i = 10000^(-2i / d_model), for even *and odd* d_model (pitfall P15), without
    building the table up to the largest position.

    Raises:
        CheckError: naming a crash on odd d_model, the positions ignored (rows
            0..T-1), sines and cosines swapped or in two halves, a wrong exponent or
            its sign, positions off by one, a call to the library's
            ``sinusoidal_encoding``, or the first wrong value.
    """
    cases = (
        (torch.arange(10), 4),
        (torch.arange(50), 16),
        (torch.tensor([7, 3, 12, 0, 9, 4, 11, 2, 8, 5]), 5),
        (torch.tensor([100, 101, 102, 103, 104, 105, 106]), 1),
        (torch.arange(1000, 1006), 6),
    )
    passed_even = False  # a crash on odd d_model after the even ones is P15
    for positions, d in cases:
        max_len = len(positions)
        try:
            out = fn(positions.clone(), d)
        except NotImplementedError:
            raise  # the stub: "not attempted yet"
        except (RuntimeError, IndexError, ValueError) as err:
            if d % 2 == 0 or not passed_even:
                raise  # not P15: the learner's own line is shown (exercise_check)
            err.exercise_hint = N_(
                "with an odd d_model there is one more sine column than cosine columns "
                "(pitfall P15): fill pe[:, 0::2] and pe[:, 1::2] with angles sliced "
                "to their own widths."
            )
            raise  # exercise_check shows the learner's line, then this hint
        name = f"fn({_short(positions)}, {d})"
        check_shape(out, (max_len, d), name)
        out = out.detach().double()
        table = sinusoidal_encoding(int(positions.max()) + 2, d, dtype=torch.float64)
        ref = table[positions]
        if torch.allclose(out, ref, atol=1e-5):
            passed_even = passed_even or d % 2 == 0
            continue
        if torch.allclose(out, table[:max_len], atol=1e-5):
            fail(
                "{name}: your rows are those of positions 0..{last}: the "
                "positions argument is ignored",
                "row t is the encoding of position positions[t].",
                name=name,
                last=max_len - 1,
            )
        pos = positions.double()[:, None]
        if torch.allclose(out, table[positions.sort().values], atol=1e-5):
            fail(
                "{name}: your rows are those of the positions sorted: row t must be "
                "the encoding of positions[t], in the order given",
                "compute the angles from positions as they are; do not sort them.",
                name=name,
            )
        per_col = pos * 10000.0 ** (-torch.arange(d, dtype=torch.float64) / d)
        if d > 1 and torch.allclose(out[:, 1::2], per_col[:, 1::2].cos(), atol=1e-5):
            fail(
                "{name}: each column has its own frequency 10000^(-j / d_model): the "
                "cosine of column 2i + 1 must share the frequency of the sine in "
                "column 2i",
                "one frequency per pair of columns: w_i = 10000^(-2i / d_model) for "
                "columns 2i and 2i + 1.",
                name=name,
            )
        flat = torch.zeros_like(out)
        flat[:, 0::2], flat[:, 1::2] = pos.sin(), pos.cos()
        if d > 2 and torch.allclose(out, flat, atol=1e-5):
            fail(
                "{name}: every pair of columns holds sin(p) and cos(p): the exponent "
                "2i / d_model is 0 for every pair, as with integer division (//)",
                "2 * i / d_model is a fraction between 0 and 1: use true division.",
                name=name,
            )
        if d % 2 == 0:
            ang = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            if torch.allclose(out, torch.cat((ang.sin(), ang.cos()), -1), atol=1e-5):
                fail(
                    "your sines fill the first half of the columns and the cosines "
                    "the second half",
                    "the paper interleaves them: column 2i is a sine, column 2i+1 "
                    "the cosine of the same angle.",
                )
            if torch.allclose(out[:, 0::2], ref[:, 1::2], atol=1e-5):
                fail(
                    "columns 0, 2, 4, ... hold cosines: sines and cosines are swapped",
                    "PE[pos, 2i] = sin(pos w_i); row 0 starts 0, 1, 0, 1, ...",
                )
            cols = torch.arange(0, d, 2, dtype=torch.float64)
            wrong = pos * 10000.0 ** (-(cols / 2) / d)
            if torch.allclose(out[:, 0::2], wrong.sin(), atol=1e-5):
                fail(
                    "the frequencies use i / d_model, not 2i / d_model",
                    "w_i = 10000 ** (-2 * i / d_model) for pair i; the exponent of "
                    "column 2i is that column index over d_model.",
                )
            if torch.allclose(out, table[positions + 1], atol=1e-5):
                fail(
                    "{name}: row t holds position positions[t] + 1: your positions are "
                    "off by one",
                    "position 0's row is sin 0, cos 0, ... = 0, 1, 0, 1, ...",
                    name=name,
                )
            grows = pos * 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
            if torch.allclose(out[:, 0::2], grows.sin(), atol=1e-5):
                fail(
                    "your frequencies grow with the column: the exponent's sign is "
                    "positive",
                    "w_i must shrink from 1 (column 0) towards 1/10000: the "
                    "wavelengths get longer across the table.",
                )
        check_close(out, ref, atol=1e-5, name=name)
    return passed(
        "sinusoidal rows right for positions in order, shuffled and from 1000, "
        "d_model = 4, 16, 5 (odd), 1 and 6"
    )


def _short(positions: Tensor) -> str:
    values = positions.tolist()
    return str(values) if len(values) <= 4 else f"[{values[0]}, {values[1]}, ...]"


@exercise_check
@forbids(apply_rotary)
def check_rotary_half(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """Chapter 4, exercise "rotary, half layout": ``fn(x, positions)`` with x
    (..., T, d), d even, and integer positions (T,) must rotate the pair
    (x_i, x_{{i + d/2}}) by positions * 10000^(-2i / d).

    Raises:
        CheckError: naming the interleaved pairing, a reversed rotation, no rotation,
            ignored positions, the exponent i / d, a changed norm, a call to the
            library's ``apply_rotary``, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(40)
    for shape, offset in (((5, 4), 0), ((2, 3, 6, 8), 0), ((1, 2, 3, 16), 7)):
        x = torch.randn(*shape, generator=gen)
        positions = torch.arange(offset, offset + shape[-2])
        out = fn(x, positions)
        check_shape(out, shape, "output")
        ref = apply_rotary(x, positions, layout="half")
        if torch.allclose(out, ref, atol=1e-5):
            continue
        if torch.allclose(
            out, apply_rotary(x, positions, layout="interleaved"), atol=1e-5
        ):
            fail(
                "you rotated neighbouring pairs (x0, x1), (x2, x3): the interleaved "
                "layout",
                "this exercise pairs x_i with x_{{i + d/2}}: split x into two halves.",
            )
        if torch.allclose(out, apply_rotary(x, -positions, layout="half"), atol=1e-5):
            fail(
                "the rotation runs backwards (by -pos * theta_i)",
                "a rotation by +angle moves x1 towards x2: check the sign of the sine "
                "in each half.",
            )
        if torch.allclose(out, x, atol=1e-6):
            fail(
                "the output equals the input: nothing was rotated",
                "every pair (x_i, x_{{i + d/2}}) turns by its own angle; build the cos "
                "and sin of those angles and mix the two halves with them.",
            )
        if offset and torch.allclose(
            out, apply_rotary(x, positions - offset, layout="half"), atol=1e-5
        ):
            fail(
                "with positions {positions} your output is the rotation for "
                "positions 0..{last}: the positions argument is ignored",
                "the angle of row t comes from positions[t], not from t.",
                positions=positions.tolist(),
                last=shape[-2] - 1,
            )
        half = shape[-1] // 2
        theta = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / shape[-1])
        angle = positions[:, None].double() * theta
        x1, x2 = x[..., :half].double(), x[..., half:].double()
        slow = torch.cat(
            (x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()),
            -1,
        )
        if torch.allclose(out.double(), slow, atol=1e-5):
            fail(
                "the frequencies use i / d, not 2i / d (pair i turns too slowly)",
                "theta_i = 10000 ** (-2 * i / d) for pair i = 0 .. d/2 - 1.",
            )
        if not torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-4):
            fail(
                "the norm of a vector changed: this is not a rotation",
                "each pair must use the cos and sin of one and the same angle.",
            )
        check_close(out, ref, atol=1e-5, name="output")
    return passed("rotary (half layout) matches the library, offsets included")


@exercise_check
@forbids(position_ids)
def check_new_token_positions(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 4, exercise "find the bug: positions under a KV cache": ``fn(keep,
    n_new)`` with keep a bool (B, S) padding mask over every token so far (cache plus
    the n_new newest, True = real token, left padding allowed) must return the (B,
    n_new) absolute positions of the newest tokens, counting real tokens only.

    Raises:
        CheckError: naming positions that are not integers, positions restarted at 0
            for the new chunk (pitfall P16), the first n_new columns taken instead of
            the last, padding counted as positions, a call to ``position_ids``, or the
            first wrong value.
    """
    keep_full = torch.ones(1, 7, dtype=torch.bool)
    keep_left = torch.tensor(
        [[False, False, True, True, True, True], [True, True, True, True, True, True]]
    )
    for keep, n_new in ((keep_left, 2), (keep_full, 3), (keep_full, 1)):
        out = fn(keep, n_new)
        check_shape(out, (keep.shape[0], n_new), "positions")
        if out.dtype.is_floating_point or out.dtype == torch.bool:
            fail(
                "the positions have dtype {out_dtype}, expected an integer dtype "
                "(torch.long)",
                "positions index a table (a learned position embedding, a cache of "
                "cos and sin): a float cannot index. Count with integers.",
                kind=ShapeError,
                out_dtype=out.dtype,
            )
        ref = position_ids(n_new, offset=keep.shape[1] - n_new, keep=keep)
        if torch.equal(out.long(), ref):
            continue
        counted = (keep.long().cumsum(-1) - 1).clamp(min=0)
        first = (counted[:, :n_new], keep.long().cumsum(-1)[:, :n_new] - 1)
        if n_new < keep.shape[1] and any(torch.equal(out.long(), f) for f in first):
            fail(
                "the {n_new} new token(s) got positions {out}: those of the first "
                "{n_new} token(s) of the text, expected {ref}",
                "the newest tokens are at the end of keep: which columns of your "
                "count belong to them?",
                n_new=n_new,
                out=out[0].tolist(),
                ref=ref[0].tolist(),
            )
        if torch.equal(out.long(), torch.arange(n_new).expand_as(ref)):
            fail(
                "the {n_new} new token(s) got positions {out}: they were numbered "
                "from 0 within the new chunk, as if the cache were empty (pitfall "
                "P16); expected {ref}",
                "a new token's position is the number of tokens before it.",
                n_new=n_new,
                out=out[0].tolist(),
                ref=ref[0].tolist(),
            )
        naive = torch.arange(keep.shape[1] - n_new, keep.shape[1]).expand_as(ref)
        if torch.equal(out.long(), naive):
            fail(
                "row 0 got positions {out}, expected {ref}: the left padding was "
                "counted",
                "a padded slot has no position: count only the real tokens before "
                "each new one.",
                out=out[0].tolist(),
                ref=ref[0].tolist(),
            )
        if torch.equal(out.long(), counted[:, -n_new:] + 1):
            fail(
                "positions {out}, expected {ref}: one too high, the count of real "
                "tokens starts at 1",
                "the first real token is at position 0.",
                out=out.tolist(),
                ref=ref.tolist(),
            )
        by_batch = keep.long().cumsum(0) - 1
        padding = (~keep).long().cumsum(-1) - 1
        if torch.equal(out.long(), by_batch[:, -n_new:]) or torch.equal(
            out.long(), padding[:, -n_new:]
        ):
            fail(
                "positions {out}, expected {ref} (keep = {keep}, n_new = {n_new}): "
                "you counted along the batch axis or counted the padding",
                "count, within each row, the real tokens (True) before each token.",
                out=out.tolist(),
                ref=ref.tolist(),
                keep=keep.int().tolist(),
                n_new=n_new,
            )
        fail(
            "positions {out}, expected {ref} (keep = {keep}, n_new = {n_new})",
            "a token's position is the number of real tokens before it in its row.",
            out=out.tolist(),
            ref=ref.tolist(),
            keep=keep.int().tolist(),
            n_new=n_new,
        )
    return passed("new tokens get their absolute positions, with and without padding")
