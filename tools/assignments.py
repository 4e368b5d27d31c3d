"""Instructor workflow on otter-grader: build assignments from the chapters' exercises and
grade submitted notebooks. Explained in book/instructor_guide.md.

    python tools/assignments.py assign [--chapters 01 02] [--only LABEL ...]
                                       [--points LABEL=N ...] [--out dist/assignments]
    python tools/assignments.py grade SUBMISSIONS [--assignments dist/assignments]
                                      [--out DIR] [--timeout 600] [--call-timeout 60] [--jobs 1]

assign: for every chapter book/NN_*.md with coding exercises (an {exercise} directive, a
code cell whose stub raises NotImplementedError and calls check_<name>(fn), and a
{solution} holding a ```python block), writes an otter master notebook (one question per
exercise: prompt, reference solution, a public test that the function is implemented and
returns the right shapes, a hidden test `assert check_<name>(fn)`), runs `otter assign`,
and leaves dist/assignments/<chapter>/ with student/<chapter>.ipynb, autograder/
<chapter>-autograder_*.zip and grading.json (what the isolated re-check needs).

grade: for every submitted notebook (SUBMISSIONS/<student>.ipynb or SUBMISSIONS/<student>/
*.ipynb), in its own temporary folder with a fresh copy of the autograder zip: `otter run`
in a separate process group under a time limit, then the isolated re-check
(transformer_course.grading) in another process. A question scores when both pass it.
Writes grades.csv, otter_grades.csv and feedback/<student>.md into the results folder.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from sync_notebooks import install_cell, repository, to_plain_markdown

CHAPTER = re.compile(r"^\d\d_.+\.md$")
DIRECTIVE = re.compile(
    r"^(?P<fence>`{3,})\{(?P<name>exercise|solution)\}[ \t]*(?P<arg>[^\n]*)\n"
    r"(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
DEFAULT_POINTS = 1


@dataclass
class Exercise:
    """One exercise of a chapter; ``check`` is set for auto-checked coding exercises."""

    chapter: str
    label: str
    title: str
    text: str
    stub: str | None = None  # the code cell after the exercise
    solution_text: str | None = None  # the body of the {solution} directive
    check: str | None = None  # check_<name>
    functions: tuple[str, ...] = ()  # the learner's functions the check is called with
    kwargs: dict | None = None  # constant keyword arguments of the check call
    hidden: bool = False  # the solution starts hidden (:class: dropdown)

    @property
    def name(self) -> str:  # otter question names are identifiers
        return self.label.replace("-", "_")

    @property
    def solution_code(self) -> str | None:
        blocks = PYTHON_BLOCK.findall(self.solution_text or "")
        return "\n\n".join(b.rstrip() for b in blocks) if blocks else None

    @property
    def coding(self) -> bool:
        return self.check is not None and self.solution_code is not None


def _options(body: str) -> tuple[dict[str, str], str]:
    options, lines = {}, body.split("\n")
    while lines and lines[0].startswith(":"):
        key, _, value = lines.pop(0)[1:].partition(":")
        options[key.strip()] = value.strip()
    return options, "\n".join(lines).strip("\n")


def _check_call(stub: str) -> tuple[str, tuple[str, ...], dict] | None:
    """The last top-level ``check_<name>(fn, ..., key=constant)`` call in a stub cell."""
    try:
        tree = ast.parse(stub)
    except SyntaxError:
        return None
    found = None
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        if not call.func.id.startswith("check_"):
            continue
        if all(isinstance(a, ast.Name) for a in call.args):
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            found = call.func.id, tuple(a.id for a in call.args), kwargs
    return found


def parse_chapter(path: Path) -> list[Exercise]:
    """Every exercise of a chapter, in order, with its stub cell and solution."""
    text = path.read_text(encoding="utf-8")
    chapter = path.stem
    exercises: dict[str, Exercise] = {}
    order: list[tuple[int, int, Exercise]] = []
    for m in DIRECTIVE.finditer(text):
        options, body = _options(m["body"])
        label = options.get("label", "") if m["name"] == "exercise" else m["arg"].strip()
        if m["name"] == "exercise":
            ex = Exercise(chapter, label, m["arg"].strip() or "Exercise", body)
            exercises[label] = ex
            order.append((m.start(), m.end(), ex))
        elif label in exercises:
            exercises[label].solution_text = body
            exercises[label].hidden = "dropdown" in options.get("class", "").split()
    starts = [s for s, _, _ in order] + [len(text)]
    for (_, end, ex), nxt in zip(order, starts[1:]):
        segment = text[end:nxt]
        solution_at = segment.find("{solution}")
        cell = CODE_CELL.search(segment[: solution_at if solution_at >= 0 else None])
        if cell and "NotImplementedError" in cell["body"]:
            ex.stub = cell["body"].rstrip()
            found = _check_call(ex.stub)
            if found:
                ex.check, ex.functions, ex.kwargs = found
    return [ex for _, _, ex in order]


def chapters(selected: list[str] | None = None) -> list[Path]:
    paths = sorted(p for p in (ROOT / "book").glob("*.md") if CHAPTER.match(p.name))
    if selected:
        paths = [p for p in paths if any(p.stem.startswith(s) for s in selected)]
    return paths


def first_code_cell(path: Path) -> str:
    m = CODE_CELL.search(path.read_text(encoding="utf-8"))
    return m["body"].rstrip() if m else ""


# ------------------------------------------------------------------------ otter assign


def _raw(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_raw_cell(text)


def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(text)


def _test_cell(ex: Exercise, hidden: bool, points: float) -> nbformat.NotebookNode:
    params = ", ".join(ex.functions)
    call_args = ", ".join(ex.functions + tuple(f"{k}={v!r}" for k, v in ex.kwargs.items()))
    if hidden:
        body = f"    assert {ex.check}({call_args}), 'the self-check did not pass'"
    else:
        body = (
            "    from transformer_course.exercises import public_test\n"
            f"    public_test({ex.check}, {params})"
        )
    kind = "hidden" if hidden else "public"
    return _code(
        f'""" # BEGIN TEST CONFIG\nhidden: {str(hidden).lower()}\npoints: {points}\n'
        f'""" # END TEST CONFIG\n'
        f"def test_{kind}({params}):\n"
        f"    from transformer_course.exercises import {ex.check}\n{body}\n"
    )


