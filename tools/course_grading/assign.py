"""Build otter assignments from the chapters' coding exercises (``make assignments``).

For every chapter book/NN_*.md with coding exercises (an {exercise} directive, a code cell
whose stub raises NotImplementedError and calls check_<name>(fn), and a {solution} holding
a ```python block), writes an otter master notebook (one question per exercise: prompt,
reference solution, a public and a hidden test that both run the self-check, the hidden
one with the points), runs `otter assign`, and leaves dist/assignments/<chapter>/ with
student/<chapter>.ipynb, autograder/<chapter>-autograder_*.zip and grading.json (what the
isolated re-check needs). The copies with solutions are renamed *-SOLUTIONS.ipynb.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml
from sync_notebooks import install_cell, repository, to_plain_markdown

from course_grading.handout import embed_public_tests
from course_grading.recheck import check_module

ROOT = Path(__file__).resolve().parents[2]

CHAPTER = re.compile(r"^\d\d_.+\.md$")
DIRECTIVE = re.compile(
    r"^(?P<fence>`{3,})\{(?P<name>exercise|solution)\}[ \t]*(?P<arg>[^\n]*)\n"
    r"(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
# a cell's body, after its MyST option lines (":tags: [hide-input]"), which are no Python
CODE_CELL = re.compile(
    r"^```\{code-cell\}[^\n]*\n(?::[^\n]*\n)*(?P<body>.*?)^```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
PYTHON_BLOCK = re.compile(
    r"^```python[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL
)
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
        label = (
            options.get("label", "") if m["name"] == "exercise" else m["arg"].strip()
        )
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
    """The chapters ``book/NN_*.md``; ``selected`` holds numbers ("2", "02") or names.
    Raises ``SystemExit`` naming the valid chapters for a name that matches none."""
    paths = sorted(p for p in (ROOT / "book").glob("*.md") if CHAPTER.match(p.name))
    if not selected:
        return paths
    chosen = []
    for s in selected:
        key = s.zfill(2) if s.isdigit() else s.removesuffix(".md").removeprefix("book/")
        match = [p for p in paths if p.stem == key or p.stem.startswith(key + "_")]
        if not match:
            raise SystemExit(
                f"--chapters: no chapter {s!r}; valid: "
                + ", ".join(p.stem for p in paths)
            )
        chosen += [p for p in match if p not in chosen]
    return chosen


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
    """The public test (0 points) and the hidden test (the points) both assert the
    self-check, so a public test never passes where the self-check beside it fails."""
    params = ", ".join(ex.functions)
    call_args = ", ".join(
        ex.functions + tuple(f"{k}={v!r}" for k, v in ex.kwargs.items())
    )
    kind = "hidden" if hidden else "public"
    return _code(
        f'""" # BEGIN TEST CONFIG\nhidden: {str(hidden).lower()}\npoints: {points}\n'
        f'""" # END TEST CONFIG\n'
        f"def test_{kind}({params}):\n"
        f"    from {check_module(ex.check)} import {ex.check}\n"
        f"    assert {ex.check}({call_args}), 'the self-check did not pass'\n"
    )


def _solution_cell(ex: Exercise) -> nbformat.NotebookNode:
    """The reference solution (stripped by otter) and, for the student, the stub."""
    stub = ex.stub
    tree = ast.parse(stub)
    check_lines = [
        ast.get_source_segment(stub, n)
        for n in tree.body
        if not isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))
    ]
    defs = "\n\n".join(
        ast.get_source_segment(stub, n)
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    )
    prompt = '""" # BEGIN PROMPT\n' + defs + '\n"""  # END PROMPT'
    source = (
        f"# BEGIN SOLUTION NO PROMPT\n{ex.solution_code}\n# END SOLUTION\n{prompt}\n\n"
    )
    source += "\n".join(line.rstrip(";") + ";" for line in check_lines if line)
    return _code(source)


