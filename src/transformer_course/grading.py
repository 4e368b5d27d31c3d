"""Grading helpers for the instructor workflow (book/instructor_guide.md, tools/assignments.py).

(The public otter test, ``public_test``, is in ``transformer_course.exercises``.)

- ``recheck(spec, submission)``: an isolated re-check of a submitted notebook. otter runs
  the learner's code and the hidden tests in one Python process, so code in the
  notebook can replace the checker, otter's result objects or ``pickle`` before the tests
  run. Here the checks run in *this* (trusted) process and only the learner's functions
  run in a separate worker process: each call sends its arguments to the worker and reads
  back tensors with ``torch.load(weights_only=True)``, which cannot execute code. A call
  that takes longer than ``call_timeout`` seconds kills the worker and fails the
  question. Gradients flow back through the worker (``_RemoteGrad``), so checks that
  call ``backward`` work too.

What this cannot stop: the worker runs as the same operating-system user, so it can
read, write or kill anything that user can (files, other processes through ``/proc``).
Only a container or a separate user account (Docker, Gradescope) stops that.

    python -m transformer_course.grading recheck SPEC.json SUBMISSION.ipynb
    python -m transformer_course.grading worker   # started by recheck, never by hand
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from transformer_course.exercises import CheckError

__all__ = ["RemoteFunctions", "recheck", "submission_code"]

# --------------------------------------------------------------- the learner's code


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
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (
                func.value.id == "grader"
            ):
                continue
        keep.append(node)
    return ast.unparse(ast.Module(body=keep, type_ignores=[]))


def submission_code(notebook: dict) -> list[str]:
    """The code cells of a submitted notebook (parsed JSON, never executed here), each
    stripped by ``_strip_cell``; cells that set up otter are left out."""
    cells = []
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if "otter.Notebook(" in source:
            continue
        cells.append(_strip_cell(source))
    return cells


# ------------------------------------------------- framed messages between processes


def _send(stream, payload: Any) -> None:
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _recv(stream) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the worker closed its output")
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    # weights_only: tensors, numbers, strings, tuples, lists, dicts; never code.
    return torch.load(io.BytesIO(data), weights_only=True)


def _worker() -> None:
    """Run the learner's code and answer calls; stdin/stdout carry the messages."""
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the learner's prints and errors go nowhere
        os.dup2(devnull, fd)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    last: tuple[list, list] = ([], [])
    while True:
        try:
            msg = _recv(inp)
        except EOFError:
            return
        try:
            if msg["op"] == "exec":
                errors = []
                for i, code in enumerate(msg["cells"]):
                    try:
                        exec(compile(code, f"<cell {i}>", "exec"), namespace)  # noqa: S102
                    except BaseException as err:  # noqa: BLE001 (a raising cell does not stop the rest)
                        errors.append(f"cell {i}: {type(err).__name__}: {err}")
                _send(out, {"ok": True, "result": errors})
            elif msg["op"] == "call":
                fn = namespace.get(msg["fn"])
                if not callable(fn):
                    raise NameError(f"{msg['fn']} is not defined in the notebook")
                args, kwargs = msg["args"], msg["kwargs"]
                with torch.enable_grad():
                    result = fn(*args, **kwargs)
                inputs = [x for x in _tensors((args, kwargs)) if x.requires_grad]
                outputs = [y for y in _tensors(result) if y.is_floating_point()]
                last = (inputs, outputs)
                _send(out, {"ok": True, "result": _detach(result)})
            elif msg["op"] == "backward":
                inputs, outputs = last
                pairs = [(y, g) for y, g in zip(outputs, msg["grads"]) if y.requires_grad]
                grads = torch.autograd.grad(
                    [y for y, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True
                ) if pairs else [None] * len(inputs)
                _send(out, {"ok": True, "result": [
                    torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)
                ]})
        except BaseException as err:  # noqa: BLE001 (every error goes back to the checker)
            _send(out, {"ok": False, "error": type(err).__name__, "message": str(err)})


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def _detach(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, tuple):
        return tuple(_detach(x) for x in obj)
    if isinstance(obj, list):
        return [_detach(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _detach(v) for k, v in obj.items()}
    return obj


def _mark_grads(obj, need: list[torch.Tensor]):
    """Copy of ``obj`` (args) with tensors detached; tensors in ``need`` keep requires_grad."""
    if isinstance(obj, torch.Tensor):
        x = obj.detach().clone()
        return x.requires_grad_() if any(obj is n for n in need) else x
    if isinstance(obj, tuple):
        return tuple(_mark_grads(x, need) for x in obj)
    if isinstance(obj, list):
        return [_mark_grads(x, need) for x in obj]
    if isinstance(obj, dict):
        return {k: _mark_grads(v, need) for k, v in obj.items()}
    return obj


class _RemoteGrad(torch.autograd.Function):
    """Connects outputs computed in the worker to the local inputs, so that ``backward``
    in a check asks the worker for the gradients."""

    @staticmethod
    def forward(ctx, remote, n_inputs, *tensors):
        ctx.remote, ctx.n_inputs = remote, n_inputs
        return tuple(t.clone() for t in tensors[n_inputs:])

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = ctx.remote.request({"op": "backward", "grads": [
            torch.zeros(0) if g is None else g for g in grad_outputs
        ]})
        return (None, None, *grads, *([None] * len(grad_outputs)))


class WorkerError(RuntimeError):
    """The learner's function raised in the worker (message names the exception)."""


class RemoteFunctions:
    """The learner's notebook running in a separate worker process.

    ``remote.function(name)`` returns a local callable that forwards its arguments to the
    worker; exceptions come back as ``NotImplementedError`` (so checks report "not
    attempted yet") or ``WorkerError``. Raises ``TimeoutError`` when a call takes longer
    than ``call_timeout`` seconds (the worker is then killed).
    """

    def __init__(self, cells: list[str], *, call_timeout: float = 30.0,
                 setup_timeout: float = 300.0):
        self.cells, self.call_timeout, self.setup_timeout = cells, call_timeout, setup_timeout
        self.proc: subprocess.Popen | None = None
        self.setup_errors: list[str] = []

    def start(self) -> None:
        self.cwd = tempfile.mkdtemp(prefix="recheck-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "transformer_course.grading", "worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self.cwd, start_new_session=True,
        )
        self.setup_errors = self.request({"op": "exec", "cells": self.cells},
                                         timeout=self.setup_timeout)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()
            self.proc = None

    def request(self, msg: dict, timeout: float | None = None) -> Any:
        import selectors

        if self.proc is None:
            raise WorkerError("the worker is not running")
        _send(self.proc.stdin, msg)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            limit = self.call_timeout if timeout is None else timeout
            if not sel.select(limit):
                self.stop()
                raise TimeoutError(f"no answer within the time limit of {limit:g} s")
        try:
            reply = _recv(self.proc.stdout)
        except Exception as err:  # noqa: BLE001 (a crashed worker or a reply that is not data)
            self.stop()
            raise WorkerError(f"the worker stopped or sent something unreadable: {err}")
        if not isinstance(reply, dict) or "ok" not in reply:
            raise WorkerError("the worker sent a malformed reply")
        if reply["ok"]:
            return reply["result"]
        if reply.get("error") == "NotImplementedError":
            raise NotImplementedError(reply.get("message", ""))
        raise WorkerError(f"{reply.get('error')}: {reply.get('message')}")

    def function(self, name: str) -> Callable:
        def call(*args, **kwargs):
            need = [x for x in _tensors((args, kwargs)) if x.requires_grad]
            sent_args, sent_kwargs = _mark_grads(args, need), _mark_grads(kwargs, need)
            result = self.request({"op": "call", "fn": name, "args": sent_args,
                                   "kwargs": sent_kwargs})
            outs = [y for y in _tensors(result) if y.is_floating_point()]
            if not need or not outs:
                return result
            linked = iter(_RemoteGrad.apply(self, len(need), *need, *outs))
            return _replace_floats(result, linked)

        call.__name__ = name
        return call


def _replace_floats(obj, linked):
    if isinstance(obj, torch.Tensor):
        return next(linked) if obj.is_floating_point() else obj
    if isinstance(obj, tuple):
        return tuple(_replace_floats(x, linked) for x in obj)
    if isinstance(obj, list):
        return [_replace_floats(x, linked) for x in obj]
    if isinstance(obj, dict):
        return {k: _replace_floats(v, linked) for k, v in obj.items()}
    return obj


# ----------------------------------------------------------------------- the re-check


def recheck(
    spec: dict, notebook: dict, *, call_timeout: float = 30.0, setup_timeout: float = 300.0
) -> dict[str, dict]:
    """Grade ``notebook`` (parsed JSON) against ``spec`` without running its code here.

    ``spec["questions"]`` lists ``{"name", "points", "check", "functions", "kwargs"}``:
    the check's name in ``transformer_course.exercises``, the learner's function names it is
    called with and constant keyword arguments. Returns ``{question: {"score", "max_score", "message"}}``; a question scores
    its points only when the check returns True.
    """
    checks = importlib.import_module("transformer_course.exercises")
    remote = RemoteFunctions(submission_code(notebook), call_timeout=call_timeout,
                             setup_timeout=setup_timeout)
    results = {}
    try:
        remote.start()
        setup = "; ".join(remote.setup_errors)
    except (TimeoutError, WorkerError) as err:
        setup, remote.proc = f"running the notebook failed: {err}", None
    for q in spec["questions"]:
        check = getattr(checks, q["check"])
        score, message = 0.0, ""
        try:
            if remote.proc is None:
                remote.start()
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                done = check(*(remote.function(f) for f in q["functions"]),
                             **q.get("kwargs", {}))
            message = printed.getvalue().strip()
            score = float(q["points"]) if done is True else 0.0
        except CheckError as err:
            message = str(err)
        except Exception as err:  # noqa: BLE001 (the learner's function raised: 0 points)
            message = f"{type(err).__name__}: {err}"
        results[q["name"]] = {"score": score, "max_score": float(q["points"]),
                              "message": message}
    remote.stop()
    results["_setup"] = {"message": setup}
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        _worker()
        return 0
    if argv[:1] == ["recheck"] and len(argv) >= 3:
        timeout = float(argv[3]) if len(argv) > 3 else 30.0
        with open(argv[1], encoding="utf-8") as f:
            spec = json.load(f)
        with open(argv[2], encoding="utf-8") as f:
            notebook = json.load(f)
        print(json.dumps(recheck(spec, notebook, call_timeout=timeout)))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
