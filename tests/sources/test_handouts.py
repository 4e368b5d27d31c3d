"""What a handout (`make assignments`' student notebook) takes from its chapter, read
without running otter (instructor trial 2026-12-03, findings 1, 9 and 12; issue 39 item
3): the imports its exercises read, from any cell of the chapter, the chapter functions
an exercise's text quotes, never an answer. The build itself, with otter's reference run,
is tests/slow/test_grading.py::test_make_assignments_builds_every_chapter_as_readme_gives_it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from course_grading import assign as assignments

EDITIONS = [(p, "en") for p in assignments.chapters()] + [
    (p, "zh") for p in assignments.chapters(None, ROOT / "book" / "zh")
]


@pytest.mark.parametrize(
    "chapter,edition", EDITIONS, ids=[f"{e}-{p.stem}" for p, e in EDITIONS]
)
def test_a_handout_imports_what_its_exercises_read_and_no_answer(chapter, edition):
    exercises = [ex for ex in assignments.parse_chapter(chapter) if ex.coding]
    imports, context = assignments.handout_setup(chapter, exercises)
    code = imports + "\n" + "\n".join(context)
    namespace: dict = {}
    exec(compile(code, "handout set-up", "exec"), namespace)  # noqa: S102
    for ex in exercises:
        assert ex.check in namespace, (ex.label, ex.check)
        for f in ex.functions:
            assert f not in namespace, f"the handout hands over {f}"
        for name in assignments._free_names(ex.solution_code):
            assert name in namespace or name in {
                g for e in exercises for g in e.functions
            }, (ex.label, name)
    assert "pip install" not in code and "viz" not in code


def _chapter(
    tmp_path: Path, setup: str, solution: str, check: str = "check_masked_attention"
) -> Path:
    text = (
        "# A chapter\n\n```{code-cell} ipython3\n" + setup + "\n```\n\n"
        "```{exercise} Softmax\n:label: ex-x\nWrite `my_f`, like `helper` above.\n```\n\n"
        "```{code-cell} ipython3\ndef my_f(x):\n    raise NotImplementedError\n\n"
        f"{check}(my_f);\n```\n\n"
        "````{solution} ex-x\n:class: dropdown\n```python\n"
        + solution
        + "\n```\n````\n"
    )
    path = tmp_path / "00_x.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_handout_refuses_to_hand_over_an_answer_or_to_miss_a_name(tmp_path):
    """Known wrong: a solution that reads a name the chapter binds by importing an
    answer (chapter 10's first cell imported three), and one that reads a name no cell
    binds, both stop the build with the name; known right: the chapter function the
    text quotes is carried with its imports."""
    good = _chapter(
        tmp_path,
        "import torch\nfrom transformer_course.exercises import check_masked_attention\n"
        "def helper(x):\n    return torch.relu(x)",
        "def my_f(x):\n    return torch.relu(x)",
    )
    exercises = [ex for ex in assignments.parse_chapter(good) if ex.coding]
    imports, context = assignments.handout_setup(good, exercises)
    assert imports.splitlines() == [
        "import torch",
        "from transformer_course.exercises import check_masked_attention",
    ]
    assert [c.split("(")[0] for c in context] == ["def helper"]
    answer = _chapter(  # chapter 2's softmax exercise forbids the library's
        tmp_path,
        "from transformer_course.exercises import check_stable_softmax\n"
        "from transformer_course.attention import masked_softmax",
        "def my_f(x):\n    return masked_softmax(x)",
        "check_stable_softmax",
    )
    with pytest.raises(assignments.HandoutError, match="masked_softmax"):
        assignments.handout_setup(
            answer, [ex for ex in assignments.parse_chapter(answer) if ex.coding]
        )
    missing = _chapter(
        tmp_path,
        "from transformer_course.exercises import check_masked_attention",
        "def my_f(x):\n    return torch.relu(x)",
    )
    with pytest.raises(assignments.HandoutError, match="'torch'"):
        assignments.handout_setup(
            missing, [ex for ex in assignments.parse_chapter(missing) if ex.coding]
        )
