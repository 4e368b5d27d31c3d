"""What every exercise check shares: the failure type, the pass/fail plumbing, shape and
closeness helpers, random inputs, and ``public_test`` (the public otter test).

A check is a function decorated with ``exercise_check``. Inside, it raises ``CheckError``
through ``fail`` when something is wrong; the decorator turns that into two printed lines
("✗ message" and "Hint: ...") and a return value of False, so a learner sees what is
wrong and not a traceback through this package. ``check.strict(fn)`` runs the same check
but lets ``CheckError`` (and the stub's ``NotImplementedError``) propagate: tests and
``public_test`` use it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sysconfig
import traceback
from collections.abc import Callable, Sequence

import torch

Tensor = torch.Tensor


class CheckError(AssertionError):
    """A self-check failed; ``message`` says what is wrong and ``hint`` how to look."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message + (f"\nHint: {hint}" if hint else ""))
        self.message, self.hint = message, hint


class ShapeError(CheckError):
    """The learner's result has the wrong type, number of dimensions or shape."""


def fail(message: str, hint: str | None = None, *, kind: type[CheckError] = CheckError):
    """Raise ``kind(message, hint)``: the check stops here."""
    raise kind(message, hint)


def passed(what: str) -> bool:
    print(f"passed: {what}")
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
            name = getattr(fn, "__name__", "your function")
            print(
                f"not attempted yet: {name} raises NotImplementedError;\n"
                "write its body and run this cell again."
            )
            return False
        except CheckError as err:
            print(f"✗ {err.message}" + (f"\nHint: {err.hint}" if err.hint else ""))
            return False
        except TimeoutError:
            raise  # a time limit set by the grader, not a mistake to explain
        except Exception as err:  # noqa: BLE001 (the learner's code raised)
            _report_crash(fn, err)
            return False

    wrapped.strict = check
    return wrapped


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_LIBRARIES = tuple(
    os.path.abspath(p) + os.sep
    for p in {
        *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")),
        os.path.dirname(_PACKAGE),  # transformer_course itself
        os.path.dirname(torch.__file__),
    }
)


def _is_learners(filename: str) -> bool:
    """A frame of the learner's own code: not this package, not an installed library
    (torch, the standard library, transformer_course), not the instructor's grader."""
    path = os.path.abspath(filename)
    return not (
        path.startswith(_LIBRARIES)
        or filename.startswith("<frozen")
        or f"{os.sep}course_grading{os.sep}" in path
    )


_FRAMES = {"shown": True}  # False in the grader's re-check (``hide_frames``)


def hide_frames() -> None:
    """Crash reports in this process show no traceback frames. For the grader's
    isolated re-check, where the learner's function runs in another process: the only
    frames here are the grader's own proxy (and its paths), which a student's feedback
    must not show."""
    _FRAMES["shown"] = False


def _report_crash(fn, err: Exception) -> None:
    """Print the error, the learner's own frames (the last 3) and, when the error was
    raised deeper, inside PyTorch or the library, where that was."""
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if _FRAMES["shown"] and not os.path.abspath(f.filename).startswith(_PACKAGE)
    ]
    own = [i for i, f in enumerate(frames) if _is_learners(f.filename)]
    name = getattr(fn, "__name__", "your function")
    print(f"✗ {name} raised {type(err).__name__}: {err}")
    if not frames:  # the grader's re-check: its own frames are not the learner's
        if isinstance(err, NameError):
            print(
                "Hint: check the spelling of every name, and that the cell defining it "
                "ran (the function must keep the name the exercise gives it)."
            )
        else:
            print(
                "Hint: run this exercise's check in your notebook: it shows the line of "
                "your code that raised."
            )
        return
    if not own:  # a library function given as the answer, or the grader's proxy
        shown = [
            f for f in frames if f"{os.sep}course_grading{os.sep}" not in f.filename
        ]
        if shown:
            print("".join(traceback.format_list(shown[-3:])).rstrip())
        print("Hint: print the shapes and types of the inputs your function receives.")
        return
    print("".join(traceback.format_list([frames[i] for i in own[-3:]])).rstrip())
    deeper = frames[own[-1] + 1 :]
    if deeper:
        where = deeper[-1]
        library = "PyTorch" if "torch" in where.filename else "a library"
        print(
            f"  (raised inside {library}: {os.path.basename(where.filename)}, "
            f"in {where.name}, called from your line above)"
        )
    print(
        "Hint: the last line of yours above raised it; print the shapes of what that "
        "line passes on."
    )


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
            raise AssertionError(
                f"not attempted yet: {getattr(fn, '__name__', 'the function')} still "
                "raises NotImplementedError"
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
            f"{name} is a {type(x).__name__}, expected a torch.Tensor",
            "return a tensor, not a list, a number or a tuple.",
            kind=ShapeError,
        )
    shape, want = tuple(x.shape), tuple(expected)
    if len(shape) != len(want):
        fail(
            f"{name} has {len(shape)} dimensions {shape}, expected {len(want)} {want}",
            "compare the shape after each step with the shape asked for: an axis "
            "was added, dropped or not merged.",
            kind=ShapeError,
        )
    for dim, (got, exp) in enumerate(zip(shape, want)):
        if exp is not None and got != exp:
            fail(
                f"dimension {dim} of {name} is {got}, expected {exp} "
                f"(shape {shape}, expected {want})",
                "print the shape after every step and compare it with the shape "
                "asked for.",
                kind=ShapeError,
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
    nan_hint: str = "a softmax over a row whose keys are all masked gives NaN; "
    "look for a division by zero or exp of a large number.",
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
            f"{name} has {int(bad.sum())} NaN/inf values, the first at index {where}",
            nan_hint,
        )
    diff = (actual - expected).abs()
    tol = atol + rtol * expected.abs()
    if (diff > tol).any():
        where = tuple(torch.nonzero(diff > tol)[0].tolist())
        fail(
            f"the values of {name} differ from the reference: max |difference| = "
            f"{diff.max().item():.3g}; first wrong entry at index {where}: "
            f"got {actual[where].item():.5g}, expected {expected[where].item():.5g}",
            hint or "print a small case by hand and compare it step by step.",
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
    got = (
        f"a tuple of {len(result)}"
        if isinstance(result, (tuple, list))
        else f"a {type(result).__name__}"
    )
    fail(
        f"the function returned {got}, expected the tuple {what}",
        "end with `return out, weights`: the check needs both.",
        kind=ShapeError,
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
