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
import builtins
import contextlib
import importlib
import json
import math
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
CODE_CELL = re.compile(  # MyST cell options (":tags: [hide-input]") are not code
    r"^```\{code-cell\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*(?P<body>.*?)^```[ \t]*$",
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


def chapters(selected: list[str] | None = None, book: Path | None = None) -> list[Path]:
    """The chapters ``book/NN_*.md`` (or those of ``book``, e.g. book/zh); ``selected``
    holds numbers ("2", "02", "ch02"), names ("02_scaled_dot_product",
    "scaled_dot_product") or a unique prefix of either ("02_sc", "scaled"). Raises
    ``SystemExit`` naming the valid chapters for one that matches none or several."""
    folder = ROOT / "book" if book is None else book
    paths = sorted(p for p in folder.glob("*.md") if CHAPTER.match(p.name))
    if not selected:
        return paths
    chosen = []
    for s in selected:
        key = re.sub(r"^ch(?=\d)", "", s.removesuffix(".md").rsplit("/", 1)[-1].lower())
        if key.isdigit():
            key = key.zfill(2)
            match = [p for p in paths if p.stem[:2] == key[-2:] and len(key) <= 2]
        else:
            match = [p for p in paths if p.stem == key]
            match = match or [
                p
                for p in paths
                if p.stem.startswith(key) or p.stem.split("_", 1)[1].startswith(key)
            ]
        if len(match) != 1:
            raise SystemExit(
                f"--chapters: {'no' if not match else 'more than one'} chapter {s!r}"
                + (f" ({', '.join(p.stem for p in match)})" if match else "")
                + "; valid: "
                + ", ".join(p.stem for p in paths)
            )
        chosen += [p for p in match if p not in chosen]
    return chosen


def first_code_cell(path: Path) -> str:
    """The code of a chapter's first code cell (its set-up), without the MyST cell
    options such as ``:tags: [hide-input]``, which are not Python."""
    m = CODE_CELL.search(path.read_text(encoding="utf-8"))
    return m["body"].rstrip() if m else ""  # CODE_CELL leaves the options out


# ------------------------------------------------------------- what a handout keeps


def _free_names(code: str) -> list[str]:
    """The names ``code`` reads without binding them itself (in order of first use):
    what it needs from the cells before it."""
    tree = ast.parse(code)
    bound, used = set(dir(builtins)), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif node.id not in used:
                used.append(node.id)
    return [n for n in used if n not in bound]


@dataclass
class Binding:
    """How a chapter's code cells bind one top-level name: an import (``source`` is
    one import statement binding that name alone) or a function (its ``def``)."""

    name: str
    kind: str  # "import" or "def"
    source: str


def chapter_bindings(path: Path) -> dict[str, Binding]:
    """The names the chapter's code cells bind at top level by an import or a ``def``
    (the first binding of each), read without running anything."""
    found: dict[str, Binding] = {}
    for m in CODE_CELL.finditer(path.read_text(encoding="utf-8")):
        lines = [
            ln
            for ln in m["body"].splitlines()
            if not ln.lstrip().startswith(("%", "!"))
        ]
        code = "\n".join(lines)
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    name = a.asname or a.name.split(".")[0]
                    text = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                    found.setdefault(name, Binding(name, "import", text))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name == "*":
                        continue
                    name = a.asname or a.name
                    text = f"from {node.module} import {a.name}" + (
                        f" as {a.asname}" if a.asname else ""
                    )
                    found.setdefault(name, Binding(name, "import", text))
            elif isinstance(node, ast.FunctionDef):
                found.setdefault(
                    node.name,
                    Binding(node.name, "def", ast.get_source_segment(code, node)),
                )
    return found


REFERENCE = re.compile(r"`([A-Za-z_]\w*)[\w.]*(?:\([^`]*\))?`")


def referenced_names(text: str) -> list[str]:
    """The first names of the code a prompt quotes (```soft_loss_inline```,
    ```distill.soft_target_loss```, ```f(x, y)```), in order."""
    names = []
    for name in REFERENCE.findall(text):
        if name not in names:
            names.append(name)
    return names


class HandoutError(ValueError):
    """A handout would need something of its chapter it cannot carry (the message names
    the exercise and the name)."""


def _bound_object(binding: Binding):
    """The object an import binding names (None when it cannot be imported here)."""
    with contextlib.suppress(Exception):
        words = binding.source.split()
        if words[0] == "import":
            return importlib.import_module(words[1])
        return getattr(importlib.import_module(words[1]), words[3])
    return None


def _forbidden(exercises: list[Exercise]) -> set[int]:
    """ids of the library objects the exercises' checks refuse (``check.forbidden``)."""
    ids = set()
    for ex in exercises:
        check = getattr(importlib.import_module(check_module(ex.check)), ex.check)
        for item in getattr(check, "forbidden", ()):
            ids.add(id(getattr(item, "func", item)))
    return ids


def handout_setup(path: Path, exercises: list[Exercise]) -> tuple[str, list[str]]:
    """(the import cell, the chapter functions the prompts refer to) of a handout: every
    import of the chapter (from any of its cells, not only the first) that the stubs, the
    check calls or the reference solutions read, and the chapter's own functions a
    prompt quotes ("```soft_loss_inline``` above ..."), each ``def`` as the chapter has
    it (with the imports it reads). Nothing else of the chapter: no install cell, no
    figures, no library function a prompt only names, and never a name an exercise
    asks for nor one its check refuses (the answers are the learner's).

    Raises:
        HandoutError: a name the exercises read that no import or ``def`` of the
            chapter binds, or an import that would hand over an exercise's answer.
    """
    bindings = chapter_bindings(path)
    answers = {f for ex in exercises for f in ex.functions}
    stubs = {f for ex in exercises for f in _defined(ex.stub or "")}
    forbidden = _forbidden(exercises)
    needed: list[tuple[str, str]] = []  # (name, who needs it)
    for ex in exercises:
        for code in (ex.stub, ex.solution_code):
            needed += [(n, ex.label) for n in _free_names(code)]
        needed += [
            (n, ex.label)
            for n in referenced_names(ex.text)
            if n in bindings and bindings[n].kind == "def" and n not in stubs
        ]
    imports: list[str] = []
    defs: dict[str, str] = {}
    i = 0
    while i < len(needed):
        name, who = needed[i]
        i += 1
        if name in stubs or name in defs:
            continue
        b = bindings.get(name)
        if b is None:
            raise HandoutError(
                f"{path.stem}: {who} reads {name!r}, which no import or def of the "
                "chapter binds: the handout could not define it"
            )
        if name in answers or (
            b.kind == "import" and id(_bound_object(b)) in forbidden
        ):
            raise HandoutError(
                f"{path.stem}: {who} needs the chapter's {b.source.splitlines()[0]!r}, "
                f"which binds {name!r}, an exercise's answer or a function its check "
                "refuses: the handout would hand it over"
            )
        if b.kind == "import":
            if b.source not in imports:
                imports.append(b.source)
        else:
            defs[name] = b.source
            needed += [(n, f"{who} (via {name})") for n in _free_names(b.source)]
    return _merged(sorted(imports, key=_import_order)), list(defs.values())


def _merged(imports: list[str]) -> str:
    """One ``from M import a, b`` line per module (in parentheses when long)."""
    lines: list[str] = []
    names: dict[str, list[str]] = {}
    for line in imports:
        words = line.split(" import ", 1)
        if not line.startswith("from "):
            lines.append(line)
        elif words[0] in names:
            names[words[0]].append(words[1])
        else:
            names[words[0]] = [words[1]]
            lines.append(words[0])
    out = []
    for line in lines:
        if line in names:
            joined = f"{line} import {', '.join(names[line])}"
            if len(joined) > 88:
                inner = "".join(f"    {n},\n" for n in names[line])
                joined = f"{line} import (\n{inner})"
            out.append(joined)
        else:
            out.append(line)
    return "\n".join(out)


def _import_order(line: str) -> tuple:
    """isort's order, roughly: the standard library, torch, then the course."""
    module = line.split()[1]
    group = (
        2
        if module.startswith("transformer_course")
        else (1 if module.startswith("torch") else 0)
    )
    return group, line.startswith("from"), line


def _defined(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def dangling_references(nb: nbformat.NotebookNode, path: Path) -> list[str]:
    """The chapter functions a handout's text quotes that no code cell of the handout
    defines: "```soft_loss_inline``` above" with no such function above. (A library
    function the text names is the library's, found by its name; a chapter function is
    only in a cell.) Empty for a handout that says only what it holds."""
    bindings = chapter_bindings(path)
    defined: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            with contextlib.suppress(SyntaxError):
                tree = ast.parse(cell.source)
                defined |= {
                    n.name
                    for n in ast.walk(tree)
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                }
    dangling = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for name in referenced_names(cell.source):
                b = bindings.get(name)
                if b and b.kind == "def" and name not in defined | set(dangling):
                    dangling.append(name)
    return dangling


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


def pinned_dependencies(root: Path = ROOT) -> list[str]:
    """The library's runtime dependencies (pyproject.toml) pinned to the versions the
    course is tested with (requirements.txt), e.g. ``torch==2.13.0``: the grading image
    gets the torch that `make grade` uses, not whatever is newest when it is built.

    Raises:
        ValueError: a dependency that requirements.txt does not pin.
    """
    import tomllib

    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (root / "requirements.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[_canonical(name)] = version.split("+")[0].split(";")[0].strip()
    out = []
    for dep in declared["dependencies"]:
        name = _canonical(re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0])
        if name not in pins:
            raise ValueError(f"requirements.txt pins no version of {name!r} ({dep!r})")
        out.append(f"{name}=={pins[name]}")
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The words of a handout that are not the chapter's, per edition (--edition).
WORDS = {
    "en": {
        "title": "Exercises: {title}",
        "intro": (
            "Replace each `raise NotImplementedError(...)` with your code, run the cell, "
            "and read its self-check; `grader.check(...)` runs the public tests. "
            "The chapter this comes from explains everything you need."
        ),
        "imports": "# What the exercises use, imported as the chapter imports it",
        "context": "The chapter's code that the exercises below refer to:",
    },
    "zh": {
        "title": "练习：{title}",
        "intro": (
            "把每个 `raise NotImplementedError(...)` 换成你的代码，运行该单元格，"
            "阅读它的自测结果；`grader.check(...)` 运行公开测试。"
            "所需的一切都在本练习所出自的那一章里讲过。"
        ),
        "imports": "# 练习用到的名字，按本章的方式导入",
        "context": "下面的练习提到的本章代码：",
    },
}


def master_notebook(
    path: Path,
    exercises: list[Exercise],
    points: dict[str, float],
    language: str = "en",
    branch: str | None = None,
) -> nbformat.NotebookNode:
    """The otter master notebook of one chapter (``path``: book/NN_*.md, or
    book/zh/NN_*.md with ``language="zh"``). Raises ``HandoutError`` (see
    ``handout_setup``)."""
    url, _ = repository()
    words = WORDS[language]
    # the library exactly as it was when the assignment was built
    branch = branch or commit()
    title = path.read_text(encoding="utf-8").split("\n# ", 1)[1].split("\n", 1)[0]
    requirements = [
        "otter-grader==7.0.0",
        *pinned_dependencies(),  # the versions `make grade` runs (instructor trial I7)
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
    setup = install_cell(url, branch, language).source.replace(
        'if importlib.util.find_spec("transformer_course") is None:',
        'if importlib.util.find_spec("otter") is None:\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", '
        '"otter-grader==7.0.0"], check=True)\n'
        'if importlib.util.find_spec("transformer_course") is None:',
    )
    imports, context = handout_setup(path, exercises)
    cells = [
        _raw("# ASSIGNMENT CONFIG\n" + yaml.safe_dump(config, sort_keys=False)),
        _md(f"# {words['title'].format(title=title)}\n\n{words['intro']}"),
        _code(setup),
        _code(f"{words['imports']}\n{imports}"),
    ]
    if context:
        cells += [_md(words["context"]), _code("\n\n\n".join(context))]
    cells.append(
        _code(
            f'# Initialize Otter\nimport otter\ngrader = otter.Notebook("{path.stem}.ipynb")'
        )
    )
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
    """``--points LABEL=N ...`` as {label: N}; N a finite number >= 0 (SystemExit
    naming the item otherwise: a negative mark would take points off the total)."""
    points = {}
    for item in items or []:
        label, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            raise SystemExit(f"--points: expected LABEL=N, got {item!r}") from None
        if not math.isfinite(number) or number < 0:
            raise SystemExit(
                f"--points: the points of {label!r} must be a number >= 0, got {value!r}"
            )
        points[label] = number
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


def default_out(edition: str = "en") -> Path:
    """Where ``assign`` writes by default: dist/assignments (dist/assignments-zh for the
    Chinese edition, so that both can be built and graded side by side)."""
    return (
        ROOT / "dist" / ("assignments" if edition == "en" else f"assignments-{edition}")
    )


def _build(
    path: Path,
    exercises: list[Exercise],
    points: dict[str, float],
    out: Path,
    language: str,
    run_tests: bool,
    branch: str,
) -> str:
    """Build one chapter's assignment into the folder ``out`` (made here); returns ""
    or why it failed (otter's last output lines included)."""
    out.mkdir(parents=True)
    master = out / "master" / f"{path.stem}.ipynb"
    master.parent.mkdir()
    try:
        nbformat.write(
            master_notebook(path, exercises, points, language, branch), master
        )
    except HandoutError as err:
        return str(err)
    cmd = [sys.executable, "-m", "otter", "assign", "--no-pdfs", str(master), str(out)]
    # --debug: the reference run stops at the first cell that raises (otter otherwise
    # swallows it: a NameError in a self-check cell passed), so a chapter builds only
    # when its notebook, solutions in place, runs from top to bottom
    cmd.append("--debug" if run_tests else "--no-run-tests")
    done = subprocess.run(
        cmd, cwd=master.parent, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = (done.stdout[-3000:] + "\n" + done.stderr[-3000:]).strip()
        return f"otter assign failed:\n{tail}"
    spec = {
        "assignment": path.stem,
        "edition": language,
        "questions": [
            {
                "name": ex.name,
                "label": ex.label,
                "title": ex.title,
                "points": points.get(ex.label, DEFAULT_POINTS),
                "check": ex.check,
                "module": check_module(ex.check),
                "functions": list(ex.functions),
                "kwargs": ex.kwargs,
            }
            for ex in exercises
        ],
    }
    (out / "grading.json").write_text(json.dumps(spec, indent=2, ensure_ascii=False))
    student = out / "student" / f"{path.stem}.ipynb"
    embed_public_tests(student)
    dangling = dangling_references(nbformat.read(student, as_version=4), path)
    if dangling:
        return (
            "the handout's text refers to "
            + ", ".join(map(repr, dangling))
            + " of the chapter, which the handout does not define"
        )
    # the copies with solutions get names that cannot be mistaken for the handout
    for copy, new in (
        (out / "autograder" / f"{path.stem}.ipynb", "SOLUTIONS"),
        (master, "master-SOLUTIONS"),
    ):
        if copy.exists():
            copy.rename(copy.with_name(f"{path.stem}-{new}.ipynb"))
    return ""


def assign(args: argparse.Namespace) -> int:
    """``make assignments``: every chosen chapter built into ``args.out``/<chapter>/.
    Each is built in a hidden folder beside it and moved into place only when it is
    complete; a chapter that fails leaves nothing under its name (an earlier build of it
    is removed too), the other chapters are still built, and the exit code is 1."""
    edition = getattr(args, "edition", None) or "en"
    book = ROOT / "book" if edition == "en" else ROOT / "book" / edition
    points = _points(args.points)
    paths = chapters(args.chapters, book)
    found = {p: [ex for ex in parse_chapter(p) if ex.coding] for p in paths}
    labels = [ex.label for exs in found.values() for ex in exs]
    _unknown("--only", args.only or [], labels)
    _unknown("--points", points, labels)
    out_root = Path(args.out or default_out(edition)).resolve()
    pinned = commit()  # one commit for every chapter of this build
    built, failed = [], []
    for path, exercises in found.items():
        if args.only:
            exercises = [ex for ex in exercises if ex.label in args.only]
        if not exercises:
            continue
        out = out_root / path.stem
        staging = out_root / f".{path.stem}.building"
        for old in (staging, out):
            shutil.rmtree(old, ignore_errors=True)
        start = time.perf_counter()
        why = _build(
            path, exercises, points, staging, edition, not args.no_run_tests, pinned
        )
        if why:
            shutil.rmtree(staging, ignore_errors=True)
            print(f"{path.stem}: NOT BUILT: {why}", file=sys.stderr)
            failed.append(path.stem)
            continue
        staging.rename(out)
        zips = sorted((out / "autograder").glob("*.zip"))
        total = sum(points.get(ex.label, DEFAULT_POINTS) for ex in exercises)
        print(
            f"{path.stem}: {len(exercises)} questions, {total:g} points, "
            f"{time.perf_counter() - start:.0f} s -> {out.relative_to(out_root.parent)}/"
            f"student/{path.stem}.ipynb, autograder/{zips[0].name if zips else '?'}",
            flush=True,
        )
        built.append(path.stem)
    print(f"assignments in {out_root}: {', '.join(built) or 'none'}")
    if failed:
        print(
            f"not built: {', '.join(failed)} (nothing left under their names)",
            file=sys.stderr,
        )
        return 1
    return 0
