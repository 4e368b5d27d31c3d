"""End-to-end tests of the instructor workflow (tools/assignments.py, book/instructor_guide.md).

Builds the otter assignments of chapters 1 and 2 once into a temporary folder, fills the
student notebooks the way learners (and cheaters) would, grades them all with
`tools/assignments.py grade` (what `make grade` runs) and checks grades.csv, the otter
scores and the feedback files. The malicious submissions pin what plain `otter run`
lets through without Docker (measured; written up in book/instructor_guide.md) and that
the grade we record does not rise.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import assignments

CHAPTERS = ["01_qkv", "02_scaled_dot_product"]
# Seconds for one submission's otter run; the infinite loops use all of it.
TIMEOUT = float(os.environ.get("GRADING_TEST_TIMEOUT", "90"))
CALL_TIMEOUT = 15.0

# A wrong answer for each chapter's second question: the scores are not scaled.
WRONG = {
    "01_qkv": """def attention(q, k, v):
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ v, weights""",
    "02_scaled_dot_product": """def attention_bthd(q, k, v, key_padding_mask=None):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    scores = q @ k.transpose(-2, -1)
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).transpose(1, 2), weights""",
}

# Each attack goes in front of the (unanswered) first stub; every answer stays a stub.
ATTACKS = {
    # replaces every self-check in the learner's process by one that passes
    "patch_checker": """import transformer_course.exercises as _checks
for _name in dir(_checks):
    if _name.startswith("check_"):
        setattr(_checks, _name, lambda *args, **kwargs: True)
""",
    # makes otter's test runner skip every test function (so nothing can fail)
    "patch_otter": """import otter.test_files.exception_test as _exc
_exc.test_case.call_func = lambda self, env: None
""",
    # reads the hidden tests from disk, prints them, and rewrites them to always pass
    "rewrite_hidden_tests": """import glob as _glob
for _path in _glob.glob("tests/*.py"):
    _text = open(_path).read()
    print(_text)
    _text = _text.replace("assert check_", "assert True or check_")
    _text = _text.replace("public_test(", "(lambda *args: True)(")
    open(_path, "w").write(_text)
""",
    # rewrites the results otter pickles at the end, marking every test case passed
    "overwrite_results": """import pickle as _pickle
_dump = _pickle.dump
def _forged(obj, f, *args, **kwargs):
    for _tf in getattr(obj, "results", {}).values():
        for _r in _tf.test_case_results:
            _r.passed = True
    return _dump(obj, f, *args, **kwargs)
_pickle.dump = _forged
""",
}
MALICIOUS = {"01_qkv": ["patch_checker", "patch_otter"],
             "02_scaled_dot_product": ["rewrite_hidden_tests", "overwrite_results"]}


def _fill(student_nb: Path, answers: list[str | None], out: Path) -> None:
    nb = nbformat.read(student_nb, as_version=4)
    cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    assert len(cells) == len(answers)
    for cell, answer in zip(cells, answers):
        if answer is not None:
            cell.source = answer
    nbformat.write(nb, out)


def _submissions(chapter: str, student_nb: Path, folder: Path) -> dict[str, str]:
    """Writes this chapter's submissions; returns {student: kind}."""
    exercises = [e for e in assignments.parse_chapter(ROOT / "book" / f"{chapter}.md")
                 if e.coding]
    ref = [f"{e.solution_code}\n\n{e.check}({', '.join(e.functions)});" for e in exercises]
    stubs: list[str | None] = [None] * len(ref)
    kinds = {
        "reference": ref,
        "half_right": [ref[0], WRONG[chapter], *stubs[2:]],
        "raises": [ref[0].replace(
            ref[0].split("\n", 1)[1].split("\n\n")[0],
            '    raise ValueError("the learner\'s own error")'), *ref[1:]],
        "infinite_loop": [ref[0].replace(
            ref[0].split("\n", 1)[1].split("\n\n")[0], "    while True:\n        pass"),
            *ref[1:]],
    }
    stub0 = nbformat.read(student_nb, as_version=4)
    first_stub = next(c.source for c in stub0.cells
                      if "otter_answer_cell" in c.metadata.get("tags", []))
    for attack in MALICIOUS[chapter]:
        kinds[attack] = [ATTACKS[attack] + first_stub, *stubs[1:]]
    students = {}
    for kind, answers in kinds.items():
        student = f"{chapter[:2]}_{kind}"
        _fill(student_nb, answers, folder / f"{student}.ipynb")
        students[student] = kind
    return students


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    dist, subs, out = base / "assignments", base / "submissions", base / "results"
    subs.mkdir()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "assignments.py"), "assign", "--no-run-tests",
         "--chapters", *CHAPTERS, "--out", str(dist)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assign_s = time.perf_counter() - start
    kinds = {}
    for chapter in CHAPTERS:
        kinds.update(_submissions(chapter, dist / chapter / "student" / f"{chapter}.ipynb", subs))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "assignments.py"), "grade", str(subs),
         "--assignments", str(dist), "--out", str(out), "--timeout", str(TIMEOUT),
         "--call-timeout", str(CALL_TIMEOUT), "--jobs", "3"],
        capture_output=True, text=True, timeout=3600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    grade_s = time.perf_counter() - start
    print(f"\nassign {assign_s:.0f} s, grade {len(kinds)} submissions {grade_s:.0f} s\n"
          + done.stdout)

    def read(name):
        with open(out / name) as f:
            return {row["student"]: row for row in csv.DictReader(f)}

    specs = {c: json.loads((dist / c / "grading.json").read_text()) for c in CHAPTERS}
    results = {r["student"]: r for r in json.loads((out / "results.json").read_text())}
    return {"dist": dist, "out": out, "kinds": kinds, "grades": read("grades.csv"),
            "otter": read("otter_grades.csv"), "specs": specs, "results": results,
            "stdout": done.stdout}