def _solution_cell(ex: Exercise) -> nbformat.NotebookNode:
    """The reference solution (stripped by otter) and, for the student, the stub."""
    stub = ex.stub
    tree = ast.parse(stub)
    check_lines = [ast.get_source_segment(stub, n) for n in tree.body
                   if not isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))]
    defs = "\n\n".join(ast.get_source_segment(stub, n) for n in tree.body
                       if isinstance(n, ast.FunctionDef))
    prompt = '""" # BEGIN PROMPT\n' + defs + '\n"""  # END PROMPT'
    source = f"# BEGIN SOLUTION NO PROMPT\n{ex.solution_code}\n# END SOLUTION\n{prompt}\n\n"
    source += "\n".join(line.rstrip(";") + ";" for line in check_lines if line)
    return _code(source)


def master_notebook(path: Path, exercises: list[Exercise],
                    points: dict[str, float]) -> nbformat.NotebookNode:
    url, branch = repository()
    title = path.read_text(encoding="utf-8").split("\n# ", 1)[1].split("\n", 1)[0]
    requirements = [
        "otter-grader==7.0.0",
        f"transformer_course @ git+{url}@{branch}",
    ]
    config = {
        "name": path.stem,
        "requirements": requirements,
        "overwrite_requirements": False,
        "init_cell": False,  # our own, after the set-up cell that installs otter
        "check_all_cell": True,
        "export_cell": {"pdf": False, "run_tests": True},
        "generate": {"pdf": False, "show_stdout": True, "show_hidden": True},
        "tests": {"ok_format": False, "files": False},
        "run_tests": True,
    }
    setup = install_cell(url, branch).source.replace(
        'if importlib.util.find_spec("transformer_course") is None:',
        'if importlib.util.find_spec("otter") is None:\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", '
        '"otter-grader==7.0.0"], check=True)\n'
        'if importlib.util.find_spec("transformer_course") is None:',
    )
    cells = [
        _raw("# ASSIGNMENT CONFIG\n" + yaml.safe_dump(config, sort_keys=False)),
        _md(f"# Exercises: {title}\n\n"
            "Replace each `raise NotImplementedError(...)` with your code, run the cell, "
            "and read its self-check; `grader.check(...)` runs the public tests. "
            "The chapter this comes from explains everything you need."),
        _code(setup),
        _code(first_code_cell(path)),
        _code(f'# Initialize Otter\nimport otter\ngrader = otter.Notebook("{path.stem}.ipynb")'),
    ]
    for ex in exercises:
        pts = points.get(ex.label, DEFAULT_POINTS)
        cells += [
            _raw(f"# BEGIN QUESTION\nname: {ex.name}\npoints: [0, {pts}]"),
            _md(f"## {ex.title}\n\n{to_plain_markdown(ex.text)}"),
            _raw("# BEGIN SOLUTION"),
            _solution_cell(ex),
            _raw("# END SOLUTION"),
            _raw("# BEGIN TESTS"),
            _test_cell(ex, hidden=False, points=0),
            _test_cell(ex, hidden=True, points=pts),
            _raw("# END TESTS"),
            _raw("# END QUESTION"),
        ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)",
                                 "language": "python", "name": "python3"}
    return nb


