"""Block diagrams drawn from the modules themselves and one forward pass.

``diagram(module, *inputs)`` runs ``module(*inputs)`` once and records what happens:
forward hooks on every sub-module (its inputs and outputs), a profiler hook on the
library functions of ``FUNCTIONS`` (split/merge heads, the attention backends, ...),
and a ``TorchFunctionMode`` that sees the tensor operations between them (the
residual additions, matrix products, scalings). Each tensor remembers which box
produced it, so the arrows are the real data flow and carry the recorded shapes.
Because the picture comes from the code, it cannot drift from it.

- Containers (the model, encoder, decoder, a ``TransformerLayer``) are *expanded*:
  drawn as a cluster around their parts. Other modules are one box each.
- Of identical layers in a ``ModuleList`` only the first is drawn, labelled "x N"
  (as in the paper's figure 1); the others pass the data through.
- Bool tensors with no drawing producer are masks: a dashed box, named after the
  variable that holds them in the model's code, with arrows to where they apply.
- A residual addition's older input (the skip path) is a dashed grey arrow.

Layout is Graphviz's ``dot`` (the ``graphviz`` Python package and the system
``graphviz``; ``make book`` installs it). A ``Diagram`` shows itself in Jupyter as
inline SVG with alt text listing its boxes; ``nodes``/``edges`` serve tests.
"""

from __future__ import annotations

import inspect
import itertools
import re
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from html import escape

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course import attention, flash, layers, model, positional, vision
from transformer_course.viz import style

# Library functions drawn as a box: (label, role). role None: the role of the input.
FUNCTIONS = {
    attention.scaled_dot_product_attention: ("scaled dot-product attention", "attention"),
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
    model.Embedding,
    layers.TransformerLayer,
    vision.Captioner,
    vision.ImageEncoder,
    nn.ModuleList,
    nn.Sequential,
)
_TRANSPARENT = (nn.ModuleList, nn.Sequential)  # expanded without a cluster of their own
_PASS = (nn.Dropout, nn.Identity)  # never drawn
_OPS = {"add": "+", "matmul": "matmul", "bmm": "matmul", "softmax": "softmax"}
_ROLE_BY_CLASS = [
    (attention.MultiHeadAttention, "attention"),
    (layers.FeedForward, "feedforward"),
    (nn.LayerNorm, "norm"),
    (nn.Embedding, "embedding"),
    (positional.SinusoidalPositionalEncoding, "embedding"),
    (positional.LearnedPositionalEmbedding, "embedding"),
    (positional.RotaryEmbedding, "embedding"),
    (vision.PatchEmbedding, "embedding"),
]
_ROLE_BY_NAME = {"q_proj": "query", "k_proj": "key", "v_proj": "value"}
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


@dataclass
class Cluster:
    id: str
    label: str
    parent: str | None


def _describe(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return f"Linear {m.in_features}\u2192{m.out_features}"
    if isinstance(m, attention.MultiHeadAttention):
        kv = f", H_kv={m.n_kv_heads}" if m.n_kv_heads != m.n_heads else ""
        return f"multi-head attention H={m.n_heads}{kv}"
    if isinstance(m, layers.FeedForward):
        return f"feed-forward {m.linear1.in_features}\u2192{m.linear1.out_features}"
    if isinstance(m, nn.Embedding):
        return f"Embedding {m.num_embeddings}\u00d7{m.embedding_dim}"
    return type(m).__name__


def _role(m: nn.Module, name: str) -> str:
    short = name.rsplit(".", 1)[-1]
    if short in _ROLE_BY_NAME:
        return _ROLE_BY_NAME[short]
    for cls, role in _ROLE_BY_CLASS:
        if isinstance(m, cls):
            return role
    return "norm" if "Norm" in type(m).__name__ else "linear"


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

    def __init__(self, root: nn.Module, expand, repeat: bool):
        super().__init__()
        self.root, self.expand, self.repeat = root, tuple(expand), repeat
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
        tails, masks = [], {}
        for name, t in named:
            tail = self.producer.get(id(t))
            if tail is None and t.dtype == torch.bool and t.dim() > 0:
                if id(t) not in masks:
                    label = f"{self._mask_name(t, name or 'mask')} (bool)"
                    masks[id(t)] = tail = self._node(label, "mask", "mask")
                    self.producer[id(t)] = tail
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
        if target is self.root or self._expands(target):
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
                            name, "mask" if bool_ else "data", "mask" if bool_ else "input"
                        )
                        self.producer[id(t)] = node
                        self.alive.append(t)
            self.stack.append(_Frame("expand", key, cluster=cluster))
        elif target in self.hidden:
            source = next((self.producer.get(id(t)) for _, t in named), None)
            self.stack.append(_Frame("hidden", key, source=source))
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
        classes = tuple(x for x in self.expand if isinstance(x, type))
        if isinstance(target, nn.Module):
            return isinstance(target, classes) or self.names.get(target) in self.expand
        return target in self.expand

    # -- the three hooks -----------------------------------------------------------------
    def pre_hook(self, m, args, kwargs):
        if isinstance(m, _PASS):
            return None
        name = self.names[m]
        times = self.times.get(m, 1)

        def label():
            head = name.rsplit(".", 1)[-1]
            text = f"{head}: {_describe(m)}" if head else _describe(m)
            return text + (f" \u00d7 {times}" if times > 1 else "")

        named = [(n, t) for n, v in _bound(m.forward, args, kwargs) for _, t in _tensors(v, n)]
        self._enter(m, m, label, named, role=_role(m, name))
        return None

    def post_hook(self, m, args, kwargs, out):
        if m is self.root:
            self._exit(m, None)
            node = self._node("output", "data", "output")
            for _, t in _tensors(out):
                if id(t) in self.producer and t.dtype != torch.bool:
                    self._connect(node, [("", t)])
            return None
        self._exit(m, out)
        return None

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
        if name in _OPS or (name == "mul" and scalar and not isinstance(scalar[0], bool)):
            label = _OPS.get(name) or f"\u00d7 {scalar[0]:.3g}"
            if not any(id(t) in self.producer for _, t in named):
                return out
            node = self._node(label, "attention" if label != "+" else "residual", "op")
            tails = self._connect(node, named)
            if name == "add" and len(set(tails)) == 2:  # the skip path is the older one
                skip = min(tails, key=lambda n: int(n[1:]))
                for (tail, head, _), edge in self.edges.items():
                    if tail == skip and head == node:
                        edge.residual = True
            self._produce(out, node)
            return out
        source = next((self.producer[id(t)] for _, t in named if id(t) in self.producer), None)
        first = next((t for _, t in named if id(t) in self.producer), None)
        outs = list(_tensors(out))
        if first is not None and outs and outs[0][1].dtype == torch.bool != first.dtype:
            source = None  # a comparison makes a mask, not more of the same data
        self._produce(out, source)
        return out


