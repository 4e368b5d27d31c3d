"""How a learner's function computes, not only what it returns.

Some exercises forbid something: calling the library's own version of the function
being written, a Python loop over the batch or the heads, or reading a whole row of
scores at once where the exercise streams it. A right answer computed that way returns
the right numbers, so the checks also watch the call:

- ``own_code(fn, *library)``: ``fn`` wrapped so that a call that enters one of the
  library functions ``library`` fails the check (``sys.setprofile`` sees every Python
  call, so a one-line wrapper, an alias and a helper in between are all caught);
- ``torch_calls(fn, *args)``: the result and the torch functions the call ran, in order
  (a ``TorchFunctionMode``), from which ``loops_over`` sees a loop (more calls for a
  larger batch) and ``whole_row_reductions`` a softmax or maximum over more entries
  than one block.

Each check lists its library functions in ``check.library`` (dotted names), which the
instructor's re-check also reads.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from transformer_course.exercises._common import fail

Tensor = torch.Tensor


def qualified_name(obj) -> str:
    """``module.qualname`` of a function, e.g. "transformer_course.distill.mean_pool"."""
    return f"{obj.__module__}.{obj.__qualname__}"


def own_code(fn: Callable, *library: Callable) -> Callable:
    """``fn``, wrapped: a call that enters one of ``library`` raises ``CheckError``
    ("your my_mean_pool calls the library's transformer_course.distill.mean_pool ...").
    Only the learner's call is watched, not the check's own use of the library."""
    codes = {f.__code__: qualified_name(f) for f in library}
    name = getattr(fn, "__name__", "function")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        used: list[str] = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code in codes:
                used.append(codes[frame.f_code])

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            result = fn(*args, **kwargs)
        finally:
            sys.setprofile(previous)
        if used:
            fail(
                f"your {name} calls the library's {used[0]}: the exercise asks you to "
                "write that computation yourself",
                "the chapter imports the library version only to compare with; "
                "build the result from torch operations in your own function.",
            )
        return result

    return call


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[Callable, int | None]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        size = first.numel() if isinstance(first, Tensor) else None
        self.calls.append((func, size))
        return func(*args, **(kwargs or {}))


def torch_calls(fn: Callable, *args, **kwargs) -> tuple[object, list]:
    """``(fn(*args, **kwargs), calls)``: ``calls`` lists ``(torch function, numel of its
    first tensor argument or None)`` for every torch function or tensor method the call
    ran (nested calls inside torch are not listed)."""
    with _Recorder() as recorder:
        result = fn(*args, **kwargs)
    return result, recorder.calls


def loops_over(fn: Callable, small: tuple, large: tuple) -> bool:
    """True when ``fn(*large)`` runs more torch operations than ``fn(*small)``, where
    the two differ only in the size of one axis: a Python loop over that axis."""
    return len(torch_calls(fn, *large)[1]) > len(torch_calls(fn, *small)[1])


_REDUCTIONS = {
    torch.softmax,
    torch.Tensor.softmax,
    F.softmax,
    torch.log_softmax,
    torch.Tensor.log_softmax,
    F.log_softmax,
    torch.logsumexp,
    torch.Tensor.logsumexp,
    torch.max,
    torch.Tensor.max,
    torch.amax,
    torch.Tensor.amax,
    torch.sum,
    torch.Tensor.sum,
}


def whole_row_reductions(calls: list, block: int) -> list[str]:
    """Names of the softmax/max/sum calls in ``calls`` over more than ``block``
    entries: the row was read at once, not one block at a time."""
    return [
        getattr(func, "__name__", str(func))
        for func, size in calls
        if func in _REDUCTIONS and size is not None and size > block
    ]
