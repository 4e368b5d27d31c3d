"""What every exercise check shares: the failure type, the pass/fail plumbing, shape and
closeness helpers, random inputs, and ``public_test`` (the public otter test).

A check is a function decorated with ``exercise_check``. Inside, it raises ``CheckError``
through ``fail`` when something is wrong; the decorator turns that into two printed lines
("✗ message" and "Hint: ...") and a return value of False, so a learner sees what is
wrong and not a traceback through this package. ``check.strict(fn)`` runs the same check
but lets ``CheckError`` (and the stub's ``NotImplementedError``) propagate: tests and
``public_test`` use it. A message and its hint are English templates: ``fail`` and
``passed`` translate them into the learner's language (``_language``), then fill in
their ``{placeholders}``; a crash in the learner's code is reported by ``_crash``.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Sequence

import torch

from transformer_course.exercises._crash import (  # hide_frames: for the grader
    hide_frames,  # noqa: F401
    name_of,
    report_crash,
)
from transformer_course.exercises._language import N_, gettext

Tensor = torch.Tensor


class CheckError(AssertionError):
    """A self-check failed; ``message`` says what is wrong and ``hint`` how to look."""

    def __init__(self, message: str, hint: str | None = None):
        shown = message + (
            "\n" + gettext("Hint: {hint}").format(hint=hint) if hint else ""
        )
        super().__init__(shown)
        self.message, self.hint = message, hint


class ShapeError(CheckError):
    """The learner's result has the wrong type, number of dimensions or shape."""


def fail(
    message: str,
    hint: str | None = None,
    /,
    *,
    kind: type[CheckError] = CheckError,
    **fields,
):
    """Raise ``kind(message, hint)``: the check stops here. ``message`` and ``hint``
    are English templates (msgids of the catalog, never formatted yet): translated
    into the learner's language, then formatted with ``fields``."""
    hint = None if hint is None else gettext(hint).format(**fields)
    raise kind(gettext(message).format(**fields), hint)


def passed(what: str, /, **fields) -> bool:
    """Print "passed: ..." (``what``, a template as in ``fail``) and return True."""
    print(gettext("passed: {what}").format(what=gettext(what).format(**fields)))
    return True


def exercise_check(check: Callable[..., bool]) -> Callable[..., bool]:
    """Decorator for checks. The returned function:

    - returns True (after printing "passed: ...") when the learner's function is right;
    - prints "not attempted yet ..." and returns False for the stub (it raises
      ``NotImplementedError``), so a chapter with untouched stubs runs top to bottom;
    - prints "✗ <message>" and "Hint: <hint>" and returns False on a ``CheckError``;
    - when the learner's function raises, prints the error and the learner's own
      frames of the traceback (not this package's) and returns False.

    ``wrapped.strict`` is the undecorated check (raises ``CheckError``).
    """

    @functools.wraps(check)
    def wrapped(fn, *args, **kwargs) -> bool:
        try:
            return check(fn, *args, **kwargs)
        except NotImplementedError:
            name = name_of(fn, N_("your function"))
            print(
                gettext(
                    "not attempted yet: {name} raises NotImplementedError;\n"
                    "write its body and run this cell again."
                ).format(name=name)
            )
            return False
        except CheckError as err:
            hint = (
                "\n" + gettext("Hint: {hint}").format(hint=err.hint) if err.hint else ""
            )
            print(f"✗ {err.message}{hint}")
            return False
        except TimeoutError:
            raise  # a time limit set by the grader, not a mistake to explain
        except Exception as err:  # noqa: BLE001 (the learner's code raised)
            report_crash(fn, err)
            return False

    wrapped.strict = check
    return wrapped


def public_test(check: Callable[..., bool], fn: Callable) -> bool:
    """Public otter test of a coding exercise: ``fn`` is implemented and returns results
    of the right types and shapes. Runs ``check.strict(fn)`` and hides every failure
    except a ``ShapeError``; the values are graded by the hidden test
    ``assert check(fn)``.

    Raises:
        AssertionError: "not attempted yet" for the stub, or the check's message when
            it is about a type or a shape (e.g. "dimension 1 of weights is 5, expected 4").
    """
    strict = getattr(check, "strict", check)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            strict(fn)
        except ShapeError as err:
            raise AssertionError(str(err)) from None
        except CheckError:
            return True  # implemented, shapes right; the values are graded hidden
        except NotImplementedError:
            name = name_of(fn, N_("the function"))
            raise AssertionError(
                gettext(
                    "not attempted yet: {name} still raises NotImplementedError"
                ).format(name=name)
            ) from None
    return True


