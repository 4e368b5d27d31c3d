"""Pictures that are not a module's graph, drawn with Graphviz from the real sizes.

- ``kv_cache_diagram(caches)``: what a decoder's KV caches hold after some decoding
  steps, read from the ``decoding.KVCache`` objects themselves (chapter 7).
- ``tiles_diagram(T, S, block_q=..., block_k=...)``: the tiles that
  ``flash.tiled_attention`` visits, recorded by running it (chapter 7).
- ``course_map(chapters, builds_on)``: how the chapters build on each other (intro).

Each returns a ``Schematic``: it shows itself as inline SVG with alt text, and
``parts`` lists what it draws (for tests).
"""

from __future__ import annotations

from html import escape

import torch
from torch.overrides import TorchFunctionMode

from transformer_course import _validation, flash
from transformer_course.viz import style
from transformer_course.viz.graph_render import Picture, new_graph


class Schematic(Picture):
    """A drawn picture: ``graph()``, ``alt_text`` and ``parts`` (its labelled pieces)."""

    def __init__(self, graph, alt_text: str, parts: list):
        super().__init__()
        self._graph, self.alt_text, self.parts = graph, alt_text, parts

    def graph(self):
        return self._graph


def _cells(n: int, new: int, shown: int = 12) -> list[int | None]:
    """Positions drawn for a row of n (None is an ellipsis): all when few, else the
    first ones and the last ``new`` + 2."""
    if n <= shown:
        return list(range(n))
    tail = max(new + 2, 3)
    return [*range(shown - tail - 1), None, *range(n - tail, n)]


def kv_cache_diagram(caches, new_tokens: int = 1) -> Schematic:
    """The keys and values held by one ``KVCache`` per layer; the last ``new_tokens``
    positions (the step just decoded) are drawn in full colour.

    Args:
        caches: a list of ``decoding.KVCache`` (or objects with ``k`` and ``v``
            tensors (B, H_kv, S, d_k)), one per layer, all filled.
        new_tokens: how many positions the last step appended (>= 0).

    Returns:
        A ``Schematic``; ``parts`` = [(layer, "K" or "V", S)] per row.

    Raises:
        TypeError: an entry without ``k``/``v`` tensors. ValueError: no caches, an
            empty cache, or ``new_tokens`` outside [0, S].
    """
    caches = list(caches)
    if not caches:
        raise ValueError("caches: expected at least one filled KVCache, got none")
    for i, c in enumerate(caches):
        k, v = getattr(c, "k", None), getattr(c, "v", None)
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
            raise TypeError(
                f"caches[{i}]: expected a filled KVCache with k and v tensors"
            )
    B, H, S, d_k = caches[0].k.shape
    _validation.positive_int("new_tokens", new_tokens, minimum=0)
    if new_tokens > S:
        raise ValueError(f"new_tokens: expected at most S = {S}, got {new_tokens}")
    g = new_graph("TB")
    g.attr("node", shape="plaintext", margin="0")
    parts, total = [], 0
    for i, c in enumerate(caches):
        rows = []
        for name, t, role in (("K", c.k, "key"), ("V", c.v, "value")):
            total += t.numel() * t.element_size()
            parts.append((i, name, t.shape[2]))
            color = style.ROLE_COLORS[role]
            cells = []
            for pos in _cells(t.shape[2], new_tokens):
                if pos is None:
                    cells.append('<TD BORDER="0">\u2026</TD>')
                    continue
                new = pos >= t.shape[2] - new_tokens
                fill = color if new else style.tint(color, 0.7)
                font = "white" if new else "black"
                cells.append(
                    f'<TD BGCOLOR="{fill}" WIDTH="24"><FONT COLOR="{font}">{pos}</FONT></TD>'
                )
            shape = escape(str(tuple(t.shape)))
            rows.append(
                f'<TR><TD BORDER="0" ALIGN="RIGHT">{name} {shape}</TD>{"".join(cells)}</TR>'
            )
        table = (
            '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="2">'
            f'<TR><TD BORDER="0" ALIGN="LEFT" COLSPAN="3"><B>layer {i}</B></TD></TR>'
            f"{''.join(rows)}</TABLE>>"
        )
        g.node(f"layer{i}", table)
        if i:
            g.edge(f"layer{i - 1}", f"layer{i}", style="invis")
    kib = total / 1024
    g.attr(
        label=f"KV cache: {len(caches)} layers, {kib:.1f} KiB; dark: the newest",
        labelloc="t",
    )
    alt = (
        f"KV cache of {len(caches)} layers: each holds keys and values of shape "
        f"{(B, H, S, d_k)} for positions 0 to {S - 1}, {kib:.1f} KiB in all; the last "
        f"{new_tokens} position(s) were appended by the latest decoding step"
    )
    return Schematic(g, alt, parts)


