"""Chapter 11's paged KV cache drawn from the cache object itself.

- ``pool_state(cache, caption)``: a frozen snapshot of a ``paged_cache.PagedKVCache``
  and its ``BlockPool``: which sequence holds each block, reference counts, free
  blocks (and those still named by a hash, reusable by a later prompt), each
  sequence's block table and length.
- ``PagedTrace(cache)``: the cache's own operations (``add_sequence``, ``prepare``,
  ``free``, and ``step`` = prepare + one forward pass of a model) with a snapshot
  recorded after each, for ``viz.animations.paged_pool_animation``.
- ``paged_cache_schematic(cache)``: the block tables on the left, the pool on the
  right, an arrow from each table entry to its block (Graphviz).

Source: Kwon et al. 2023, "Efficient Memory Management for Large Language Model
Serving with PagedAttention", figures 6-8 (block tables, shared blocks and their
reference counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_course.paged_cache import PagedKVCache
from transformer_course.viz import style
from transformer_course.viz.graph_render import new_graph
from transformer_course.viz.schematics import Schematic

#: colours of sequences 0, 1, 2, ... (cycled); a block two sequences share is drawn
#: in ``SHARED_COLOR`` with its reference count
SEQ_ROLES = ("query", "key", "value", "embedding", "feedforward", "linear")
SHARED_COLOR = style.ROLE_COLORS["attention"]
CACHED_FILL = "#E4E4E4"  #: a free block still holding a named prefix


def seq_color(seq: int) -> str:
    """The colour of sequence ``seq`` (the book's role colours, cycled)."""
    return style.ROLE_COLORS[SEQ_ROLES[seq % len(SEQ_ROLES)]]


@dataclass(frozen=True)
class PoolState:
    """One moment of a paged cache (see ``pool_state``). ``refs[b]``: readers of
    block b; ``free``: free blocks, least recently freed first (handed out first);
    ``cached``: blocks named by a prefix hash; ``tables[seq]``: the sequence's blocks
    in order; ``lengths[seq]``: its stored tokens."""

    caption: str
    block_size: int
    refs: tuple[int, ...]
    free: tuple[int, ...]
    cached: frozenset[int]
    tables: dict[int, tuple[int, ...]]
    lengths: dict[int, int]

    @property
    def n_blocks(self) -> int:
        return len(self.refs)

    def holders(self, block: int) -> tuple[int, ...]:
        """The sequences whose block table lists ``block``, in id order."""
        return tuple(s for s, t in sorted(self.tables.items()) if block in t)

    def filled(self, block: int) -> int:
        """Token slots of ``block`` that a holder has written; a free block still
        named by its prefix keeps its b tokens, any other free block counts 0."""
        if not self.holders(block):
            return self.block_size if block in self.cached else 0
        most = 0
        for seq in self.holders(block):
            j = self.tables[seq].index(block)
            most = max(
                most, min(self.block_size, self.lengths[seq] - j * self.block_size)
            )
        return most

    def label(self, block: int) -> str:
        """What the pictures write in a block: its holders ("s0", "s0 s1 ×2"),
        "cached" (free, its prefix still findable) or "free"."""
        holders = self.holders(block)
        if holders:
            names = " ".join(f"s{s}" for s in holders)
            return names + (
                f" \u00d7{self.refs[block]}" if self.refs[block] > 1 else ""
            )
        return "cached" if block in self.cached else "free"

    def color(self, block: int) -> str:
        """Fill of ``block``: its sequence's colour, ``SHARED_COLOR`` when several
        read it, grey when free but cached, white when free."""
        if self.refs[block] > 1:
            return SHARED_COLOR
        holders = self.holders(block)
        if holders:
            return seq_color(holders[0])
        return CACHED_FILL if block in self.cached else "#FFFFFF"


def pool_state(cache: PagedKVCache, caption: str = "") -> PoolState:
    """A snapshot of ``cache`` and its pool (copies: later operations leave it as
    it is).

    Raises:
        TypeError: ``cache`` is not a ``PagedKVCache``.
    """
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")
    pool = cache.pool
    return PoolState(
        caption=str(caption),
        block_size=pool.block_size,
        refs=tuple(pool.refs),
        free=tuple(pool.free),
        cached=frozenset(pool.hash_of),
        tables={s: tuple(t) for s, t in cache.block_tables.items()},
        lengths={s: len(t) for s, t in cache.tokens.items()},
    )


class PagedTrace:
    """A ``PagedKVCache`` whose operations are recorded: after each ``prepare``,
    ``step`` or ``free`` a ``PoolState`` is appended to ``states``, captioned with
    what happened (arrivals noted by ``add_sequence`` join the next caption).

    Raises:
        TypeError: ``cache`` is not a ``PagedKVCache``. Otherwise as the cache.
    """

    def __init__(self, cache: PagedKVCache):
        pool_state(cache)  # checks the type
        self.cache, self.states, self._notes = cache, [], []

    def record(self, caption: str) -> PoolState:
        """Snapshot the cache now, with the pending arrivals before ``caption``."""
        state = pool_state(self.cache, "; ".join([*self._notes, caption]))
        self._notes = []
        self.states.append(state)
        return state

    def add_sequence(self, prompt: list[int] | None = None) -> tuple[int, int]:
        seq, shared = self.cache.add_sequence(prompt)
        n = len(prompt) if prompt is not None else 0
        note = f"s{seq} arrives ({n} tokens"
        self._notes.append(note + (f", {shared} found in the pool)" if shared else ")"))
        return seq, shared

    def prepare(self, seqs: list[int], new_tokens: list[list[int]]):
        out = self.cache.prepare(seqs, new_tokens)
        self.record(
            ", ".join(f"s{s} +{len(n)}" for s, n in zip(seqs, new_tokens)) + " tokens"
        )
        return out

    @torch.inference_mode()
    def step(self, model, seqs: list[int], new_tokens: list[list[int]]) -> list[int]:
        """``prepare`` and one forward pass of ``model`` (a ``DecoderOnlyLM``)
        through the cache; returns each row's greedy next token."""
        ids, mask = self.prepare(seqs, new_tokens)
        logits = model(ids, attention_mask=mask, caches=self.cache.layers)
        return logits[:, -1].argmax(-1).tolist()

    def free(self, seq: int) -> None:
        self.cache.free(seq)
        self.record(f"s{seq} ends, its blocks are handed back")


def _as_state(cache) -> PoolState:
    return cache if isinstance(cache, PoolState) else pool_state(cache)


def _table(rows: list[str]) -> str:
    return (
        '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="2">'
        + "".join(rows)
        + "</TABLE>>"
    )


def paged_cache_schematic(cache) -> Schematic:
    """The block tables of ``cache`` and the pool they point into.

    Left: each sequence's length and block table, one entry a row (entry j holds
    tokens j*b .. j*b + b - 1), an arrow from each entry to its block. Right: the pool,
    one block a row: its index, who holds it (a block several sequences share is
    purple, outlined thick, with its reference count: "s0 s2 ×2"), and its b token
    slots, filled as far as written; free blocks are white, or grey ("cached") while
    they still hold a named prefix a later prompt can reuse.

    Args:
        cache: a ``PagedKVCache`` (or a ``PoolState`` of one).

    Returns:
        A ``Schematic``; ``parts`` = [("table", seq, blocks, length) per sequence] +
        [("block", b, holders, refs, filled) per block].

    Raises:
        TypeError: ``cache`` is neither.
    """
    state = _as_state(cache)
    b, N = state.block_size, state.n_blocks
    g = new_graph("LR")
    g.attr("node", shape="plaintext", margin="0")
    g.attr(nodesep="0.1", ranksep="1.1")
    parts: list[tuple] = []
    # one column of table entries and one column of blocks: the arrows between them
    # cross no cell
    rows = ['<TR><TD BORDER="0" ALIGN="LEFT" COLSPAN="2"><B>block tables</B></TD></TR>']
    for seq, table in sorted(state.tables.items()):
        n, color = state.lengths[seq], seq_color(seq)
        parts.append(("table", seq, table, n))
        rows.append(
            f'<TR><TD BORDER="0" ALIGN="LEFT" COLSPAN="2"><FONT COLOR="{color}"><B>s{seq}'
            f"</B></FONT>: {n} tokens</TD></TR>"
        )
        for j, blk in enumerate(table):
            span = f"{j * b}\u2013{min(n, (j + 1) * b) - 1}"
            rows.append(
                f'<TR><TD BORDER="0" ALIGN="RIGHT">{span}</TD><TD PORT="s{seq}_{j}" '
                f'BGCOLOR="{style.tint(color, 0.6)}" WIDTH="30">{blk}</TD></TR>'
            )
        if not table:
            rows.append('<TR><TD BORDER="0" COLSPAN="2">(no block yet)</TD></TR>')
    g.node("tables", _table(rows))
    slot_w = 14 if b <= 8 else 7
    head = (
        f'<TR><TD BORDER="0" ALIGN="LEFT" COLSPAN="{b + 2}"><B>pool: {N} blocks of {b}'
        f" tokens, {N - len(state.free)} in use</B></TD></TR>"
    )
    grid = [head]
    for blk in range(N):
        fill, refs, filled = state.color(blk), state.refs[blk], state.filled(blk)
        parts.append(("block", blk, state.holders(blk), refs, filled))
        text = "black" if fill in ("#FFFFFF", CACHED_FILL) else "white"
        border = ' BORDER="3"' if refs > 1 else ""
        slots = "".join(
            f'<TD BGCOLOR="{fill if i < filled else "#FFFFFF"}" WIDTH="{slot_w}"></TD>'
            for i in range(b)
        )
        grid.append(
            f'<TR><TD PORT="b{blk}" BGCOLOR="{fill}" WIDTH="30"{border}><FONT COLOR="{text}">'
            f'<B>{blk}</B></FONT></TD><TD BORDER="0" ALIGN="LEFT" WIDTH="84">'
            f"{state.label(blk)}</TD>{slots}</TR>"
        )
    g.node("pool", _table(grid))
    for seq, table in sorted(state.tables.items()):
        for j, blk in enumerate(table):
            g.edge(f"tables:s{seq}_{j}:e", f"pool:b{blk}:w", color=seq_color(seq))
    shared = [blk for blk in range(N) if state.refs[blk] > 1]
    cached = sorted(blk for blk in state.cached if state.refs[blk] == 0)
    alt = (
        f"Paged KV cache: a pool of {N} blocks of {b} tokens, {N - len(state.free)} in "
        f"use. Block tables: "
        + "; ".join(
            f"sequence {s} ({state.lengths[s]} tokens) reads blocks "
            + (", ".join(map(str, t)) if t else "none yet")
            for s, t in sorted(state.tables.items())
        )
        + (
            ". Shared: "
            + ", ".join(f"block {blk} by {state.refs[blk]} sequences" for blk in shared)
            if shared
            else ""
        )
        + (
            f". Free but still cached: blocks {', '.join(map(str, cached))}"
            if cached
            else ""
        )
        + f". Free: {len(state.free)} blocks."
    )
    return Schematic(g, alt, parts)