def _possible(graded, chapter):
    return sum(float(q["points"]) for q in graded["specs"][chapter]["questions"])


def _total(graded, table, student):
    return float(graded[table][student]["total"])


def test_assign_leaves_student_notebook_and_autograder(graded):
    import zipfile

    for chapter in CHAPTERS:
        folder = graded["dist"] / chapter
        nb = json.loads((folder / "student" / f"{chapter}.ipynb").read_text())
        student = "\n".join("".join(c["source"]) for c in nb["cells"]) + json.dumps(
            nb["metadata"])
        zips = list((folder / "autograder").glob("*.zip"))
        assert len(zips) == 1
        names = zipfile.ZipFile(zips[0]).namelist()
        assert {"run_autograder", "setup.sh", "otter_config.json"} <= set(names)
        spec = graded["specs"][chapter]
        assert len(spec["questions"]) >= 2
        for q in spec["questions"]:
            assert f"tests/{q['name']}.py" in names  # public and hidden tests
            test = zipfile.ZipFile(zips[0]).read(f"tests/{q['name']}.py").decode()
            assert "hidden=True" in test and f"assert {q['check']}(" in test
        assert "BEGIN SOLUTION" not in student and "# END SOLUTION" not in student
        assert "hidden=True" not in student  # public tests only
        assert 'raise NotImplementedError("your code here")' in student
        assert "transformer_course @ git+" in student  # installs like the chapter does
        # the reference solutions are not in the student notebook
        for ex in assignments.parse_chapter(ROOT / "book" / f"{chapter}.md"):
            if ex.coding:
                body = ex.solution_code.split("\n", 1)[1]  # all but the def line
                assert body not in student, body


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_reference_solutions_get_full_marks(graded, chapter):
    student = f"{chapter[:2]}_reference"
    assert _total(graded, "grades", student) == _possible(graded, chapter)
    assert _total(graded, "otter", student) == _possible(graded, chapter)
    assert graded["grades"][student]["flags"] == ""


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_half_right_gets_partial_marks(graded, chapter):
    student = f"{chapter[:2]}_half_right"
    row, questions = graded["grades"][student], graded["specs"][chapter]["questions"]
    assert float(row[questions[0]["name"]]) == questions[0]["points"]
    assert float(row[questions[1]["name"]]) == 0
    assert 0 < _total(graded, "grades", student) < _possible(graded, chapter)
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "without the 1/sqrt(d" in feedback or "sqrt(d" in feedback  # the check's hint
    assert "not attempted yet" in feedback  # the untouched stub


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_raising_answer_scores_zero_with_feedback(graded, chapter):
    student = f"{chapter[:2]}_raises"
    row, questions = graded["grades"][student], graded["specs"][chapter]["questions"]
    assert float(row[questions[0]["name"]]) == 0
    assert _total(graded, "grades", student) == _possible(graded, chapter) - questions[0][
        "points"]
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "ValueError" in feedback and "the learner's own error" in feedback


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_an_infinite_loop_is_stopped_and_scores_zero(graded, chapter):
    student = f"{chapter[:2]}_infinite_loop"
    result = graded["results"][student]
    assert result["status"].startswith("time limit")
    assert _total(graded, "grades", student) == 0
    # stopped by the limit, not after it: otter's run, then the re-check's calls
    assert result["otter_seconds"] < TIMEOUT + 15
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "time limit" in feedback
    # the submissions graded after it were graded normally
    assert _total(graded, "grades", f"{chapter[:2]}_reference") == _possible(graded, chapter)


@pytest.mark.parametrize("chapter,attack", [(c, a) for c in CHAPTERS for a in MALICIOUS[c]])
def test_malicious_submission_does_not_raise_its_score(graded, chapter, attack):
    student = f"{chapter[:2]}_{attack}"
    # measured: without Docker, plain `otter run` gives this submission full marks ...
    assert _total(graded, "otter", student) == _possible(graded, chapter), (
        f"otter alone no longer falls for {attack}: update book/instructor_guide.md")
    # ... but the grade recorded is that of its (unanswered) stubs, and it is flagged
    assert _total(graded, "grades", student) == 0
    assert graded["grades"][student]["flags"]
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "isolated re-check" in feedback


def test_grades_csv_has_one_row_per_student_and_a_column_per_question(graded):
    grades = graded["grades"]
    assert set(grades) == set(graded["kinds"])
    columns = next(iter(grades.values())).keys()
    for chapter in CHAPTERS:
        for q in graded["specs"][chapter]["questions"]:
            assert q["name"] in columns
    assert "total" in columns
    assert all((graded["out"] / "feedback" / f"{s}.md").exists() for s in grades)
    assert "results:" in graded["stdout"]
