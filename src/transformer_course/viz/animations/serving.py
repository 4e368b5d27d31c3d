"""Chapter 11: serving. Blocks of a paged KV cache taken and handed back as requests
come and go, and draft tokens kept or rejected by speculative decoding.

Both animations are drawn from a real run's record: ``viz.paged.PagedTrace.states``
(one ``PoolState`` after each operation of a ``PagedKVCache``) and the
``SpeculativeStats.steps`` of ``speculative_generate(..., record=True)``.

Sources: Kwon et al. 2023 (PagedAttention), sections 4.2-4.4; Leviathan et al. 2023,
"Fast Inference from Transformers via Speculative Decoding", algorithm 1.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

import numpy as np
import torch
from IPython.display import HTML
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.speculative import SpeculativeStats
from transformer_course.viz import style
from transformer_course.viz.animations._frames import frame_figure, play
from transformer_course.viz.animations.kv_cache import _VISIBLE
from transformer_course.viz.paged import PoolState, seq_color

MAX_FRAMES = 16  #: a page keeps its animations under about 2 MB
_PER_ROW = 6  #: blocks per row of the drawn pool
_FS = style.FONT_PT["small"]  # 10 pt, the smallest text of the frames
SHARED_TEXT = "#7A2E63"  #: a shared block's label (the shared purple, darker)


def _check_states(states) -> list[PoolState]:
    states = list(states)
    if not states:
        raise ValueError(
            "states: expected at least one PoolState (PagedTrace.states), got none"
        )
    for i, s in enumerate(states):
        if not isinstance(s, PoolState):
            raise TypeError(
                f"states[{i}]: expected a PoolState (viz.paged.pool_state), "
                f"got {type(s).__name__}"
            )
        if (s.n_blocks, s.block_size) != (states[0].n_blocks, states[0].block_size):
            raise ValueError(
                f"states[{i}]: expected the pool of states[0] ({states[0].n_blocks} blocks of "
                f"{states[0].block_size}), got {s.n_blocks} blocks of {s.block_size}"
            )
    if len(states) > MAX_FRAMES:
        raise ValueError(
            f"states: expected at most {MAX_FRAMES} states (one frame each), got {len(states)}"
        )
    return states


def _pool_frames(states):
    """The figure of ``paged_pool_animation`` and its frame function: (fig, update, n).
    Texts and patches carry gids for the tests: ``label{b}``, ``slot{b}_{i}``,
    ``entry{seq}_{j}``."""
    states = _check_states(states)
    N, b = states[0].n_blocks, states[0].block_size
    rows = -(-N // _PER_ROW)
    most = max(len(st.tables) for st in states)  # rows of block tables
    low = min(-1.3 * (rows - 1) - 0.45, 0.05 - 0.5 * (most - 1) - 0.3)
    captions = [textwrap.fill(st.caption, 84) for st in states]
    head_in = 0.25 + 0.2 * (1 + max(c.count("\n") + 1 for c in captions))  # title lines
    fig, ax = frame_figure(1, 1, head_in + 0.72 * (0.75 - low))
    top = 1 - head_in / fig.get_figheight()
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=top)
    width, gap = 1.0, 1.2
    x_tables = _PER_ROW * gap + 0.5
    title = fig.suptitle("", fontsize=style.FONT_PT["base"])

    def update(frame: int):
        s = states[frame]
        ax.clear()
        ax.set_axis_off()
        ax.set_xlim(-0.1, x_tables + 4.6)
        ax.set_ylim(low, 0.75)
        for blk in range(N):
            r, c = divmod(blk, _PER_ROW)
            x0, y0 = c * gap, -1.3 * r
            fill, filled = s.color(blk), s.filled(blk)
            for i in range(b):
                ax.add_patch(
                    Rectangle(
                        (x0 + i * width / b, y0),
                        width / b,
                        0.42,
                        facecolor=fill if i < filled else "#FFFFFF",
                        edgecolor="#888888",
                        lw=0.6,
                        gid=f"slot{blk}_{i}",
                    )
                )
            shared = s.refs[blk] > 1
            ax.add_patch(
                Rectangle(
                    (x0, y0),
                    width,
                    0.42,
                    fill=False,
                    edgecolor="black",
                    lw=3 if shared else 1,
                )
            )
            ax.text(x0, y0 + 0.5, str(blk), fontsize=_FS, weight="bold", va="bottom")
            ax.text(
                x0 + width / 2,
                y0 - 0.08,
                s.label(blk),
                fontsize=_FS,
                ha="center",
                va="top",
                gid=f"label{blk}",
                color=SHARED_TEXT if shared else "black",
            )
        ax.text(
            x_tables, 0.55, "block tables", fontsize=_FS + 1, weight="bold", va="center"
        )
        for i, (seq, table) in enumerate(sorted(s.tables.items())):
            y = 0.05 - 0.5 * i
            ax.text(
                x_tables,
                y,
                f"s{seq}",
                fontsize=_FS,
                weight="bold",
                color=seq_color(seq),
                va="center",
            )
            for j, blk in enumerate(table):
                x = x_tables + 0.55 + 0.45 * j
                ax.add_patch(
                    Rectangle(
                        (x, y - 0.18),
                        0.42,
                        0.36,
                        facecolor=style.tint(seq_color(seq), 0.6),
                        edgecolor="#555555",
                        lw=0.6,
                    )
                )
                ax.text(
                    x + 0.21,
                    y,
                    str(blk),
                    fontsize=_FS,
                    ha="center",
                    va="center",
                    gid=f"entry{seq}_{j}",
                )
        used = N - len(s.free)
        head = f"{frame + 1}/{len(states)}: {used} of {N} blocks in use"
        title.set_text(f"{head}\n{captions[frame]}")
        return ()

    update(0)
    return fig, update, len(states)


def paged_pool_animation(states: Sequence[PoolState], *, interval: int = 1400) -> HTML:
    """A paged KV cache's pool as requests come and go, one frame per recorded state.

    Each frame draws the pool's blocks in rows (index above, b token slots filled as
    far as written, in the colour of the sequence holding the block; purple, outlined
    thick and labelled "s0 s2 ×2" when several sequences share it; grey "cached" when
    free but still holding a named prefix; white "free"), the block table of every
    live sequence beside it, and what just happened as the title.

    Args:
        states: ``PoolState`` snapshots of one pool in order, e.g. ``PagedTrace.states``
            (1 to ``MAX_FRAMES``).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), one frame per state.

    Raises:
        ValueError: no states, too many, or states of different pools.
        TypeError: an entry that is not a ``PoolState``.
    """
    fig, update, n = _pool_frames(states)
    s0, last = states[0], states[-1]
    alt = (
        f"Animation in {n} frames: a pool of {s0.n_blocks} KV-cache blocks of "
        f"{s0.block_size} tokens, each block coloured by the sequence holding it and "
        "filled as far as its tokens are written, with each sequence's block table "
        "beside it; frames: " + "; ".join(s.caption for s in states) + f". At the end "
        f"{s0.n_blocks - len(last.free)} blocks are in use."
    )
    return play(fig, update, n, alt=alt, interval=interval)


def _text(token_text, token: int) -> str:
    t = str(token_text(token)) if token_text is not None else str(token)
    t = "".join(_VISIBLE.get(c, c) for c in t) or "\u2205"
    return t if len(t) <= 6 else t[:5] + "\u2026"


def _check_record(ids, stats, max_steps: int) -> tuple[list[int], list]:
    if not isinstance(stats, SpeculativeStats):
        raise TypeError(
            f"stats: expected a SpeculativeStats, got {type(stats).__name__}"
        )
    if not stats.steps:
        raise ValueError(
            "stats: expected recorded steps (speculative_generate(..., record=True)), got "
            + ("none recorded" if stats.steps is None else "an empty list")
        )
    _validation.positive_int("max_steps", max_steps)
    seq = torch.as_tensor(ids).reshape(-1).tolist()
    start = len(seq) - stats.new_tokens
    for i, st in enumerate(stats.steps):
        if not 0 <= st.accepted <= len(st.draft):
            raise ValueError(
                f"stats: steps[{i}] keeps {st.accepted} of {len(st.draft)} draft tokens"
            )
        made = [*st.draft[: st.accepted], st.token]
        got = seq[st.start : st.start + len(made)]
        if st.start != start or got != made[: len(got)] or not got:
            raise ValueError(
                f"ids: expected the output to continue at position {start} with {made} "
                f"(stats.steps[{i}]), got {got} at position {st.start}"
            )
        start += len(made)
    return seq, stats.steps[:max_steps]


def _speculative_frames(ids, stats, token_text, max_steps, n_context=4):
    """The figure of ``speculative_animation`` and its frame function: (fig, update,
    n). Texts carry gids for the tests: ``draft{j}`` and ``model``."""
    seq, steps = _check_record(ids, stats, max_steps)
    cols = n_context + max(len(st.draft) for st in steps) + 1
    fig, (ax, ax_n) = frame_figure(2, 1, 4.3, gridspec_kw={"height_ratios": [1.25, 1]})
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.13, top=0.86, hspace=0.45)
    made = np.cumsum([st.accepted + 1 for st in steps])
    passes = np.arange(1, len(steps) + 1)
    colors = {
        "kept": style.ROLE_COLORS["value"],
        "rejected": style.ROLE_COLORS["embedding"],
        "model": style.ROLE_COLORS["query"],
    }
    title = fig.suptitle("", fontsize=style.FONT_PT["base"])

    def box(x, y, label, fill, text="white", gid=None, strike=False):
        ax.add_patch(
            Rectangle(
                (x + 0.04, y - 0.38), 0.92, 0.76, facecolor=fill, edgecolor="#555555"
            )
        )
        ax.text(
            x + 0.5,
            y,
            label,
            ha="center",
            va="center",
            fontsize=_FS,
            color=text,
            gid=gid,
        )
        if strike:
            ax.plot(
                [x + 0.1, x + 0.9], [y - 0.3, y + 0.3], color="black", lw=1.2, zorder=1
            )

    def update(frame: int):
        st = steps[frame]
        ax.clear()
        ax.set_axis_off()
        ax.set_xlim(-1.9, cols)
        ax.set_ylim(-0.6, 1.8)
        before = seq[max(0, st.start - n_context) : st.start]
        for i, t in enumerate(before):
            box(
                n_context - len(before) + i, 1, _text(token_text, t), "#E8E8E8", "black"
            )
        ax.text(-0.15, 1, "tokens", ha="right", va="center", fontsize=_FS)
        if st.draft:
            ax.text(
                n_context + len(st.draft) / 2, 1.5, "drafted", ha="center", fontsize=_FS
            )
        ax.text(-0.15, 0, "model", ha="right", va="center", fontsize=_FS)
        for j, t in enumerate(st.draft):
            kept = j < st.accepted
            fill = colors["kept" if kept else "rejected"]
            box(
                n_context + j,
                1,
                _text(token_text, t),
                fill,
                gid=f"draft{j}",
                strike=not kept,
            )
        x = n_context + st.accepted
        box(x, 0, _text(token_text, st.token), colors["model"], gid="model")
        if not st.draft:
            ax.text(
                n_context, 1, "no draft", va="center", fontsize=_FS, color="#555555"
            )
        why = "its next token" if st.accepted == len(st.draft) else "its correction"
        title.set_text(
            f"pass {frame + 1} of {len(steps)}: {len(st.draft)} drafted, {st.accepted} kept, "
            f"model adds {why}: +{st.accepted + 1} tokens"
        )
        ax_n.clear()
        ax_n.plot(
            passes[: frame + 1], made[: frame + 1], marker="o", color=colors["kept"]
        )
        ax_n.plot(
            passes[: frame + 1], passes[: frame + 1], marker="s", color=colors["model"]
        )
        ax_n.set_xlim(0.5, len(steps) + 0.5)
        ax_n.set_ylim(0, made[-1] * 1.1)
        ax_n.xaxis.get_major_locator().set_params(integer=True)
        ax_n.set_xlabel("forward passes of the model")
        ax_n.set_ylabel("tokens")
        ax_n.legend(["speculative", "one a pass"], loc="upper left", fontsize=_FS)
        return ()

    update(0)
    return fig, update, len(steps)


def speculative_animation(
    ids,
    stats: SpeculativeStats,
    token_text: Callable[[int], str] | None = None,
    *,
    max_steps: int = 12,
    interval: int = 1200,
) -> HTML:
    """Speculative decoding pass by pass, from a recorded run.

    Frame f is verifying pass f: the last tokens already produced (grey), the
    drafter's tokens (green where the model kept them, red and struck through from
    the first it rejected), and under them the model's own token (blue: its
    correction of the first rejected draft, or one more token when every draft was
    kept). Below, tokens produced against forward passes, beside plain decoding's one
    token a pass.

    Args:
        ids: the output of ``speculative_generate``, (1, T + n) (or a 1-D sequence).
        stats: its ``SpeculativeStats``, recorded (``record=True``).
        token_text: token id -> its text (e.g. ``lambda i: tok.decode([i])``); default
            the id itself.
        max_steps: frames for the first this many passes (>= 1).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), one frame per pass shown.

    Raises:
        TypeError: ``stats`` not a ``SpeculativeStats``; ``max_steps`` not an int.
        ValueError: ``stats`` without recorded steps or keeping more drafts than it
            drafted; ``ids`` that do not continue as the steps record.
    """
    fig, update, n = _speculative_frames(ids, stats, token_text, max_steps)
    steps = stats.steps[:n]
    alt = (
        f"Animation in {n} frames: speculative decoding, one frame per forward pass of "
        "the model; each shows the drafted tokens, green where kept and struck through in "
        "red from the first rejected one, and the model's own token below; drafts kept "
        "per pass: "
        + ", ".join(f"{st.accepted} of {len(st.draft)}" for st in steps)
        + f"; {sum(st.accepted + 1 for st in steps)} tokens in {n} passes."
    )
    return play(fig, update, n, alt=alt, interval=interval)
