"""Chapter 4's self-checks (sinusoidal rows, rotary positions, the positions of new
tokens): every wrong answer of the learner trial of 2026-12-01 is rejected with the
message that names its mistake, the library's own functions are refused as answers,
and a stub is reported as not attempted."""

from __future__ import annotations

import pytest
import torch

from transformer_course import exercises
from transformer_course.exercises import (
    check_new_token_positions,
    check_rotary_half,
    check_sinusoidal_encoding,
)
from transformer_course.positional import (
    apply_rotary,
    position_ids,
    sinusoidal_encoding,
)


def _table(*, first=0, sign=-1.0, per_pair=2, swap=False, halves=False, sliced=True):
    def fn(positions, d_model):
        max_len = len(positions)
        pos = (positions.double() + first)[:, None]
        cols = torch.arange(0, d_model, 2, dtype=torch.float64)
        angles = pos * 10000.0 ** (sign * cols * per_pair / 2 / d_model)
        sin, cos = angles.sin(), angles.cos()
        if swap:
            sin, cos = cos, sin
        if halves:
            return torch.cat((sin, cos), -1)[:, :d_model]
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2] = sin
        pe[:, 1::2] = cos[:, : d_model // 2] if sliced else cos
        return pe

    return fn


def _rotary(*, sign=1.0, per_pair=2, layout="half", ignore_positions=False):
    def fn(x, positions):
        d = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, d, 2) * per_pair / 2 / d)
        if ignore_positions:
            positions = torch.arange(x.shape[-2])
        angle = sign * positions[:, None].float() * theta  # (T, d/2)
        if layout == "interleaved":
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = torch.stack(
                (
                    x1 * angle.cos() - x2 * angle.sin(),
                    x1 * angle.sin() + x2 * angle.cos(),
                ),
                -1,
            )
            return out.flatten(-2)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat(
            (x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()),
            -1,
        )

    return fn


def _rotary_sign_bug(x, positions):  # rotate_half written as cat(x2, -x1)
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2) / d)
    angle = torch.cat([positions[:, None].float() * theta] * 2, -1)  # (T, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * angle.cos() + torch.cat((x2, -x1), -1) * angle.sin()


def _rotary_repeat_interleave(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2) / d)
    angle = (positions[:, None].float() * theta).repeat_interleave(2, -1)  # (T, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * angle.cos() + torch.cat((-x2, x1), -1) * angle.sin()


def _count(keep):
    return keep.long().cumsum(-1) - 1


TRIAL = [
    (check_sinusoidal_encoding, _table(swap=True), "swapped"),
    (check_sinusoidal_encoding, _table(per_pair=1), "i / d_model"),
    (check_sinusoidal_encoding, _table(halves=True), "first half"),
    (check_sinusoidal_encoding, _table(first=1), "off by one"),
    (
        check_sinusoidal_encoding,
        lambda positions, d: _table()(torch.arange(len(positions)), d),
        "positions argument is ignored",
    ),
    (check_sinusoidal_encoding, _table(sign=1.0), "sign is positive"),
    (check_sinusoidal_encoding, lambda n, d: _table()(n, d).T, "dimension 0"),
    (
        check_sinusoidal_encoding,
        lambda positions, d: sinusoidal_encoding(int(positions.max()) + 1, d)[
            positions
        ],
        "calls the library's",
    ),
    (check_rotary_half, _rotary(layout="interleaved"), "interleaved"),
    (check_rotary_half, _rotary(sign=-1.0), "runs backwards"),
    (check_rotary_half, _rotary_sign_bug, "runs backwards"),
    (check_rotary_half, _rotary_repeat_interleave, "not a rotation"),
    (check_rotary_half, _rotary(per_pair=1), "i / d, not 2i / d"),
    (
        check_rotary_half,
        _rotary(ignore_positions=True),
        "positions argument is ignored",
    ),
    (check_rotary_half, lambda x, positions: x.clone(), "nothing was rotated"),
    (
        check_rotary_half,
        lambda x, positions: apply_rotary(x, positions, layout="half"),
        "calls the library's",
    ),
    (
        check_new_token_positions,
        lambda keep, n: torch.arange(n).expand(keep.shape[0], n),
        "pitfall P16",
    ),
    (
        check_new_token_positions,
        lambda keep, n: torch.arange(keep.shape[1] - n, keep.shape[1]).expand(
            keep.shape[0], n
        ),
        "left padding was counted",
    ),
    (
        check_new_token_positions,
        lambda keep, n: keep.long().cumsum(-1)[:, -n:],
        "starts at 1",
    ),
    (check_new_token_positions, lambda keep, n: _count(keep)[:, :n], "first 2"),
    (
        check_new_token_positions,
        lambda keep, n: (keep.long().cumsum(0) - 1)[:, -n:],
        "batch axis",
    ),
    (
        check_new_token_positions,
        lambda keep, n: ((~keep).long().cumsum(-1) - 1)[:, -n:],
        "counted the padding",
    ),
    (
        check_new_token_positions,
        lambda keep, n: (keep.float().cumsum(-1) - 1)[:, -n:],
        "integer dtype",
    ),
    (
        check_new_token_positions,
        lambda keep, n: position_ids(n, offset=keep.shape[1] - n, keep=keep),
        "calls the library's",
    ),
]


