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

from torch import nn

from transformer_course import layers
from transformer_course.viz.graph_render import Picture, render_graph
from transformer_course.viz.module_trace import Cluster, Edge, Node, trace


class Diagram(Picture):
    """A block diagram: ``nodes``, ``edges`` and ``clusters``, rendered by Graphviz.

    ``boxes()`` lists the drawn labels in order; ``alt_text`` describes them;
    ``svg()`` is the picture; in Jupyter it shows as inline SVG (``_repr_html_``).
    """

    def __init__(self, title, nodes, edges, clusters, *, rankdir: str = "TB"):
        super().__init__()
        self.title, self.nodes, self.edges = title, nodes, edges
        self.clusters, self.rankdir = clusters, rankdir

    def boxes(self, kind: str | None = None) -> list[str]:
        """Labels of the nodes (of one ``kind``: "box", "op", "input", "mask",
        "output"), in the order the forward pass reached them."""
        return [n.label for n in self.nodes if kind is None or n.kind == kind]

    def edge_labels(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(tail label, head label, shape) of every arrow."""
        by_id = {n.id: n.label for n in self.nodes}
        return [
            (by_id[e.tail], by_id[e.head], e.shape)
            for e in self.edges
            if not e.invisible
        ]

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


def diagram(
    module: nn.Module,
    *inputs,
    expand=(),
    collapse=(),
    repeat: bool = True,
    title=None,
    rankdir: str = "TB",
    **kwargs,
) -> Diagram:
    """Draw ``module`` from one forward pass ``module(*inputs, **kwargs)``.

    Args:
        module: any ``nn.Module`` (e.g. ``MultiHeadAttention(32, 4)``).
        inputs, kwargs: its forward arguments, e.g. ``x, x, x`` for self-attention.
        expand: more modules (classes, qualified names) and ``FUNCTIONS`` to draw as
            a cluster of their parts instead of one box (default: ``EXPAND``).
        collapse: modules or functions to draw as one box although ``expand``
            lists them (e.g. ``TransformerLayer`` for a model at a glance).
        repeat: draw only the first of identical layers, labelled "x N".
        title: for the alt text (default: the class name). rankdir: "TB" or "LR".

    Returns:
        A ``Diagram`` (displays itself; ``boxes()`` and ``edge_labels()`` for tests).

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: if ``rankdir`` is not "TB" or "LR"; whatever the forward raises.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"module: expected a torch.nn.Module, got {type(module).__name__}"
        )
    if rankdir not in ("TB", "LR"):
        raise ValueError(f"rankdir: expected 'TB' or 'LR', got {rankdir!r}")
    nodes, edges, clusters = trace(
        module, inputs, kwargs, expand=expand, collapse=collapse, repeat=repeat
    )
    return Diagram(
        title or type(module).__name__,
        nodes,
        edges,
        clusters,
        rankdir=rankdir,
    )


def side_by_side(diagrams, labels, *, title: str, stacked: bool = False) -> Diagram:
    """One picture of several diagrams, each in a cluster labelled by ``labels``;
    ``stacked`` puts each below the previous one (narrow enough for the page).

    Raises:
        ValueError: if ``labels`` and ``diagrams`` differ in length.
    """
    diagrams = list(diagrams)
    if len(labels) != len(diagrams):
        raise ValueError(f"labels: expected {len(diagrams)} labels, got {len(labels)}")
    nodes, edges, clusters = [], [], []
    for i, (d, label) in enumerate(zip(diagrams, labels)):
        top = f"cluster_d{i}"
        clusters.append(Cluster(top, label, None))

        def moved(name: str | None, i=i, top=top) -> str:
            return f"{name}_d{i}" if name else top

        clusters += [Cluster(moved(c.id), c.label, moved(c.parent)) for c in d.clusters]
        nodes += [
            Node(f"d{i}{n.id}", n.label, n.role, n.kind, moved(n.cluster))
            for n in d.nodes
        ]
        edges += [
            Edge(f"d{i}{e.tail}", f"d{i}{e.head}", e.shape, e.names, e.residual)
            for e in d.edges
        ]
        if stacked and i:  # the previous picture's output above this one's input
            last = f"d{i - 1}{diagrams[i - 1].nodes[-1].id}"
            edges.append(Edge(last, f"d{i}{d.nodes[0].id}", (), invisible=True))
    return Diagram(title, nodes, edges, clusters, rankdir=diagrams[0].rankdir)


def teacher_student_diagram(teacher: nn.Module, student: nn.Module, ids) -> Diagram:
    """Chapter 9's teacher (all-MiniLM-L6-v2) beside its student (``make_student``),
    each traced on ``ids`` (B, S) with its layers as one box "TransformerLayer x N"."""
    return side_by_side(
        [
            diagram(m, ids, collapse=(layers.TransformerLayer,))
            for m in (teacher, student)
        ],
        [
            f"teacher: {len(teacher.layers)} layers",
            f"student: {len(student.layers)} layers",
        ],
        title="the teacher and its student",
        stacked=True,
    )