class _TileRecorder(TorchFunctionMode):
    """Notes every slice ``[..., a:b, :]`` taken of the query, key or value tensor."""

    def __init__(self, q_shape, k):
        super().__init__()
        self.q_shape, self.k, self.q_block, self.tiles = q_shape, k, None, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "__getitem__" and isinstance(
            args[1], tuple
        ):
            rows = args[1][-2] if len(args[1]) >= 2 else None
            if isinstance(rows, slice):
                if args[0] is self.k:
                    self.tiles.append((*self.q_block, rows.start, rows.stop))
                elif args[0].shape == self.q_shape:  # the (scaled) queries
                    self.q_block = (rows.start, rows.stop)
        return out


def tile_schedule(T: int, S: int, *, block_q: int, block_k: int, causal: bool = False):
    """The tiles (q0, q1, k0, k1) that ``flash.tiled_attention`` computes, in order,
    recorded by running it on zeros of shape (1, T, 2) and (1, S, 2)."""
    _validation.positive_int("T", T)
    _validation.positive_int("S", S)
    q, k, v = torch.zeros(1, T, 2), torch.zeros(1, S, 2), torch.zeros(1, S, 3)
    recorder = _TileRecorder(q.shape, k)
    with recorder:
        flash.tiled_attention(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    return recorder.tiles


def tiles_diagram(T: int, S: int, *, block_q: int, block_k: int, causal: bool = False):
    """The (T, S) score matrix cut into tiles of ``block_q`` queries by ``block_k``
    keys, numbered in the order tiled attention computes them; tiles it skips (causal)
    are blank. Only one tile's scores exist at a time.

    Returns:
        A ``Schematic``; ``parts`` = the visited tiles (q0, q1, k0, k1) in order.

    Raises:
        TypeError, ValueError: as ``flash.tiled_attention`` for the block sizes, and
            for T or S not a positive int.
    """
    tiles = tile_schedule(T, S, block_q=block_q, block_k=block_k, causal=causal)
    order = {(a, c): n + 1 for n, (a, _, c, _) in enumerate(tiles)}
    color = style.ROLE_COLORS["attention"]
    head = "".join(
        f'<TD BORDER="0">k {k0}\u2013{min(k0 + block_k, S) - 1}</TD>'
        for k0 in range(0, S, block_k)
    )
    rows = [f'<TR><TD BORDER="0"></TD>{head}</TR>']
    for q0 in range(0, T, block_q):
        cells = []
        for k0 in range(0, S, block_k):
            n = order.get((q0, k0))
            fill = style.tint(color, 0.6) if n else "white"
            cells.append(f'<TD BGCOLOR="{fill}" WIDTH="48" HEIGHT="30">{n or ""}</TD>')
        label = f"q {q0}\u2013{min(q0 + block_q, T) - 1}"
        rows.append(
            f'<TR><TD BORDER="0" ALIGN="RIGHT">{label}</TD>{"".join(cells)}</TR>'
        )
    g = new_graph("TB")
    table = (
        f'<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">{"".join(rows)}</TABLE>>'
    )
    g.node("tiles", table, shape="plaintext", margin="0")
    skipped = len(range(0, T, block_q)) * len(range(0, S, block_k)) - len(tiles)
    g.attr(
        label=f"scores ({T}, {S}) in tiles of ({block_q}, {block_k}): "
        f"{len(tiles)} computed in this order, {skipped} skipped",
        labelloc="t",
    )
    alt = (
        f"Tiled attention over a {T} by {S} score matrix in tiles of {block_q} queries "
        f"by {block_k} keys: {len(tiles)} tiles computed row by row"
        + (f", {skipped} tiles above the causal diagonal skipped" if skipped else "")
    )
    return Schematic(g, alt, tiles)


def course_map(
    chapters: dict[str, str],
    builds_on: list[tuple[str, str]],
    roles: dict[str, str] | None = None,
) -> Schematic:
    """How chapters build on each other: one box per chapter, an arrow a -> b when b
    builds on a.

    Args:
        chapters: chapter id -> title (in reading order).
        builds_on: (earlier id, later id) pairs.
        roles: optional chapter id -> a ``style.ROLE_COLORS`` key for its colour.

    Raises:
        ValueError: a pair naming an unknown chapter, or an unknown role.
    """
    roles = roles or {}
    for a, b in builds_on:
        for end in (a, b):
            _validation.one_of("builds_on", end, chapters)
    g = new_graph("TB")
    for cid, title in chapters.items():
        color = style.role_color(roles.get(cid, "attention"))
        g.node(
            cid,
            f"{cid}. {title}",
            shape="box",
            style="rounded,filled",
            color=color,
            fillcolor=style.tint(color),
            penwidth="1.4",
        )
    for a, b in builds_on:
        g.edge(a, b)
    parts = [f"{cid}. {title}" for cid, title in chapters.items()]
    alt = "Map of the course, one box per chapter: " + "; ".join(
        f"{cid}. {title}"
        + (
            f" (builds on {', '.join(a for a, b in builds_on if b == cid)})"
            if any(b == cid for _, b in builds_on)
            else ""
        )
        for cid, title in chapters.items()
    )
    return Schematic(g, alt, parts)