class Diagram:
    """A block diagram: ``nodes``, ``edges`` and ``clusters``, rendered by Graphviz.

    ``boxes()`` lists the drawn labels in order; ``alt_text`` describes them;
    ``svg()`` is the picture; in Jupyter it shows as inline SVG (``_repr_html_``).
    """

    def __init__(self, title, nodes, edges, clusters, *, rankdir: str = "TB"):
        self.title, self.nodes, self.edges = title, nodes, edges
        self.clusters, self.rankdir = clusters, rankdir
        self._svg: str | None = None

    def boxes(self, kind: str | None = None) -> list[str]:
        """Labels of the nodes (of one ``kind``: "box", "op", "input", "mask",
        "output"), in the order the forward pass reached them."""
        return [n.label for n in self.nodes if kind is None or n.kind == kind]

    def edge_labels(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(tail label, head label, shape) of every arrow."""
        by_id = {n.id: n.label for n in self.nodes}
        return [(by_id[e.tail], by_id[e.head], e.shape) for e in self.edges]

    @property
    def alt_text(self) -> str:
        parts = [f"Block diagram of {self.title}"]
        for kind, what in (("input", "inputs"), ("box", "boxes"), ("mask", "masks")):
            labels = self.boxes(kind)
            if labels:
                parts.append(f"{what}: {', '.join(labels)}")
        if self.clusters:
            parts.append("groups: " + ", ".join(c.label for c in self.clusters))
        return "; ".join(parts)

    def graph(self):
        """The ``graphviz.Digraph`` of this diagram."""
        return render_graph(self)

    def svg(self) -> str:
        """The picture as an SVG element (ids prefixed, alt text as its title)."""
        if self._svg is None:
            self._svg = svg_element(self.graph(), self.alt_text)
        return self._svg

    def min_text_px(self) -> float:
        """On-page px of the smallest text when shown in the 684 px column."""
        return svg_min_text_px(self.svg())

    def _repr_html_(self) -> str:
        return diagram_html(self.svg(), self.min_text_px())

    def _repr_svg_(self) -> str:
        return self.svg()


def diagram(module: nn.Module, *inputs, expand=(), repeat: bool = True, title=None,
            rankdir: str = "TB", **kwargs) -> Diagram:
    """Draw ``module`` from one forward pass ``module(*inputs, **kwargs)``.

    Args:
        module: any ``nn.Module`` (e.g. ``MultiHeadAttention(32, 4)``).
        inputs, kwargs: its forward arguments, e.g. ``x, x, x`` for self-attention.
        expand: more modules (classes, qualified names) and ``FUNCTIONS`` to draw as
            a cluster of their parts instead of one box (default: ``EXPAND``).
        repeat: draw only the first of identical layers, labelled "x N".
        title: for the alt text (default: the class name). rankdir: "TB" or "LR".

    Returns:
        A ``Diagram`` (displays itself; ``boxes()`` and ``edge_labels()`` for tests).

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: if ``rankdir`` is not "TB" or "LR"; whatever the forward raises.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if rankdir not in ("TB", "LR"):
        raise ValueError(f"rankdir: expected 'TB' or 'LR', got {rankdir!r}")
    tracer = _Tracer(module, (*EXPAND, *expand), repeat)
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
    return Diagram(
        title or type(module).__name__,
        tracer.nodes,
        list(tracer.edges.values()),
        tracer.clusters,
        rankdir=rankdir,
    )


# -- rendering (shared with viz.schematics) ----------------------------------------------

NODE_PT, EDGE_PT, CLUSTER_PT = 12, 10.5, 11  #: Graphviz font sizes (points)
FONT = "DejaVu Sans"
_SHAPES = {"op": "circle", "input": "plaintext", "output": "plaintext", "mask": "box"}


def new_graph(rankdir: str = "TB"):
    """A ``graphviz.Digraph`` in the book style."""
    import graphviz

    g = graphviz.Digraph(format="svg")
    g.attr(rankdir=rankdir, fontname=FONT, fontsize=str(CLUSTER_PT), nodesep="0.3",
           ranksep="0.32", bgcolor="transparent", newrank="true")
    g.attr("node", fontname=FONT, fontsize=str(NODE_PT), margin="0.12,0.05", height="0.3")
    g.attr("edge", fontname=FONT, fontsize=str(EDGE_PT), arrowsize="0.7",
           color=style.ROLE_COLORS["data"], fontcolor="#333333")
    return g


def render_graph(d: Diagram):
    g = new_graph(d.rankdir)
    color = style.ROLE_COLORS
    bodies = {c.id: new_graph_body(c) for c in d.clusters}
    for n in d.nodes:
        attrs = dict(shape=_SHAPES.get(n.kind, "box"), color=color[n.role])
        if n.kind in ("box", "mask"):
            attrs.update(style="rounded,filled" + (",dashed" if n.kind == "mask" else ""),
                         fillcolor=style.tint(color[n.role]), penwidth="1.4")
        if n.kind == "op":
            attrs.update(style="filled", fillcolor="white", width="0.3", margin="0.02")
        (bodies[n.cluster] if n.cluster else g).node(n.id, n.label, **attrs)
    for e in d.edges:
        tail = next(n for n in d.nodes if n.id == e.tail)
        head = next(n for n in d.nodes if n.id == e.head)
        inbound = sum(1 for x in d.edges if x.head == e.head)
        label = ", ".join(str(s) for s in e.shape)
        label = f"({label})"
        if e.names and inbound > 1 and head.kind == "box":
            label = f"{', '.join(e.names)} {label}"
        attrs = {"label": f" {label} "}
        if tail.role in _QKV or tail.role == "mask":
            attrs["color"] = color[tail.role]
        if tail.kind == "mask":
            attrs["style"] = "dashed"
        if e.residual:
            attrs.update(style="dashed", color=color["residual"], label=" residual ")
        g.edge(e.tail, e.head, **attrs)
    for c in reversed(d.clusters):  # innermost first: a parent copies its children
        (bodies[c.parent] if c.parent else g).subgraph(bodies[c.id])
    return g


def new_graph_body(c: Cluster):
    import graphviz

    body = graphviz.Digraph(name=c.id)
    body.attr(label=c.label, labeljust="l", style="rounded,dashed", color="#9A9A9A",
              fontcolor="#333333")
    return body


_ID = re.compile(r'\bid="([^"]+)"')
_FONT = re.compile(r'font-size="([\d.]+)"')
_counter = itertools.count()


def svg_element(graph, alt: str) -> str:
    """Render ``graph`` to an ``<svg>`` element for inline HTML: no XML prolog, ids
    prefixed (many diagrams share a page), Graphviz's per-node titles replaced by one
    title holding ``alt``, role="img" with ``aria-label``, and scaled to the column."""
    svg = graph.pipe(format="svg", encoding="utf-8")
    svg = svg[svg.index("<svg"):]
    prefix = f"tcd{next(_counter)}-"
    svg = _ID.sub(lambda m: f'id="{prefix}{m[1]}"', svg)
    svg = re.sub(r"<title>.*?</title>\n?", "", svg, flags=re.DOTALL)
    svg = svg.replace(
        "<svg ",
        f'<svg role="img" aria-label="{escape(alt)}" '
        'style="max-width:100%;height:auto" ',
        1,
    )
    head_end = svg.index(">") + 1
    return svg[:head_end] + f"\n<title>{escape(alt)}</title>" + svg[head_end:]


def svg_min_text_px(svg: str) -> float:
    """On-page px of the smallest text of ``svg`` (Graphviz sizes are in pt; the
    browser draws 1 pt as 4/3 px and scales an SVG wider than the column down)."""
    width_pt = float(re.search(r'width="([\d.]+)pt"', svg)[1])
    width_px = width_pt * 4 / 3
    smallest = min(float(s) for s in _FONT.findall(svg))
    return smallest * 4 / 3 * min(1.0, style.COLUMN_PX / width_px)


def diagram_html(svg: str, min_text_px: float) -> str:
    """The page's markup of a diagram: ``<figure class="tc-diagram">`` around the
    SVG, with the smallest text in px for tools/measure_pages.py."""
    return (
        f'<figure class="tc-diagram" data-min-text-px="{min_text_px:.1f}" '
        f'style="margin:0">{svg}</figure>'
    )
