"""The untrusted side of the isolated re-check: runs the learner's code and answers calls.

Started by ``recheck.RemoteFunctions`` inside the sandbox (never by hand)::

    python -m course_grading.worker

stdin/stdout carry framed messages (``wire``); the learner's own prints and errors go to
/dev/null. Requests: ``{"op": "exec", "cells": [(number, code), ...]}`` runs the cells
(a raising cell does not stop the rest) and answers the errors; ``{"op": "call", "fn",
"args", "kwargs"}`` calls a function of the notebook and answers its result, detached;
``{"op": "backward", "grads"}`` answers the gradients of the last call's inputs;
``{"op": "report"}`` answers what the learner's code tried that the sandbox does not allow
(``attempts``: writes outside its own folder, reads of files the sandbox does not hold,
connections, name lookups, new programs), recorded by an audit hook (``sys.addaudithook``)
whether or not the code caught the error itself. This side is untrusted: the checker caps
and reads everything it answers as the learner's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from course_grading.wire import detach, recv, send, tensors

# What an exception raised without a message means, so no flag ends at its colon.
_SILENT = {MemoryError: "out of memory (the grader's --memory limit per process)"}


ATTEMPTS: list[str] = []  # what the learner's code tried (see _audit), at most 30
# Where Python, its packages and the system look for files that may be missing
# (compiled caches, optional data): a miss there is no attempt of the learner's.
_SYSTEM = tuple(
    {"/usr/", "/etc/", "/sys/", "/dev/", "/proc/self/", "/tmp/.course-"}
    | {p.rstrip("/") + "/" for p in (sys.prefix, sys.base_prefix, *sys.path) if p}
)


def _system(path: str) -> bool:
    return (path.rstrip("/") + "/").startswith(_SYSTEM)


def _attempt(what: str) -> None:
    if what not in ATTEMPTS and len(ATTEMPTS) < 30:
        ATTEMPTS.append(what[:300])


def _audit(event: str, args: tuple) -> None:
    """Records what the learner's code tries outside its own folder (the cwd): a write
    there is refused (read-only), a file read there may not exist in the sandbox, and
    the network does not exist; the code may catch the error, this hook sees it anyway."""
    try:
        if event == "open" and isinstance(args[0], (str, bytes)):
            path, mode, flags = os.fsdecode(args[0]), args[1] or "", args[2] or 0
            full = os.path.abspath(path)
            writes = any(c in mode for c in "wax+") or flags & (
                os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
            )
            inside = full == os.getcwd() or full.startswith(os.getcwd() + os.sep)
            if writes:
                if not inside:
                    _attempt(f"write {full} (outside its folder: read-only)")
            elif (
                path.startswith("/")
                and not _system(full)
                and not full.endswith(".pyc")
                and not os.path.exists(full)
            ):
                _attempt(f"read {full} (not in the sandbox)")
            elif full.startswith("/proc/") and full.endswith(("environ", "cmdline")):
                _attempt(f"read {full}")
        elif event in ("os.listdir", "os.scandir", "glob.glob") and args:
            path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else ""
            if (
                path.startswith("/")
                and not _system(path)
                and not os.path.exists(path.split("*")[0] or "/")
            ):
                _attempt(f"list {path} (not in the sandbox)")
        elif event in ("socket.connect", "socket.sendto", "socket.bind"):
            _attempt(f"{event.split('.')[1]} {args[-1]!r} (no network in the sandbox)")
        elif event == "socket.getaddrinfo":
            _attempt(f"look up {args[0]!r} (no network in the sandbox)")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn"):
            _attempt(f"start {str(args[1] if event != 'os.system' else args[0])[:200]}")
        elif event == "os.fork":
            _attempt("fork (os.fork)")
    except Exception:  # noqa: BLE001, S110 (an audit hook never stops the learner's code)
        pass


def _exec_cells(cells: list, namespace: dict) -> list[dict]:
    errors = []
    for number, code in cells:
        try:
            exec(compile(code, f"<code cell {number}>", "exec"), namespace)  # noqa: S102
        except BaseException as err:  # noqa: BLE001 (a raising cell does not stop the rest)
            errors.append(
                {
                    "cell": number,
                    "type": type(err).__name__,
                    "message": str(err) or _SILENT.get(type(err), "(no message)"),
                    "denied": isinstance(err, (OSError, MemoryError)),
                }
            )
    return errors


def main() -> None:
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the learner's prints and errors go nowhere
        os.dup2(devnull, fd)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    last: tuple[list, list] = ([], [])
    sys.addaudithook(_audit)  # after the worker's own imports and set-up
    while True:
        try:
            msg = recv(inp)
        except EOFError:
            return
        try:
            if msg["op"] == "report":
                send(out, {"ok": True, "result": list(ATTEMPTS)})
            elif msg["op"] == "exec":
                send(out, {"ok": True, "result": _exec_cells(msg["cells"], namespace)})
            elif msg["op"] == "call":
                fn = namespace.get(msg["fn"])
                if not callable(fn):
                    raise NameError(f"{msg['fn']} is not defined in the notebook")
                args, kwargs = msg["args"], msg["kwargs"]
                with torch.enable_grad():
                    result = fn(*args, **kwargs)
                inputs = [x for x in tensors((args, kwargs)) if x.requires_grad]
                outputs = [y for y in tensors(result) if y.is_floating_point()]
                last = (inputs, outputs)
                send(out, {"ok": True, "result": detach(result)})
            elif msg["op"] == "backward":
                inputs, outputs = last
                pairs = [
                    (y, g) for y, g in zip(outputs, msg["grads"]) if y.requires_grad
                ]
                grads = (
                    torch.autograd.grad(
                        [y for y, _ in pairs],
                        inputs,
                        [g for _, g in pairs],
                        allow_unused=True,
                    )
                    if pairs
                    else [None] * len(inputs)
                )
                send(
                    out,
                    {
                        "ok": True,
                        "result": [
                            torch.zeros_like(x) if g is None else g
                            for x, g in zip(inputs, grads)
                        ],
                    },
                )
        except BaseException as err:  # noqa: BLE001 (every error goes back to the checker)
            send(out, {"ok": False, "error": type(err).__name__, "message": str(err)})


if __name__ == "__main__":
    main()
