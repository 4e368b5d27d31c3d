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


# ------------------------------------- no chapter hands over an exercise's answer


def _bound_before(text: str, position: int) -> dict[str, str]:
    """The names that the code cells of a chapter's ``text`` before ``position`` bind
    to a library object (``from M import name [as alias]``, ``alias = M.name``): local
    name -> the object's dotted name."""
    import ast

    from transformer_course.exercises._method import _dotted, _resolve

    bound: dict[str, str] = {}
    for cell in assignments.CODE_CELL.finditer(text):
        if cell.start() >= position:
            break
        try:
            tree = ast.parse(cell["body"])
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
                dotted = _dotted(node.value)
                head = (dotted or "").partition(".")[0]
                for target in node.targets:
                    if isinstance(target, ast.Name) and head in bound:
                        rest = dotted.partition(".")[2]
                        bound[target.id] = f"{bound[head]}.{rest}"
    return {name: dotted for name, dotted in bound.items() if _resolve(dotted)}


def handed_over(text: str, label: str, forbidden) -> list[str]:
    """The names that a chapter's cells before exercise ``label`` bind, by name, to one
    of ``forbidden`` (what the exercise's check refuses): each is an answer a learner
    finds ready-made in the notebook."""
    from transformer_course.exercises._method import _resolve

    wanted = {id(f) for f in forbidden}
    position = text.find(f":label: {label}\n")
    return sorted(
        f"{name} ({dotted})"
        for name, dotted in _bound_before(text, position).items()
        if id(_resolve(dotted)) in wanted
    )


FORBIDDING = [
    (c, ex)
    for c, ex in CODING
    if getattr(getattr(exercises, ex.check), "forbidden", ())
]


@pytest.mark.parametrize(
    "chapter,exercise", FORBIDDING, ids=[f"{c}-{ex.label}" for c, ex in FORBIDDING]
)
def test_no_cell_before_an_exercise_imports_the_function_it_asks_for(chapter, exercise):
    """Learner trial 2026-12-03, findings 2 and 9: chapters 5 and 10 imported
    ``causal_mask``, ``RMSNorm``, ``kv_cache_bytes_per_token`` and
    ``permute_rotary_rows`` by name in their first cell, so the answer was one call
    away. The library may be used before an exercise through its module (the check
    refuses a call of it); a name bound to what the check forbids may not."""
    forbidden = getattr(exercises, exercise.check).forbidden
    for path in (
        ROOT / "book" / f"{chapter}.md",
        ROOT / "book" / "zh" / f"{chapter}.md",
    ):
        found = handed_over(path.read_text(encoding="utf-8"), exercise.label, forbidden)
        assert not found, f"{path.name}: before {exercise.label}: {found}"


def test_handed_over_sees_a_name_imported_before_the_exercise():
    """Known wrong: chapter 5's first cell as it was (b4e74ea), and an alias."""
    from transformer_course.masks import causal_mask

    text = (
        "```{code-cell} ipython3\n:tags: [hide-input]\nimport torch\n"
        "from transformer_course.masks import (\n    causal_mask,\n    padding_mask,\n)\n"
        "from transformer_course import masks\nmine = masks.causal_mask\n```\n\n"
        "```{exercise} A causal mask\n:label: ex-masks-causal\nWrite it.\n```\n\n"
        "```{code-cell} ipython3\nfrom transformer_course.masks import causal_mask "
        "as later\n```\n"
    )
    found = handed_over(text, "ex-masks-causal", (causal_mask,))
    assert found == [
        "causal_mask (transformer_course.masks.causal_mask)",
        "mine (transformer_course.masks.causal_mask)",
    ]
    assert handed_over(text, "ex-masks-causal", ()) == []


def test_every_exercise_that_forbids_the_library_declares_it():
    """One mechanism (``_method.forbids``) for all chapters: every coding exercise of
    chapters 1-10 whose chapter has a library version of the answer declares it, so
    an answer that only calls it is refused (learner trial 2026-12-03, finding 2)."""
    free = {"check_split_qkv", "check_merge_folded_heads", "check_decoder_mask"}
    missing = [
        f"{c}: {ex.check}"
        for c, ex in CODING
        if ex.check not in free
        and not getattr(getattr(exercises, ex.check), "forbidden", ())
    ]
    assert not missing, missing