def assign(args: argparse.Namespace) -> int:
    points = {}
    for item in args.points or []:
        label, _, value = item.partition("=")
        points[label] = float(value)
    out_root = Path(args.out).resolve()
    built = []
    for path in chapters(args.chapters):
        exercises = [ex for ex in parse_chapter(path) if ex.coding]
        if args.only:
            exercises = [ex for ex in exercises if ex.label in args.only]
        if not exercises:
            continue
        out = out_root / path.stem
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        master = out / "master" / f"{path.stem}.ipynb"
        master.parent.mkdir()
        nbformat.write(master_notebook(path, exercises, points), master)
        cmd = [sys.executable, "-m", "otter", "assign", "--no-pdfs", str(master), str(out)]
        if args.no_run_tests:
            cmd.append("--no-run-tests")
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=master.parent, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
            print(f"otter assign failed for {path.stem}", file=sys.stderr)
            return 1
        spec = {"assignment": path.stem, "questions": [
            {"name": ex.name, "label": ex.label, "points": points.get(ex.label, DEFAULT_POINTS),
             "check": ex.check, "functions": list(ex.functions), "kwargs": ex.kwargs}
            for ex in exercises
        ]}
        (out / "grading.json").write_text(json.dumps(spec, indent=2))
        zips = sorted((out / "autograder").glob("*.zip"))
        total = sum(q["points"] for q in spec["questions"])
        print(f"{path.stem}: {len(exercises)} questions, {total:g} points, "
              f"{time.perf_counter() - start:.0f} s -> {out.relative_to(out_root.parent)}/"
              f"student/{path.stem}.ipynb, autograder/{zips[0].name if zips else '?'}")
        built.append(path.stem)
    print(f"assignments in {out_root}: {', '.join(built) or 'none'}")
    return 0


# ------------------------------------------------------------------------------- grade


def _assignment_name(nb_path: Path) -> str | None:
    try:
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (nb.get("metadata", {}).get("otter", {}) or {}).get("assignment_name")