def master_notebook(
    path: Path, exercises: list[Exercise], points: dict[str, float]
) -> nbformat.NotebookNode:
    url, _ = repository()
    branch = commit()  # the library exactly as it was when the assignment was built
    title = path.read_text(encoding="utf-8").split("\n# ", 1)[1].split("\n", 1)[0]
    requirements = [
        "otter-grader==7.0.0",
        f"transformer_course @ git+{url}@{branch}",
    ]
    config = {
        "name": path.stem,
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "requirements": requirements,
        "overwrite_requirements": False,
        "init_cell": False,  # our own, after the set-up cell that installs otter
        "check_all_cell": True,
        "export_cell": {"pdf": False, "run_tests": True},
        "generate": {"pdf": False, "show_stdout": True, "show_hidden": True},
        "tests": {"ok_format": False, "files": True},
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
        _md(
            f"# Exercises: {title}\n\n"
            "Replace each `raise NotImplementedError(...)` with your code, run the cell, "
            "and read its self-check; `grader.check(...)` runs the public tests. "
            "The chapter this comes from explains everything you need."
        ),
        _code(setup),
        _code(first_code_cell(path)),
        _code(
            f'# Initialize Otter\nimport otter\ngrader = otter.Notebook("{path.stem}.ipynb")'
        ),
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
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    return nb


def _points(items: list[str] | None) -> dict[str, float]:
    points = {}
    for item in items or []:
        label, _, value = item.partition("=")
        try:
            points[label] = float(value)
        except ValueError:
            raise SystemExit(f"--points: expected LABEL=N, got {item!r}") from None
    return points


def _unknown(option: str, asked, valid: list[str]) -> None:
    bad = [x for x in asked if x not in valid]
    if bad:
        raise SystemExit(
            f"{option}: no coding exercise {', '.join(map(repr, bad))} in the "
            f"chosen chapters; valid labels: {', '.join(valid)}"
        )


def commit() -> str:
    """The commit of the repository that builds the assignment (the library it pins)."""
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else repository()[1]


def assign(args: argparse.Namespace) -> int:
    points = _points(args.points)
    paths = chapters(args.chapters)
    found = {p: [ex for ex in parse_chapter(p) if ex.coding] for p in paths}
    labels = [ex.label for exs in found.values() for ex in exs]
    _unknown("--only", args.only or [], labels)
    _unknown("--points", points, labels)
    out_root = Path(args.out).resolve()
    built = []
    for path, exercises in found.items():
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
        cmd = [
            sys.executable,
            "-m",
            "otter",
            "assign",
            "--no-pdfs",
            str(master),
            str(out),
        ]
        if args.no_run_tests:
            cmd.append("--no-run-tests")
        start = time.perf_counter()
        done = subprocess.run(
            cmd, cwd=master.parent, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
            print(f"otter assign failed for {path.stem}", file=sys.stderr)
            return 1
        spec = {
            "assignment": path.stem,
            "questions": [
                {
                    "name": ex.name,
                    "label": ex.label,
                    "points": points.get(ex.label, DEFAULT_POINTS),
                    "check": ex.check,
                    "module": check_module(ex.check),
                    "functions": list(ex.functions),
                    "kwargs": ex.kwargs,
                }
                for ex in exercises
            ],
        }
        (out / "grading.json").write_text(json.dumps(spec, indent=2))
        embed_public_tests(out / "student" / f"{path.stem}.ipynb")
        # the copies with solutions get names that cannot be mistaken for the handout
        for copy, new in (
            (out / "autograder" / f"{path.stem}.ipynb", "SOLUTIONS"),
            (master, "master-SOLUTIONS"),
        ):
            if copy.exists():
                copy.rename(copy.with_name(f"{path.stem}-{new}.ipynb"))
        zips = sorted((out / "autograder").glob("*.zip"))
        total = sum(q["points"] for q in spec["questions"])
        print(
            f"{path.stem}: {len(exercises)} questions, {total:g} points, "
            f"{time.perf_counter() - start:.0f} s -> {out.relative_to(out_root.parent)}/"
            f"student/{path.stem}.ipynb, autograder/{zips[0].name if zips else '?'}"
        )
        built.append(path.stem)
    print(f"assignments in {out_root}: {', '.join(built) or 'none'}")
    return 0
