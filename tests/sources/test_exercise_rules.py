"""Cross-chapter rules for exercises (issue 7), checked on every chapter file present:
at least 4 exercises, at least 2 auto-checked coding exercises, at least one "find the
bug" exercise, every solution hidden at first (a dropdown), and every reference solution
passes its own self-check (and the untouched stub does not)."""

from __future__ import annotations

import contextlib
import io
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transformer_course import exercises

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from course_grading import assign as assignments

CHAPTERS = assignments.chapters()
IDS = [p.stem for p in CHAPTERS]
CODING = [
    (p.stem, ex) for p in CHAPTERS for ex in assignments.parse_chapter(p) if ex.coding
]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_at_least_four_exercises(chapter):
    exercises = assignments.parse_chapter(chapter)
    assert len(exercises) >= 4, f"{chapter.name}: {len(exercises)} exercises, need >= 4"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_at_least_two_auto_checked_coding_exercises(chapter):
    coding = [ex.label for ex in assignments.parse_chapter(chapter) if ex.coding]
    assert len(coding) >= 2, f"{chapter.name}: auto-checked coding exercises {coding}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_a_find_the_bug_exercise(chapter):
    bugs = [
        ex.label
        for ex in assignments.parse_chapter(chapter)
        if "bug" in (ex.title + " " + ex.text).lower()
    ]
    assert bugs, f"{chapter.name}: no exercise whose title or text says 'bug'"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_every_exercise_has_a_hidden_solution(chapter):
    for ex in assignments.parse_chapter(chapter):
        assert ex.solution_text is not None, (
            f"{chapter.name}: {ex.label} has no solution"
        )
        assert ex.hidden, (
            f"{chapter.name}: the solution of {ex.label} is not :class: dropdown"
        )


# The chapters' code runs here on purpose: that is what these tests check.
# ruff: noqa: S102


def _namespace() -> dict:
    """What the chapters' solutions use: the imports of a chapter's first cell."""
    import transformer_course

    ns = {"math": math, "torch": torch, "F": F, "nn": torch.nn}
    ns.update(
        {
            k: getattr(transformer_course, k)
            for k in dir(transformer_course)
            if not k.startswith("_")
        }
    )
    return ns


def _chapter_namespace(chapter: str, exercise) -> dict:
    """The chapter's first cell run, then the reference solutions of the exercises before
    this one (a later exercise may use an earlier one's function, as in the chapter)."""
    ns = _namespace()
    exec(assignments.first_code_cell(ROOT / "book" / f"{chapter}.md"), ns)
    for ex in assignments.parse_chapter(ROOT / "book" / f"{chapter}.md"):
        if ex.label == exercise.label:
            break
        if ex.coding:
            exec(ex.solution_code, ns)
    return ns


CODING_IDS = [f"{c}-{ex.label}" for c, ex in CODING]


@pytest.mark.parametrize("chapter,exercise", CODING, ids=CODING_IDS)
def test_reference_solution_passes_its_check(chapter, exercise):
    ns = _chapter_namespace(chapter, exercise)
    check = getattr(exercises, exercise.check)
    exec(exercise.solution_code, ns)
    with contextlib.redirect_stdout(io.StringIO()):
        assert check(*(ns[f] for f in exercise.functions), **exercise.kwargs) is True


@pytest.mark.parametrize("chapter,exercise", CODING, ids=CODING_IDS)
def test_the_stub_is_reported_as_not_attempted(chapter, exercise):
    ns = _chapter_namespace(chapter, exercise)
    check = getattr(exercises, exercise.check)
    exec(exercise.stub.split(f"\n{exercise.check}(")[0], ns)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = check(*(ns[f] for f in exercise.functions), **exercise.kwargs)
    assert result is False and "not attempted yet" in printed.getvalue(), (
        f"{exercise.check} on the untouched stub should print 'not attempted yet' and "
        "return False"
    )


# ------------------------------------------------------------------ public_test


def test_public_test_reports_shapes_and_the_stub_only():
    from transformer_course.exercises import (
        check_masked_attention,
        pitfalls,
        public_test,
    )

    def stub(q, k, v, mask=None):
        raise NotImplementedError

    assert public_test(check_masked_attention, pitfalls.attention_unscaled)  # values
    with pytest.raises(AssertionError, match="not attempted yet"):
        public_test(check_masked_attention, stub)
    with pytest.raises(AssertionError, match="expected the tuple"):
        public_test(check_masked_attention, pitfalls.attention_out_only)


BUGS = [
    (c, ex) for c, ex in CODING if "bug" in ex.title.lower() and "\n    def " in ex.text
]


@pytest.mark.parametrize(
    "chapter,exercise", BUGS, ids=[f"{c}-{ex.label}" for c, ex in BUGS]
)
def test_the_buggy_code_of_a_find_the_bug_exercise_fails_its_check(chapter, exercise):
    """The function printed in the exercise (an indented block) is rejected, with a
    message and a hint rather than a traceback."""
    code = "\n".join(
        line[4:]
        for line in exercise.text.splitlines()
        if line.startswith("    ") or not line.strip()
    )
    ns = _chapter_namespace(chapter, exercise)
    before = set(ns)
    exec(code.strip("\n"), ns)
    buggy = [ns[name] for name in set(ns) - before if callable(ns[name])]
    assert len(buggy) == 1, f"{exercise.label}: expected one function in {code!r}"
    check = getattr(exercises, exercise.check)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert check(buggy[0], **exercise.kwargs) is False
    assert "✗" in printed.getvalue() and "Hint: " in printed.getvalue()
    assert "Traceback" not in printed.getvalue()


def test_grading_image_pins_the_library_dependencies_to_the_tested_versions(tmp_path):
    pins = assignments.pinned_dependencies()
    assert any(p.startswith("torch==") for p in pins), pins
    declared = [d.split(">")[0].split("=")[0].strip() for d in _declared()]
    assert len(pins) == len(declared)
    # known wrong: a dependency requirements.txt does not pin is refused, not unpinned
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torch>=2.5", "not-pinned-anywhere>=1"]\n'
    )
    (tmp_path / "requirements.txt").write_text("torch==2.13.0+cpu\n")
    with pytest.raises(ValueError, match="not-pinned-anywhere"):
        assignments.pinned_dependencies(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torch>=2.5"]\n'
    )
    assert assignments.pinned_dependencies(tmp_path) == ["torch==2.13.0"]


def _declared() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]


def test_first_code_cell_drops_myst_cell_options(tmp_path):
    """A set-up cell collapsed on the site (``:tags: [hide-input]``) still gives the
    student notebook and these checks plain Python: the option line is not code."""
    chapter = tmp_path / "00_x.md"
    chapter.write_text(
        "# x\n\n```{code-cell} ipython3\n:tags: [hide-input]\nimport math\n"
        "x = math.pi\n```\n",
        encoding="utf-8",
    )
    code = assignments.first_code_cell(chapter)
    assert code == "import math\nx = math.pi"
    compile(code, "setup", "exec")  # the option line kept would be a SyntaxError
