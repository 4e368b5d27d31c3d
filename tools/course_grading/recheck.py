"""The isolated re-check of a submitted notebook (the trusted side).

otter runs the learner's code and the hidden tests in one Python process, so code in the
notebook can replace the checker, otter's result objects or ``pickle`` before the tests
run. Here the checks run in *this* process and only the learner's functions run, inside
the sandbox, in a worker process (``course_grading.worker``): each call sends its
arguments to the worker and reads back tensors with ``torch.load(weights_only=True)``,
which cannot execute code. A call that takes longer than ``call_timeout`` seconds kills
the worker and fails the question. Gradients flow back through the worker
(``_RemoteGrad``), so checks that call ``backward`` work too.

    python -m course_grading.recheck SPEC.json SUBMISSION.ipynb SANDBOX.json [CALL_TIMEOUT]

prints ``{question: {"score", "max_score", "message"}, "_setup": {...}}`` as JSON.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import difflib
import importlib
import io
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from course_grading.sandbox import HOME, Sandbox
from course_grading.wire import recv, send, tensors
from transformer_course.exercises._common import hide_frames

# Where the exercise checks live; the first that has the check wins.
CHECK_MODULES = ("transformer_course.exercises",)


def check_module(name: str) -> str:
    """The module that defines the check ``name``. Raises ``LookupError`` naming them."""
    for module in CHECK_MODULES:
        try:
            if hasattr(importlib.import_module(module), name):
                return module
        except ImportError:
            continue
    raise LookupError(f"no check {name!r} in {', '.join(CHECK_MODULES)}")


def _strip_cell(source: str) -> str:
    """A code cell without IPython magics/shell lines, otter's ``grader.*`` calls and
    top-level ``check_*(...)`` self-check calls (the trusted process runs the checks)."""
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text  # run as is; the worker reports the error
    keep = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call):
            func = call.func
            if isinstance(func, ast.Name) and func.id.startswith("check_"):
                continue
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id == "grader")
            ):
                continue
        keep.append(node)
    return ast.unparse(ast.Module(body=keep, type_ignores=[]))


def submission_code(notebook: dict) -> list[tuple[int, str]]:
    """(number, code) of the code cells of a submitted notebook (parsed JSON, never
    executed here), numbered from 1 as in the notebook, each stripped by ``_strip_cell``;
    cells that set up otter are left out."""
    cells, number = [], 0
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if "otter.Notebook(" in source:
            continue
        cells.append((number, _strip_cell(source)))
    return cells


def defined_functions(notebook: dict) -> list[str]:
    """Names of the top-level functions the notebook defines (parsed, not run)."""
    names = []
    for _, code in submission_code(notebook):
        with contextlib.suppress(SyntaxError):
            names += [
                n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)
            ]
    return names


def imported_names(notebook: dict) -> dict[str, str]:
    """Top-level names the notebook binds by importing them from the course library
    (``from transformer_course.attention import masked_softmax as my_softmax``):
    name -> the dotted name imported (parsed, not run)."""
    names = {}
    for _, code in submission_code(notebook):
        with contextlib.suppress(SyntaxError):
            for node in ast.parse(code).body:
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "transformer_course"
                ):
                    for a in node.names:
                        names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def learner_source(cells: list[tuple[int, str]]) -> str:
    """The notebook's code as the checks read it (``__learner_source__``): the cells
    that parse, and after them every import a function makes inside its body, lifted to
    the top level, so that ``def f(x): from transformer_course.distill import
    soft_target_loss ...`` reads as the library call it is (instructor trial 2026-12-03,
    finding 4: it passed the re-check)."""
    code = [c for _, c in cells if _parses(c)]
    lifted = []
    for c in code:
        for node in ast.walk(ast.parse(c)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lifted += [
                    ast.unparse(sub)
                    for sub in ast.walk(node)
                    if isinstance(sub, (ast.Import, ast.ImportFrom))
                    and not getattr(sub, "level", 0)
                ]
    return "\n".join(code + lifted)


# What of a learner's message reaches the feedback: at most this many characters
# (instructor trial 2026-12-03, finding 2: a raised ValueError carried whole files).
MESSAGE_LIMIT = 300
PATH = re.compile(r"(?<![\w.<>/])/(?:[\w.@+-]+/)+[\w.@+-]*")


def echoed(text: str) -> str:
    """Why a message the learner's code made looks like it carries what the code read
    (a path of the machine, more lines or characters than an error needs); "" if not."""
    why = []
    paths = sorted(set(PATH.findall(text)))
    if paths:
        why.append("paths " + ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else ""))
    if len(text) > MESSAGE_LIMIT:
        why.append(f"{len(text)} characters")
    if text.count("\n") >= 3:
        why.append(f"{text.count(chr(10)) + 1} lines")
    return ", ".join(why)


def capped(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` with every path replaced by <path> and cut to ``limit`` characters."""
    text = PATH.sub("<path>", str(text))
    return text if len(text) <= limit else text[:limit] + " [... cut]"


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