# ------------------------------------------------------------- shapes and values


def check_shape(x, expected: Sequence[int | None], name: str = "x") -> bool:
    """Check that ``x`` is a tensor of shape ``expected`` (``None`` matches any size).

    Raises:
        ShapeError: naming the first dimension that differs, e.g.
            "dimension 1 of weights is 5, expected 4".
    """
    if not isinstance(x, Tensor):
        fail(
            "{name} is a {type}, expected a torch.Tensor",
            "return a tensor, not a list, a number or a tuple.",
            kind=ShapeError,
            name=name,
            type=type(x).__name__,
        )
    shape, want = tuple(x.shape), tuple(expected)
    if len(shape) != len(want):
        fail(
            "{name} has {n_shape} dimensions {shape}, expected {n_want} {want}",
            "compare the shape after each step with the shape asked for: an axis "
            "was added, dropped or not merged.",
            kind=ShapeError,
            name=name,
            n_shape=len(shape),
            shape=shape,
            n_want=len(want),
            want=want,
        )
    for dim, (got, exp) in enumerate(zip(shape, want)):
        if exp is not None and got != exp:
            fail(
                "dimension {dim} of {name} is {got}, expected {exp} (shape "
                "{shape}, expected {want})",
                "print the shape after every step and compare it with the shape "
                "asked for.",
                kind=ShapeError,
                dim=dim,
                name=name,
                got=got,
                exp=exp,
                shape=shape,
                want=want,
            )
    return True


def check_close(
    actual,
    expected: Tensor,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    name: str = "x",
    hint: str | None = None,
    nan_hint: str = N_(
        "a softmax over a row whose keys are all masked gives NaN; "
        "look for a division by zero or exp of a large number."
    ),
) -> bool:
    """Check that ``actual`` equals ``expected`` within ``atol + rtol * |expected|``.

    Raises:
        ShapeError: for a wrong type or shape.
        CheckError: for NaN/inf (with the first position) or values out of tolerance
            (with the largest difference and where it is), with ``hint`` if given.
    """
    check_shape(actual, expected.shape, name)
    actual = actual.detach().to(expected.dtype)
    bad = ~torch.isfinite(actual) & torch.isfinite(expected)
    if bad.any():
        where = tuple(torch.nonzero(bad)[0].tolist())
        fail(
            "{name} has {count} NaN/inf values, the first at index {where}",
            nan_hint,
            name=name,
            count=int(bad.sum()),
            where=where,
        )
    diff = (actual - expected).abs()
    tol = atol + rtol * expected.abs()
    if (diff > tol).any():
        where = tuple(torch.nonzero(diff > tol)[0].tolist())
        fail(
            "the values of {name} differ from the reference: max |difference| "
            "= {diff:.3g}; first wrong entry at index {where}: got "
            "{actual:.5g}, expected {expected:.5g}",
            hint or N_("print a small case by hand and compare it step by step."),
            name=name,
            diff=diff.max().item(),
            where=where,
            actual=actual[where].item(),
            expected=expected[where].item(),
        )
    return True


def close(a, b: Tensor, atol: float = 1e-5) -> bool:
    """True when ``a`` is a tensor of ``b``'s shape and equal within ``atol``."""
    return (
        isinstance(a, Tensor)
        and a.shape == b.shape
        and torch.allclose(a.detach().to(b.dtype), b, atol=atol, equal_nan=False)
    )


def out_and_weights(result, what: str = "(out, weights)") -> tuple[Tensor, Tensor]:
    """Unpack a learner's ``(out, weights)``; a clear ``ShapeError`` otherwise."""
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return result[0], result[1]
    if isinstance(result, (tuple, list)):
        got = gettext("a tuple of {n}").format(n=len(result))
    else:
        got = gettext("a {type}").format(type=type(result).__name__)
    fail(
        "the function returned {got}, expected the tuple {what}",
        "end with `return out, weights`: the check needs both.",
        kind=ShapeError,
        got=got,
        what=what,
    )


def first_output(result) -> Tensor:
    """The output of ``fn(...)`` that returns ``out`` or ``(out, weights)``."""
    return result[0] if isinstance(result, tuple) else result


def random_qkv(
    gen: torch.Generator, lead: tuple[int, ...], t: int, s: int, d: int, dv: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Random q (*lead, t, d), k (*lead, s, d), v (*lead, s, dv)."""
    q = torch.randn(*lead, t, d, generator=gen)
    k = torch.randn(*lead, s, d, generator=gen)
    v = torch.randn(*lead, s, dv, generator=gen)
    return q, k, v
