"""The untrusted side of the isolated re-check: runs the learner's code and answers calls.

Started by ``recheck.RemoteFunctions`` inside the sandbox (never by hand)::

    python -m course_grading.worker

stdin/stdout carry framed messages (``wire``); the learner's own prints and errors go to
/dev/null. Requests: ``{"op": "exec", "cells": [(number, code), ...]}`` runs the cells
(a raising cell does not stop the rest) and answers the errors; ``{"op": "call", "fn",
"args", "kwargs"}`` calls a function of the notebook and answers its result, detached;
``{"op": "backward", "grads"}`` answers the gradients of the last call's inputs.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from course_grading.wire import detach, recv, send, tensors

# What an exception raised without a message means, so no flag ends at its colon.
_SILENT = {MemoryError: "out of memory (the grader's --memory limit per process)"}


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
    while True:
        try:
            msg = recv(inp)
        except EOFError:
            return
        try:
            if msg["op"] == "exec":
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