class _RemoteGrad(torch.autograd.Function):
    """Connects outputs computed in the worker to the local inputs, so that ``backward``
    in a check asks the worker for the gradients."""

    @staticmethod
    def forward(ctx, remote, n_inputs, *tensors_):
        ctx.remote, ctx.n_inputs = remote, n_inputs
        return tuple(t.clone() for t in tensors_[n_inputs:])

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = ctx.remote.request(
            {
                "op": "backward",
                "grads": [torch.zeros(0) if g is None else g for g in grad_outputs],
            }
        )
        return (None, None, *grads, *([None] * len(grad_outputs)))


class WorkerError(RuntimeError):
    """The learner's function raised in the worker (message names the exception)."""


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
    return found + [g for c in found for g in _children(c)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(
                f.read().replace(b"\0", b" ").decode("utf-8", "replace").split()
            )
    except OSError:
        return ""


_STATES = {"Z": "exited, not yet reaped (a zombie)", "S": "sleeping", "R": "running"}


def describe_process(pid: int) -> str:
    """What a process left behind is, in words that never come out empty: its pid and
    state, then its command line or (a zombie has none) its name."""
    cmd = _cmdline(pid)
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state = stat[stat.rindex(")") + 2 :].split()[0]
    except (OSError, ValueError, IndexError):
        return cmd or f"pid {pid}, which exited before it could be described"
    # A live process shows no command line for a moment while it starts (between fork
    # and exec, seen on a loaded 2-core machine): read it again for up to a second.
    for _ in range(20):
        if cmd or state == "Z":
            break
        time.sleep(0.05)
        cmd = _cmdline(pid)
    what = f"pid {pid}, {_STATES.get(state, f'state {state}')}"
    return f"{what}: {cmd}" if cmd else f"{what}: {name} (its command line is gone)"


def _is_bwrap(cmd: str) -> bool:
    """Whether a command line is bubblewrap's own (``/usr/bin/bwrap --args 3 ...``)."""
    return Path(cmd.split(" ", 1)[0]).name == "bwrap" if cmd else False


def _worker_pid(root: int) -> int:
    """The worker's pid: ``root`` itself, or the first process under it (under bwrap)
    that runs ``course_grading.worker`` (bwrap's own processes excluded). Any other
    process with that command line is a ``fork`` of it by the notebook."""
    for pid in [root, *_children(root)]:
        cmd = _cmdline(pid)  # bwrap's own command line names the worker too
        if "course_grading.worker" in cmd and not _is_bwrap(cmd):
            return pid
    return root


def home_writes(home: Path) -> list[str]:
    """Files the learner's code wrote into ~ (the sandbox's scratch home), as ~/...;
    caches of libraries (~/.cache) are not counted."""
    return [
        "~/" + str(p.relative_to(home))
        for p in sorted(home.rglob("*"))
        if p.is_file() and p.relative_to(home).parts[0] != ".cache"
    ]


def _builtin_error(name: str, message: str) -> Exception | None:
    """The built-in exception ``name`` with ``message`` (None for any other name, or
    one whose constructor takes other arguments)."""
    kind = getattr(builtins, name, None)
    if not (isinstance(kind, type) and issubclass(kind, Exception)):
        return None
    try:
        return kind(message)
    except Exception:  # noqa: BLE001 (e.g. UnicodeDecodeError needs five arguments)
        return None


class RemoteFunctions:
    """The learner's notebook running in a worker process inside ``sandbox``.

    ``remote.function(name)`` returns a local callable that forwards its arguments to the
    worker; exceptions come back as the built-in exception the learner's code raised
    (``NotImplementedError``: checks report "not attempted yet") or ``WorkerError``.
    Raises ``TimeoutError`` when a call takes longer than ``call_timeout`` seconds (the
    worker is then killed).
    """

    def __init__(
        self,
        cells: list[tuple[int, str]],
        sandbox: Sandbox,
        *,
        call_timeout: float = 30.0,
        setup_timeout: float = 300.0,
    ):
        self.cells, self.sandbox = cells, sandbox
        self.call_timeout, self.setup_timeout = call_timeout, setup_timeout
        self.proc: subprocess.Popen | None = None
        self.setup_errors: list[dict] = []
        self.stray: list[str] = []  # processes the notebook left running
        self.home_writes: list[str] = []  # files it wrote into ~ (a scratch folder)
        self.echoes: list[str] = []  # messages that look like they carry files
        self.attempts: list[str] = []  # what it tried that the sandbox refuses

    def start(self) -> None:
        # inside the caller's folder, so a re-check killed at its time limit leaves nothing
        self._cwd = tempfile.TemporaryDirectory(prefix="worker-", dir=os.getcwd())
        cwd = Path(self._cwd.name)
        cmd = self.sandbox.command([sys.executable, "-m", "course_grading.worker"], cwd)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=self.sandbox.env(cwd),
            start_new_session=True,
        )
        self.setup_errors = []
        deadline = time.monotonic() + self.setup_timeout
        for number, code in self.cells:  # one at a time: a cell that loops is named
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                errors = self.request({"op": "exec", "cells": [(number, code)]}, left)
            except TimeoutError:
                self.stop()
                raise TimeoutError(
                    f"code cell {number} was still running at the time limit of "
                    f"{self.setup_timeout:g} s for the notebook's cells"
                ) from None
            for e in errors if isinstance(errors, list) else []:
                if isinstance(e, dict):
                    self.setup_errors.append(self._cell_error(e))
        worker = _worker_pid(self.proc.pid)
        for p in _children(self.proc.pid):  # all but the worker and bwrap's own
            if p == worker or _is_bwrap(_cmdline(p)):
                continue
            what = describe_process(p)
            if "course_grading.worker" in what:  # the notebook's os.fork of itself
                what = (
                    f"{what.split(':')[0]}: a fork (os.fork) of the notebook's own "
                    "process, which still shows the re-check worker's command line"
                )
            self.stray.append(what)
        self.home_writes = home_writes(cwd / HOME)
        self.report()

    def _cell_error(self, e: dict) -> dict:
        number = e.get("cell")
        kind = capped(str(e.get("type")), 60)
        return {
            "cell": number if isinstance(number, int) else None,
            "type": kind,
            "message": self._learner_text(
                str(e.get("message", "")), f"code cell {number}: {kind}"
            ),
            "denied": bool(e.get("denied")),
        }

    def report(self) -> None:
        """Adds what the worker's audit hook saw (``worker._audit``) to ``attempts``."""
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            seen = self.request({"op": "report"}, timeout=10)
            for what in seen[:30] if isinstance(seen, list) else []:
                what = str(what)[:300]  # for flags.md only (the instructor's)
                if what not in self.attempts:
                    self.attempts.append(what)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()
            self.proc = None
        if getattr(self, "_cwd", None) is not None:
            self._cwd.cleanup()
            self._cwd = None

    def request(self, msg: dict, timeout: float | None = None) -> Any:
        if self.proc is None:
            raise WorkerError("the worker is not running")
        try:
            send(self.proc.stdin, msg)
        except OSError as err:
            self.stop()
            raise WorkerError(f"the worker stopped: {err}") from None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            limit = self.call_timeout if timeout is None else timeout
            if not sel.select(limit):
                self.stop()
                raise TimeoutError(f"no answer within the time limit of {limit:g} s")
        try:
            reply = recv(self.proc.stdout)
        except Exception as err:  # noqa: BLE001 (a crashed worker or a reply that is not data)
            self.stop()
            raise WorkerError(f"the worker stopped or sent something unreadable: {err}")
        if not isinstance(reply, dict) or "ok" not in reply:
            raise WorkerError("the worker sent a malformed reply")
        if reply["ok"]:
            return reply["result"]
        kind = capped(str(reply.get("error")), 60)
        message = self._learner_text(
            str(reply.get("message", "")), f"{kind} raised by {msg.get('fn', 'a call')}"
        )
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        err = _builtin_error(kind, message)
        if err is not None:
            raise err  # as the learner's own process would
        raise WorkerError(f"{kind}: {message}")

    def _learner_text(self, text: str, where: str) -> str:
        """A message of the learner's code, capped (``capped``); one that looks like it
        carries what the code read is recorded in ``echoes``, for the instructor."""
        why = echoed(text)
        if why and len(self.echoes) < 10:
            self.echoes.append(f"{where}: a message with {why}")
        return capped(text)

    def function(self, name: str) -> Callable:
        def call(*args, **kwargs):
            need = [x for x in tensors((args, kwargs)) if x.requires_grad]

            def fresh(x):
                y = x.detach().clone()
                return y.requires_grad_() if any(x is n for n in need) else y

            sent_args, sent_kwargs = pytree.tree_map_only(
                torch.Tensor, fresh, (args, kwargs)
            )
            result = self.request(
                {"op": "call", "fn": name, "args": sent_args, "kwargs": sent_kwargs}
            )
            outs = [y for y in tensors(result) if y.is_floating_point()]
            if not need or not outs:
                return result
            linked = iter(_RemoteGrad.apply(self, len(need), *need, *outs))
            return pytree.tree_map_only(
                torch.Tensor,
                lambda y: next(linked) if y.is_floating_point() else y,
                result,
            )

        call.__name__ = name
        # the checks read the code (they cannot watch a call in the worker)
        call.__learner_source__ = learner_source(self.cells)
        return call


