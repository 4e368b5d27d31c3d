"""How a crash in the learner's own code is reported by a check: the error, the
learner's own frames of the traceback (not this package's, not PyTorch's) and a hint,
in the learner's language. ``hide_frames`` turns the frames off for the grader's
isolated re-check."""

from __future__ import annotations

import os
import sysconfig
import traceback

import torch

from transformer_course.exercises._language import N_, gettext

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


def report_crash(fn, err: Exception) -> None:
    """Print the error, the learner's own frames (the last 3) and, when the error was
    raised deeper, inside PyTorch or the library, where that was. A check that knows
    the likely cause of a crash sets ``err.exercise_hint`` (a template): it replaces
    the general hint below the learner's line (chapter 4's odd d_model, P15)."""
    extra = getattr(err, "exercise_hint", None)
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if _FRAMES["shown"] and not os.path.abspath(f.filename).startswith(_PACKAGE)
    ]
    own = [i for i, f in enumerate(frames) if _is_learners(f.filename)]
    name = name_of(fn, N_("your function"))
    error = type(err).__name__
    print(
        "✗ "
        + gettext("{name} raised {error}: {err}").format(
            name=name, error=error, err=err
        )
    )
    if not frames:  # the grader's re-check: its own frames are not the learner's
        if isinstance(err, NameError):
            _print_hint(
                "check the spelling of every name, and that the cell defining it "
                "ran (the function must keep the name the exercise gives it)."
            )
        else:
            _print_hint(
                "run this exercise's check in your notebook: it shows the line of "
                "your code that raised."
            )
        return
    if not own:  # a library function given as the answer, or the grader's proxy
        shown = [
            f for f in frames if f"{os.sep}course_grading{os.sep}" not in f.filename
        ]
        if shown:
            print("".join(traceback.format_list(shown[-3:])).rstrip())
        _print_hint("print the shapes and types of the inputs your function receives.")
        return
    print("".join(traceback.format_list([frames[i] for i in own[-3:]])).rstrip())
    deeper = frames[own[-1] + 1 :]
    if deeper:
        where = deeper[-1]
        inside = (
            N_(
                "  (raised inside PyTorch: {file}, in {function}, called from your line above)"
            )
            if "torch" in where.filename
            else N_(
                "  (raised inside a library: {file}, in {function}, called from your line above)"
            )
        )
        file = os.path.basename(where.filename)
        print(gettext(inside).format(file=file, function=where.name))
    if extra:
        _print_hint(extra)
        return
    _print_hint(
        "the last line of yours above raised it; print the shapes of what that "
        "line passes on."
    )


def name_of(fn, default: str) -> str:
    """``fn.__name__``, or the template ``default`` translated when it has none."""
    name = getattr(fn, "__name__", None)
    return gettext(default) if name is None else name


def _print_hint(hint: str) -> None:
    """Print "Hint: ..." for the template ``hint``, in the learner's language."""
    print(gettext("Hint: {hint}").format(hint=gettext(hint)))
