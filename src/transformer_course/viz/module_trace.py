"""Recording one forward pass as boxes and arrows (the engine of ``viz.diagrams``).

Forward hooks on every sub-module see its inputs and outputs; a profiler hook sees the
library functions of ``FUNCTIONS`` (split/merge heads, the attention backends, ...);
a ``TorchFunctionMode`` sees the tensor operations between them (residual additions,
matrix products, scalings). Each tensor remembers the box that produced it, so the
arrows are the real data flow and carry the recorded shapes.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field, fields, is_dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course import attention, flash, layers, model, positional, vision
from transformer_course.viz.module_labels import describe, role_of

FUNCTIONS = {
    attention.scaled_dot_product_attention: (
        "scaled dot-product attention",
        "attention",
    ),
    attention.sdpa_attention: ("fused scaled dot-product attention", "attention"),
    flash.tiled_attention: ("tiled attention", "attention"),
    attention.masked_softmax: ("softmax (masked)", "attention"),
    attention.repeat_kv: ("repeat K/V heads", None),
    attention.MultiHeadAttention.split_heads: ("split heads", None),
    attention.MultiHeadAttention.merge_heads: ("merge heads", "attention"),
    positional.apply_rotary: ("rotary positions", "embedding"),
    vision.patchify: ("patchify", "embedding"),
}
_CODES = {fn.__code__: fn for fn in FUNCTIONS}
#: modules expanded into their parts by default
EXPAND = (
    model.Transformer,
    model.Encoder,
    model.Decoder,
    model.DecoderOnlyLM,
    model.InputEmbedding,
    layers.TransformerLayer,
    vision.Captioner,
    vision.ImageEncoder,
    nn.ModuleList,
    nn.Sequential,
)
_TRANSPARENT = (nn.ModuleList, nn.Sequential)  # expanded without a cluster of their own
_PASS = (nn.Dropout, nn.Identity)  # never drawn
_OPS = {"add": "+", "matmul": "matmul", "bmm": "matmul", "softmax": "softmax"}
_QKV = ("query", "key", "value")
_IN_LIBRARY = re.compile(r"transformer_course[/\\](?!viz)")


@dataclass
class Node:
    id: str
    label: str
    role: str  # a key of style.ROLE_COLORS
    kind: str  # "module", "function", "op", "input", "mask", "output"
    cluster: str | None = None


@dataclass
class Edge:
    tail: str
    head: str
    shape: tuple[int, ...]
    names: list[str] = field(default_factory=list)
    residual: bool = False
    invisible: bool = False  # only orders the layout (stacked pictures)


@dataclass
class Cluster:
    id: str
    label: str
    parent: str | None


def _tensors(x, name: str = ""):
    """(name, tensor) pairs of the tensors in x (nested tuples, lists, dicts,
    dataclasses)."""
    if isinstance(x, torch.Tensor):
        yield name, x
    elif isinstance(x, (tuple, list)):
        for item in x:
            yield from _tensors(item, name)
    elif isinstance(x, dict):
        for key, item in x.items():
            yield from _tensors(item, str(key))
    elif is_dataclass(x) and not isinstance(x, type):
        for f in fields(x):
            yield from _tensors(getattr(x, f.name), f.name)


def _bound(fn, args, kwargs):
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return [("", a) for a in args] + list(kwargs.items())
    return list(bound.arguments.items())


@dataclass
class _Frame:
    kind: str  # "expand", "box", "hidden"
    key: object  # the module, or the Python frame of a function
    cluster: str | None = None
    node: str | None = None
    source: str | None = None  # hidden: the producer its output inherits


class _Tracer(TorchFunctionMode):
    """Records one forward pass of ``root`` as nodes, edges and clusters."""

    def __init__(self, root: nn.Module, expand, collapse, repeat: bool):
        super().__init__()
        self.root, self.expand, self.collapse = root, tuple(expand), tuple(collapse)
        self.nodes: list[Node] = []
        self.edges: dict[tuple, Edge] = {}
        self.clusters: list[Cluster] = []
        self.producer: dict[int, str] = {}
        self.alive: list[torch.Tensor] = []  # keeps ids unique while tracing
        self.stack: list[_Frame] = []
        self.names = {m: n for n, m in root.named_modules()}
        self.hidden, self.times = set(), {}
        if repeat:
            self._find_repeats()

    def _find_repeats(self) -> None:
        for m in self.root.modules():
            if isinstance(m, nn.ModuleList) and len(m):
                same = [x for x in m if type(x) is type(m[0])]
                self.times[m[0]] = len(same)
                self.hidden.update(same[1:])

    # -- bookkeeping ---------------------------------------------------------------------
    def _suppressed(self) -> bool:
        return any(f.kind != "expand" for f in self.stack)

    def _cluster(self) -> str | None:
        return next((f.cluster for f in reversed(self.stack) if f.cluster), None)

    def _node(self, label: str, role: str, kind: str) -> str:
        node = Node(f"n{len(self.nodes)}", label, role, kind, self._cluster())
        self.nodes.append(node)
        return node.id

    def _produce(self, out, node: str | None) -> None:
        for _, t in _tensors(out):
            self.alive.append(t)
            if node is None:
                self.producer.pop(id(t), None)
            else:
                self.producer[id(t)] = node

    def _mask_name(self, t: torch.Tensor, fallback: str) -> str:
        name, frame = fallback, sys._getframe(1)
        while frame is not None:  # the outermost library frame that names it
            if _IN_LIBRARY.search(frame.f_code.co_filename):
                found = [k for k, v in frame.f_locals.items() if v is t]
                name = found[0] if found else name
            frame = frame.f_back
        return name

    def _connect(self, head: str, named) -> list[str]:
        """Arrows from the producers of ``named`` tensors into ``head``; returns the
        producers in order."""
        tails = []
        for name, t in named:
            tail = self.producer.get(id(t))
            if tail is None and t.dtype == torch.bool and t.dim() > 0:  # a mask
                label = f"{self._mask_name(t, name or 'mask')} (bool)"
                tail = self.producer[id(t)] = self._node(label, "mask", "mask")
                self.alive.append(t)
            if tail is None:
                continue
            edge = self.edges.setdefault(
                (tail, head, id(t)), Edge(tail, head, tuple(t.shape))
            )
            if name and name not in edge.names:
                edge.names.append(name)
            tails.append(tail)
        return tails

    def _enter(self, key, target, label_of, named, *, role=None) -> None:
        """A module or function call starts: expand it, hide it or draw it as a box."""
        if self._suppressed():
            return
        if target in self.hidden:
            source = next((self.producer.get(id(t)) for _, t in named), None)
            self.stack.append(_Frame("hidden", key, source=source))
        elif target is self.root or self._expands(target):
            cluster = None
            if target is not self.root and not isinstance(target, _TRANSPARENT):
                cluster = f"cluster_{len(self.clusters)}"
                self.clusters.append(Cluster(cluster, label_of(), self._cluster()))
            if target is self.root:
                for name, t in named:
                    if id(t) in self.producer:
                        self.nodes[int(self.producer[id(t)][1:])].label += f" = {name}"
                    else:
                        bool_ = t.dtype == torch.bool
                        node = self._node(
                            name,
                            "mask" if bool_ else "data",
                            "mask" if bool_ else "input",
                        )
                        self.producer[id(t)] = node
                        self.alive.append(t)
            self.stack.append(_Frame("expand", key, cluster=cluster))
        else:
            node = self._node(label_of(), role or "attention", "box")
            tails = self._connect(node, named)
            if role is None:  # a function keeps the role of its Q, K or V input
                inherited = [self.nodes[int(t[1:])].role for t in tails]
                self.nodes[int(node[1:])].role = next(
                    (r for r in inherited if r in _QKV), "attention"
                )
            self.stack.append(_Frame("box", key, node=node))

    def _exit(self, key, out) -> None:
        if not self.stack or self.stack[-1].key is not key:
            return
        frame = self.stack.pop()
        if frame.kind == "box":
            self._produce(out, frame.node)
        elif frame.kind == "hidden":
            self._produce(out, frame.source)

    def _expands(self, target) -> bool:
        def listed(among) -> bool:
            if isinstance(target, nn.Module):
                classes = tuple(x for x in among if isinstance(x, type))
                return isinstance(target, classes) or self.names.get(target) in among
            return target in among

        return listed(self.expand) and not listed(self.collapse)

    # -- the three hooks -----------------------------------------------------------------
    def pre_hook(self, m, args, kwargs):
        if isinstance(m, _PASS):
            return
        name = self.names[m]
        times = self.times.get(m, 1)

        def label():
            if times > 1:
                return f"{describe(m)} \u00d7 {times}"
            parts = name.split(".")
            head = ".".join(parts[-2:]) if parts[-1].isdigit() else parts[-1]
            return f"{head}: {describe(m)}" if head else describe(m)

        named = [
            (n, t)
            for n, v in _bound(m.forward, args, kwargs)
            for _, t in _tensors(v, n)
        ]
        self._enter(m, m, label, named, role=role_of(m, name))
        return

    def post_hook(self, m, args, kwargs, out):
        if m is self.root:
            self._exit(m, None)
            node = self._node("output", "data", "output")
            for _, t in _tensors(out):
                if id(t) in self.producer and t.dtype != torch.bool:
                    self._connect(node, [("", t)])
            return
        self._exit(m, out)
        return

    def profile(self, frame, event, arg):
        fn = _CODES.get(frame.f_code)
        if fn is None:
            return
        if event == "call":
            if fn is attention.repeat_kv and frame.f_locals.get("n_rep") == 1:
                return
            label, role = FUNCTIONS[fn]
            local = frame.f_locals
            names = frame.f_code.co_varnames[: frame.f_code.co_argcount]
            named = [(n, t) for n in names for _, t in _tensors(local.get(n), n)]
            self._enter(frame, fn, lambda: label, named, role=role)
        elif event == "return":
            self._exit(frame, arg)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._suppressed() or not self.stack:
            return out
        name = getattr(func, "__name__", "")
        named = list(_tensors(list(args) + list(kwargs.values())))
        scalar = [a for a in args[1:] if isinstance(a, (int, float))]
        if name in _OPS or (
            name == "mul" and scalar and not isinstance(scalar[0], bool)
        ):
            label = _OPS.get(name) or f"\u00d7 {scalar[0]:.3g}"
            if not any(id(t) in self.producer for _, t in named):
                return out
            node = self._node(label, "attention" if label != "+" else "residual", "op")
            tails = self._connect(node, named)
            skip = min(tails, key=lambda n: int(n[1:]), default=None)
            branches = any(t == skip and h != node for t, h, _ in self.edges)
            if name == "add" and len(set(tails)) == 2 and branches:
                # the skip path: the older input, which also feeds the other branch
                for (tail, head, _), edge in self.edges.items():
                    if tail == skip and head == node:
                        edge.residual = True
            self._produce(out, node)
            return out
        source = next(
            (self.producer[id(t)] for _, t in named if id(t) in self.producer), None
        )
        first = next((t for _, t in named if id(t) in self.producer), None)
        outs = list(_tensors(out))
        if first is not None and outs and outs[0][1].dtype == torch.bool != first.dtype:
            source = None  # a comparison makes a mask, not more of the same data
        self._produce(out, source)
        return out


def trace(module: nn.Module, inputs, kwargs, *, expand, collapse, repeat: bool):
    """Run ``module(*inputs, **kwargs)`` once in eval mode without gradients and return
    ``(nodes, edges, clusters)``; the module's hooks and mode are restored after."""
    tracer = _Tracer(module, (*EXPAND, *expand), collapse, repeat)
    hooks = [
        h
        for m in module.modules()
        for h in (
            m.register_forward_pre_hook(tracer.pre_hook, with_kwargs=True),
            m.register_forward_hook(tracer.post_hook, with_kwargs=True),
        )
    ]
    was_training = module.training
    module.eval()
    previous = sys.getprofile()
    try:
        with torch.no_grad(), tracer:
            sys.setprofile(tracer.profile)
            try:
                module(*inputs, **kwargs)
            finally:
                sys.setprofile(previous)
    finally:
        for h in hooks:
            h.remove()
        module.train(was_training)
    return tracer.nodes, list(tracer.edges.values()), tracer.clusters