def _assigned(notebook: dict) -> dict[str, tuple[int, str]]:
    """Top-level names the notebook binds by an assignment (``my_mean_pool =
    distill.mean_pool``): name -> (code cell, the assigned expression)."""
    names = {}
    for number, code in submission_code(notebook):
        with contextlib.suppress(SyntaxError):
            for node in ast.parse(code).body:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            names[target.id] = (number, ast.unparse(node.value))
    return names


def _syntax_errors(notebook: dict) -> list[tuple[int, SyntaxError, str]]:
    """(code cell, the error, its code) of every code cell that does not parse."""
    found = []
    for number, code in submission_code(notebook):
        try:
            ast.parse(code)
        except SyntaxError as err:
            found.append((number, err, code))
    return found


def _missing(notebook: dict, functions: list[str]) -> str:
    """Why a function the check is called with is not the notebook's own ``def``
    (empty when every one is): a cell that would define it does not parse; it is bound
    by an import or an assignment; it is not there (with the closest name)."""
    found, imported = defined_functions(notebook), imported_names(notebook)
    assigned = _assigned(notebook)
    missing = [f for f in functions if f not in found]
    if not missing:
        return ""
    broken = _syntax_errors(notebook)
    parts = []
    for f in missing:
        cell = next(
            (
                b
                for b in broken
                if re.search(rf"^\s*def\s+{re.escape(f)}\b", b[2], re.MULTILINE)
            ),
            None,
        )
        if cell is not None:
            number, err, _ = cell
            parts.append(
                f"the cell that defines {f} (code cell {number}) has a SyntaxError on "
                f"line {err.lineno}: {capped(err.msg, 120)}"
            )
        elif f in imported:
            parts.append(
                f"{f} is not written in the notebook: it is bound by an import from "
                f"the library ({imported[f]})"
            )
        elif f in assigned:
            number, value = assigned[f]
            parts.append(
                f"{f} is not written in the notebook: code cell {number} binds it to "
                f"{capped(value, 120)}"
            )
        elif broken:
            numbers = ", ".join(str(b[0]) for b in broken)
            parts.append(
                f"{f} is not defined; code cell(s) {numbers} do not parse "
                f"(SyntaxError), so what they define is not seen"
            )
        else:
            close = difflib.get_close_matches(f, found, n=1, cutoff=0.5)
            parts.append(
                f"{f} is not defined"
                + (f" (closest name found: {close[0]})" if close else "")
            )
    return "; ".join(parts)


