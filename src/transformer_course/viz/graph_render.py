"""Graphviz rendering in the book style, shared by ``viz.diagrams`` and
``viz.schematics``: node and edge attributes per role, inline SVG for the page (ids
prefixed, one title with the alt text), and the on-page size of its smallest text.
"""

from __future__ import annotations

import itertools
import re
from html import escape

from transformer_course.viz import style
from transformer_course.viz.module_trace import Cluster

_QKV = ("query", "key", "value")
_ABBREVIATION = {"query": "q", "key": "k", "value": "v"}


NODE_PT, EDGE_PT, CLUSTER_PT = 12, 10.5, 11  #: Graphviz font sizes (points)
FONT = "DejaVu Sans"
_SHAPES = {"op": "circle", "input": "plaintext", "output": "plaintext", "mask": "box"}


def new_graph(rankdir: str = "TB"):
    """A ``graphviz.Digraph`` in the book style."""
    import graphviz

    g = graphviz.Digraph(format="svg")
    g.attr(
        rankdir=rankdir,
        fontname=FONT,
        fontsize=str(CLUSTER_PT),
        nodesep="0.15",
        ranksep="0.32",
        bgcolor="transparent",
        newrank="true",
    )
    g.attr(
        "node", fontname=FONT, fontsize=str(NODE_PT), margin="0.12,0.05", height="0.3"
    )
    g.attr(
        "edge",
        fontname=FONT,
        fontsize=str(EDGE_PT),
        arrowsize="0.7",
        color=style.ROLE_COLORS["data"],
        fontcolor="#333333",
    )
    return g


def render_graph(d):
    """The ``graphviz.Digraph`` of a ``Diagram`` (its nodes, edges, clusters)."""
    g = new_graph(d.rankdir)
    color = style.ROLE_COLORS
    bodies = {c.id: new_graph_body(c) for c in d.clusters}
    for n in d.nodes:
        attrs = {"shape": _SHAPES.get(n.kind, "box"), "color": color[n.role]}
        if n.kind in ("box", "mask"):
            attrs.update(
                style="rounded,filled" + (",dashed" if n.kind == "mask" else ""),
                fillcolor=style.tint(color[n.role]),
                penwidth="1.4",
            )
        if n.kind == "op":
            attrs.update(style="filled", fillcolor="white", width="0.3", margin="0.02")
            attrs["shape"] = "circle" if n.label == "+" else "ellipse"
        (bodies[n.cluster] if n.cluster else g).node(n.id, n.label, **attrs)
    for e in d.edges:
        if e.invisible:
            g.edge(e.tail, e.head, style="invis")
            continue
        tail = next(n for n in d.nodes if n.id == e.tail)
        head = next(n for n in d.nodes if n.id == e.head)
        inbound = sum(1 for x in d.edges if x.head == e.head and not x.invisible)
        label = f"({', '.join(str(s) for s in e.shape)})" if e.shape else ""
        if e.names and inbound > 1 and head.kind == "box":
            names = [_ABBREVIATION.get(x, x) for x in e.names]
            label = f"{', '.join(names)} {label}"
        attrs = {"label": f" {label} "} if label else {}
        if tail.role in _QKV or tail.role == "mask":
            attrs["color"] = color[tail.role]
        if tail.kind == "mask":
            attrs["style"] = "dashed"
        if e.residual:
            attrs.update(style="dashed", color=color["residual"], label="")
        g.edge(e.tail, e.head, **attrs)
    for c in reversed(d.clusters):  # innermost first: a parent copies its children
        (bodies[c.parent] if c.parent else g).subgraph(bodies[c.id])
    return g


def new_graph_body(c: Cluster):
    import graphviz

    body = graphviz.Digraph(name=c.id)
    body.attr(
        label=c.label,
        labeljust="l",
        style="rounded,dashed",
        color="#9A9A9A",
        fontcolor="#333333",
    )
    return body


_ID = re.compile(r'\bid="([^"]+)"')
_FONT = re.compile(r'font-size="([\d.]+)"')
_counter = itertools.count()


def svg_element(graph, alt: str) -> str:
    """Render ``graph`` to an ``<svg>`` element for inline HTML: no XML prolog, ids
    prefixed (many diagrams share a page), Graphviz's per-node titles replaced by one
    title holding ``alt``, role="img" with ``aria-label``, and scaled to the column."""
    svg = graph.pipe(format="svg", encoding="utf-8")
    svg = svg[svg.index("<svg") :]
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


class Picture:
    """What a diagram shares with a schematic: ``graph()`` (a ``graphviz.Digraph``,
    defined by subclasses) and ``alt_text``; shown in Jupyter and on the site as
    inline SVG inside ``<figure class="tc-diagram">`` (``_repr_html_``)."""

    alt_text: str

    def __init__(self):
        self._svg: str | None = None

    def graph(self):
        raise NotImplementedError

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
