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

Where the function runs in another process (the instructor's re-check calls it
through a proxy), nothing can be watched; the proxy then carries the notebook's code as
``__learner_source__`` and ``own_code`` reads it instead (``library_use``: the imports
and the names the function's body uses, resolved statically).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
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


class Forbidden:
    """A library function refused only when called in one way: ``func`` entered with
    ``keyword`` set to a value for which ``when(value)`` is true, e.g.
    ``Forbidden(F.cross_entropy, "label_smoothing", lambda eps: eps > 0)``: the
    cross-entropy may be used, its built-in label smoothing may not. The static reading
    (``library_use``) refuses any call in the function's code that passes ``keyword``."""

    def __init__(self, func: Callable, keyword: str, when: Callable[[object], bool]):
        self.func, self.keyword, self.when = func, keyword, when
        self.__code__ = func.__code__
        self.__module__, self.__qualname__ = func.__module__, func.__qualname__

    def refuses(self, frame) -> bool:
        value = frame.f_locals.get(self.keyword)
        try:
            return bool(self.when(value))
        except Exception:  # noqa: BLE001 (a value the condition cannot judge)
            return False

    def __repr__(self) -> str:
        return f"{qualified_name(self.func)}({self.keyword}=...)"


def _code_of(item) -> object:
    """The code object ``own_code`` watches for a library function, a class (its
    ``forward``) or a ``Forbidden`` entry."""
    if isinstance(item, type):
        return item.forward.__code__
    return item.__code__


def _label(item) -> str:
    if isinstance(item, Forbidden):
        return repr(item)
    return qualified_name(item)


def own_code(fn: Callable, *library) -> Callable:
    """``fn``, wrapped: a call that enters one of ``library`` raises ``CheckError``
    ("your my_mean_pool calls the library's transformer_course.distill.mean_pool ...").
    An entry is a function, a class (its ``forward`` is watched, so a module loaded
    with the weights is refused) or a ``Forbidden`` (a function refused only for some
    arguments). Only the learner's call is watched, not the check's own use of the
    library. The checks declare their entries with ``forbids`` (``check.forbidden``)."""
    codes = {_code_of(f): f for f in library}
    name = getattr(fn, "__name__", "function")
    source = getattr(fn, "__learner_source__", None)
    if source is not None:  # runs elsewhere: read the notebook's code instead
        used = library_use(source, name, library)
        if used:
            _refuse(name, used)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        used: list[str] = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code in codes:
                item = codes[frame.f_code]
                if not isinstance(item, Forbidden) or item.refuses(frame):
                    used.append(_label(item))

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            result = fn(*args, **kwargs)
        except Exception:
            if used:  # the library raised on what it was given: say what was called
                _refuse(name, used[0])
            raise
        finally:
            sys.setprofile(previous)
        if used:
            _refuse(name, used[0])
        return result

    return call


def forbids(*library) -> Callable[[Callable], Callable]:
    """Decorator of a check (below ``exercise_check``): the check's first argument, the
    learner's function, runs under ``own_code(fn, *library)``, and the check carries
    ``forbidden = library`` (read by ``tests/sources/test_exercise_rules.py``: no
    chapter may import one of them by name before the exercise). Every exercise that
    forbids the library's own version declares it here, one mechanism for all
    chapters. ``library_ok=True`` skips the refusal, for a chapter that runs the check
    on the library itself (chapter 5's backends)."""

    def decorate(check: Callable) -> Callable:
        @functools.wraps(check)
        def wrapped(fn, *args, library_ok: bool = False, **kwargs):
            return check(fn if library_ok else own_code(fn, *library), *args, **kwargs)

        wrapped.forbidden = library
        return wrapped

    return decorate


def _refuse(name: str, used: str) -> None:
    fail(
        "your {name} calls the library's {used}: the exercise asks you to "
        "write that computation yourself",
        "the chapter imports the library version only to compare with; build the "
        "result from torch operations in your own function.",
        name=name,
        used=used,
    )


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _resolve(dotted: str):
    """The object a dotted name like "transformer_course.distill.mean_pool" names."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        with contextlib.suppress(ImportError, ValueError, AttributeError):
            obj = importlib.import_module(".".join(parts[:cut]))
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return obj
    return None


def library_use(source: str, name: str, library: tuple[Callable, ...]) -> str | None:
    """Read, without running it, the notebook code ``source``: the dotted name of the
    one of ``library`` that ``name`` is bound to (``from transformer_course.distill
    import mean_pool as my_mean_pool``, ``my_mean_pool = distill.mean_pool``) or that
    its body, or a top-level function its body calls, refers to; None otherwise."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    aliases: dict[str, str] = {}  # local name -> dotted name it stands for
    stars: list[str] = []  # modules imported with *
    bound: dict[str, ast.AST] = {}  # top-level name -> its def or assigned value
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name == "*":
                    stars.append(node.module)
                else:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = node.value
    wanted = {id(f): qualified_name(f) for f in library if not isinstance(f, Forbidden)}
    keywords = {f.keyword: repr(f) for f in library if isinstance(f, Forbidden)}

    def found(dotted: str | None) -> str | None:
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        heads = [aliases[head]] if head in aliases else [f"{m}.{head}" for m in stars]
        for full in heads:
            obj = _resolve(full + ("." + rest if rest else ""))
            if id(obj) in wanted:
                return wanted[id(obj)]
        return None

    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        hit = found(current)
        if hit:
            return hit
        node = bound.get(current)
        if node is None:
            continue
        local = {  # the function's own variables shadow the notebook's
            sub.id
            for sub in ast.walk(node)
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)
        } | {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                for kw in sub.keywords:
                    if kw.arg in keywords:  # e.g. label_smoothing=: refused
                        return keywords[kw.arg]
            if isinstance(sub, ast.Name) and sub.id in local:
                continue
            if isinstance(sub, (ast.Name, ast.Attribute)):
                hit = found(_dotted(sub))
                if hit:
                    return hit
                if isinstance(sub, ast.Name) and sub.id in bound:
                    todo.append(sub.id)
    return None


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