@pytest.mark.parametrize(
    "check, wrong, message", TRIAL, ids=[str(i) for i in range(len(TRIAL))]
)
def test_each_trial_mistake_of_chapter_4_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert "Traceback" not in printed
    assert len(printed.strip().splitlines()) == 2, printed


def test_check_sinusoidal_encoding_stub_is_not_attempted(capsys):
    def stub(max_len, d_model):
        raise NotImplementedError("your code here")

    assert (
        exercises.check_sinusoidal_encoding(stub) is False
    )  # NotImplementedError is a
    assert "not attempted yet" in capsys.readouterr().out  # RuntimeError: not a crash


# ----------------------------------------------- learner trial 2026-12-03 (issue 39)


def _no_column_axis(positions, d_model):
    """positions (T,) times the frequencies (d/2,) without positions[:, None]."""
    w = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    angles = positions.float() * w  # bug: positions[:, None]
    pe = torch.zeros(len(positions), d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)[:, : d_model // 2]
    return pe


def test_a_crash_that_is_not_p15_shows_the_learners_line(capsys):
    """Finding 3e: forgetting positions[:, None] raises at d_model = 4; the check said
    "pitfall P15" and showed no line of the learner's code."""
    assert check_sinusoidal_encoding(_no_column_axis) is False
    printed = capsys.readouterr().out
    assert "P15" not in printed
    assert "angles = positions.float() * w  # bug" in printed  # the learner's line


def test_the_genuine_p15_crash_shows_the_line_and_the_p15_hint(capsys):
    assert check_sinusoidal_encoding(_table(sliced=False)) is False
    printed = capsys.readouterr().out
    assert "pitfall P15" in printed and "raised RuntimeError" in printed
    assert "pe[:, 1::2] = cos[:, : d_model // 2] if sliced else cos" in printed


def _integer_exponent(positions, d_model):
    pe = torch.zeros(len(positions), d_model)
    i = torch.arange(0, d_model, 2)
    angles = positions[:, None].float() * 10000.0 ** -(i // d_model)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()[:, : d_model // 2]
    return pe


def _per_column(positions, d_model):
    angles = positions[:, None].float() * 10000.0 ** (
        -torch.arange(d_model, dtype=torch.float32) / d_model
    )
    pe = angles.sin()
    pe[:, 1::2] = angles[:, 1::2].cos()
    return pe


def _sorted_first(positions, d_model):
    return _table()(positions.sort().values, d_model)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_per_column, "each column has its own frequency"),
        (_integer_exponent, "integer division"),
        (_sorted_first, "the positions sorted"),
    ],
    ids=["per-column", "integer-division", "sorted"],
)
def test_the_2026_12_03_generic_answers_are_named(wrong, message):
    with pytest.raises(exercises.CheckError, match=message):
        check_sinusoidal_encoding.strict(wrong)