def library_calls(notebook: dict, q: dict) -> str:
    """The library function question ``q``'s function calls, where its check refuses
    one (``check.forbidden``), read from the code as the check reads it; "" if none.
    (Whatever the language of the check's message: this is for flags.md.)"""
    module = importlib.import_module(q.get("module") or check_module(q["check"]))
    forbidden = getattr(getattr(module, q["check"]), "forbidden", ())
    if not forbidden or not q["functions"]:
        return ""
    try:
        from transformer_course.exercises._method import library_use
    except ImportError:
        return ""
    source = learner_source(submission_code(notebook))
    for f in q["functions"][:1]:
        with contextlib.suppress(Exception):
            used = library_use(source, f, tuple(forbidden))
            if used:
                return f"{f} calls the library's {used}, which the exercise forbids"
    return ""


def recheck(
    spec: dict,
    notebook: dict,
    sandbox: Sandbox,
    *,
    call_timeout: float = 30.0,
    setup_timeout: float = 300.0,
) -> dict[str, dict]:
    """Grade ``notebook`` (parsed JSON) against ``spec`` without running its code here.

    ``spec["questions"]`` lists ``{"name", "points", "check", "functions", "kwargs"}``
    (``"module"``: where the check lives, default ``check_module(check)``). Returns
    ``{question: {"score", "max_score", "message", "missing"}, "_setup": {...}}``; a
    question scores its points only when the check returns True.
    """
    remote = RemoteFunctions(
        submission_code(notebook),
        sandbox,
        call_timeout=call_timeout,
        setup_timeout=setup_timeout,
    )
    results: dict[str, dict] = {}
    try:
        remote.start()
        setup = ""
    except (TimeoutError, WorkerError) as err:
        setup, remote.proc = f"running the notebook failed: {err}", None
    for q in spec["questions"]:
        module = importlib.import_module(q.get("module") or check_module(q["check"]))
        check = getattr(module, q["check"])
        score, message = 0.0, ""
        try:
            if remote.proc is None:
                remote.start()
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                done = check(
                    *(remote.function(f) for f in q["functions"]),
                    **(q.get("kwargs") or {}),
                )
            message = printed.getvalue().strip()
            score = float(q["points"]) if done is True else 0.0
        except AssertionError as err:  # the check's CheckError
            message = str(err)
        except Exception as err:  # noqa: BLE001 (the learner's function raised: 0 points)
            message = f"{type(err).__name__}: {err}"
        results[q["name"]] = {
            "score": score,
            "max_score": float(q["points"]),
            "message": message,
            "missing": _missing(notebook, q["functions"]),
            "library": library_calls(notebook, q),
            "looped": message.startswith("TimeoutError"),
        }
    remote.report()
    remote.stop()
    results["_setup"] = {
        "message": setup,
        "errors": remote.setup_errors,
        "stray": remote.stray,
        "home_writes": remote.home_writes,
        "echoes": remote.echoes,
        "attempts": remote.attempts,
    }
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        notebook = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:  # one line, not a traceback
        print(json.dumps({"_setup": {"message": f"not a valid notebook: {err}"}}))
        return 0
    sandbox = Sandbox.from_json(Path(argv[2]).read_text(encoding="utf-8"))
    timeout = float(argv[3]) if len(argv) > 3 else 30.0
    hide_frames()  # the learner's frames are in the worker; here only the grader's
    print(json.dumps(recheck(spec, notebook, sandbox, call_timeout=timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