def find_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(student, notebook): SUBMISSIONS/<student>.ipynb or SUBMISSIONS/<student>/*.ipynb."""
    found = []
    for p in sorted(folder.iterdir()):
        if p.suffix == ".ipynb" and p.is_file():
            found.append((p.stem, p))
        elif p.is_dir():
            nbs = sorted(p.glob("*.ipynb"))
            if nbs:
                found.append((p.name, nbs[0]))
    return found


def _run_limited(cmd: list[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    """Run in a new process group; kill the whole group at the time limit (rc None)."""
    with open(cwd / "log.txt", "w+b") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # also any process the notebook left behind
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        log.seek(0)
        return rc, log.read().decode("utf-8", "replace")


def grade_one(student: str, nb_path: Path, zip_bytes: bytes, zip_name: str, spec: dict,
              timeout: float, call_timeout: float) -> dict:
    """Grade one submission in a fresh temporary folder; returns scores and feedback."""
    work = Path(tempfile.mkdtemp(prefix=f"grade-{student}-"))
    try:
        (work / "otter").mkdir()
        (work / "out").mkdir()
        submission = work / "otter" / "submission.ipynb"
        shutil.copy(nb_path, submission)
        (work / zip_name).write_bytes(zip_bytes)
        start = time.perf_counter()
        rc, _ = _run_limited(
            [sys.executable, "-m", "otter", "run", "--no-logo", "-a", str(work / zip_name),
             "-o", str(work / "out"), str(submission)], work / "otter", timeout)
        otter_s = time.perf_counter() - start
        otter_scores, otter_tests, status = {}, {}, "ok"
        result_file = work / "out" / "results.json"
        if rc is None:
            status = f"time limit: otter run stopped after {timeout:g} s"
        elif rc != 0 or not result_file.exists():
            status = f"otter run failed (exit code {rc})"
        else:
            for t in json.loads(result_file.read_text()).get("tests", []):
                q = t.get("name", "").split(" - ")[0]
                otter_scores[q] = otter_scores.get(q, 0.0) + float(t.get("score") or 0)
                otter_tests.setdefault(q, []).append(t.get("output", ""))
        (work / "spec.json").write_text(json.dumps(spec))
        recheck_dir = work / "recheck"
        recheck_dir.mkdir()
        shutil.copy(nb_path, recheck_dir / "submission.ipynb")
        _, out2 = _run_limited(
            [sys.executable, "-m", "transformer_course.grading", "recheck",
             str(work / "spec.json"), str(recheck_dir / "submission.ipynb"),
             str(call_timeout)], recheck_dir, timeout)
        try:
            rechecked = json.loads(out2.strip().splitlines()[-1])
        except (ValueError, IndexError):
            rechecked = {}
        rows, notes = {}, []
        for q in spec["questions"]:
            name, pts = q["name"], float(q["points"])
            o = otter_scores.get(name, 0.0)
            r = float(rechecked.get(name, {}).get("score", 0.0))
            rows[name] = min(o, r, pts)
            if o > r:
                notes.append(f"{name}: otter gave {o:g} but the isolated re-check {r:g}")
        return {"student": student, "assignment": spec["assignment"], "status": status,
                "scores": rows, "otter": otter_scores, "otter_tests": otter_tests,
                "recheck": rechecked, "flags": notes, "seconds": time.perf_counter() - start,
                "otter_seconds": otter_s}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def feedback(result: dict, spec: dict) -> str:
    lines = [f"# Feedback for {result['student']} ({result['assignment']})", ""]
    total = sum(result["scores"].values())
    possible = sum(float(q["points"]) for q in spec["questions"])
    lines += [f"Total: {total:g} / {possible:g}", ""]
    if result["status"] != "ok":
        lines += [(f"**{result['status']}**: no question of this notebook could be graded "
                   "by otter; every question scores 0."), ""]
    setup = result["recheck"].get("_setup", {}).get("message")
    if setup:
        lines += [f"Cells that raised while running your notebook: {setup}", ""]
    for q in spec["questions"]:
        name = q["name"]
        lines += [f"## {q['label']}: {result['scores'][name]:g} / {float(q['points']):g}", ""]
        msg = result["recheck"].get(name, {}).get("message", "")
        if msg:
            lines += ["```", msg, "```", ""]
        for out in result["otter_tests"].get(name, []):
            if out.strip():
                lines += ["otter:", "```", out.strip(), "```", ""]
    if result["flags"]:
        lines += ["## Flags for the instructor", ""] + [f"- {f}" for f in result["flags"]]
    return "\n".join(lines) + "\n"


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.py"))}


def grade(args: argparse.Namespace) -> int:
    import transformer_course

    folder = Path(args.submissions).resolve()
    root = Path(args.assignments).resolve()
    out = Path(args.out or ROOT / "dist" / "grades" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    # Everything the grading trusts is read into memory once, before any submission runs.
    specs, zips = {}, {}
    for spec_path in sorted(root.glob("*/grading.json")):
        spec = json.loads(spec_path.read_text())
        zip_path = min((spec_path.parent / "autograder").glob("*.zip"))
        specs[spec["assignment"]] = spec
        zips[spec["assignment"]] = (zip_path.read_bytes(), zip_path.name)
    if not specs:
        print(f"no assignments in {root}: run `make assignments` first", file=sys.stderr)
        return 1
    library = Path(transformer_course.__file__).parent
    library_digest = _tree_digest(library)
    jobs = []
    for student, nb_path in find_submissions(folder):
        name = _assignment_name(nb_path) or args.assignment
        if name not in specs:
            print(f"skipped {nb_path}: unknown assignment {name!r}", file=sys.stderr)
            continue
        jobs.append((student, nb_path, name))
    if not jobs:
        print(f"no submissions found in {folder}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(grade_one, s, p, *zips[a], specs[a], args.timeout,
                               args.call_timeout) for s, p, a in jobs]
        results = [f.result() for f in futures]
    warnings = []
    if _tree_digest(library) != library_digest:
        warnings.append(f"{library} changed on disk while grading (a submission may have "
                        "rewritten the checker): restore it and grade again")
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    questions = [q["name"] for a in sorted({r["assignment"] for r in results})
                 for q in specs[a]["questions"]]
    for filename, key in (("grades.csv", "scores"), ("otter_grades.csv", "otter")):
        with open(out / filename, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", "assignment", *questions, "total", "status", "flags"])
            for r in results:
                vals = [r[key].get(q, "") for q in questions]
                total = sum(v for v in vals if v != "")
                w.writerow([r["student"], r["assignment"], *vals, total, r["status"],
                            " | ".join(r["flags"])])
    for r in results:
        (out / "feedback" / f"{r['student']}.md").write_text(feedback(r, specs[r["assignment"]]))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "warnings.txt").write_text("".join(w + "\n" for w in warnings))
    print(f"graded {len(results)} submissions in {time.perf_counter() - start:.0f} s")
    for r in results:
        print(f"  {r['student']:<24} {sum(r['scores'].values()):g}  {r['status']}  "
              f"(otter {r['otter_seconds']:.0f} s, all {r['seconds']:.0f} s)"
              + ("  FLAGGED" if r["flags"] else ""))
    for w in warnings:
        print(f"WARNING: {w}")
    print(f"results: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assign", help="build dist/assignments/<chapter>/")
    a.add_argument("--chapters", nargs="*", help="chapter numbers or names (default: all)")
    a.add_argument("--only", nargs="*", help="exercise labels to include (default: all)")
    a.add_argument("--points", nargs="*", help="LABEL=N, points of one exercise (default 1)")
    a.add_argument("--out", default=str(ROOT / "dist" / "assignments"))
    a.add_argument("--no-run-tests", action="store_true",
                   help="skip otter's run of the reference solutions")
    g = sub.add_parser("grade", help="grade a folder of submitted notebooks")
    g.add_argument("submissions")
    g.add_argument("--assignments", default=str(ROOT / "dist" / "assignments"))
    g.add_argument("--assignment", help="assignment of notebooks without otter metadata")
    g.add_argument("--out", help="results folder (default dist/grades/<time>)")
    g.add_argument("--timeout", type=float, default=600,
                   help="seconds for one submission's otter run (and for its re-check)")
    g.add_argument("--call-timeout", type=float, default=60,
                   help="seconds for one call of a learner's function in the re-check")
    g.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    args = parser.parse_args(argv)
    return assign(args) if args.command == "assign" else grade(args)


if __name__ == "__main__":
    sys.exit(main())
