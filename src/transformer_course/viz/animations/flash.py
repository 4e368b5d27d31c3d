"""Chapter 7: tiled (FlashAttention-style) attention, tile by tile."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html


def _tile_grid(ax, t: int, s: int, block: int, computed: set) -> dict:
    """The (T, S) score matrix in ``block`` x ``block`` tiles on ``ax``: one patch per
    tile, keyed ``(i, j)``; a tile not in ``computed`` is drawn hatched grey (skipped)."""
    ax.set_xlim(0, s)
    ax.set_ylim(t, 0)
    ax.set_aspect("equal")
    ax.set_xticks(range(0, s + 1, block))
    ax.set_yticks(range(0, t + 1, block))
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    tiles = {}
    for i in range(-(-t // block)):
        for j in range(-(-s // block)):
            skipped = (i, j) not in computed
            tiles[i, j] = ax.add_patch(
                Rectangle(
                    (j * block, i * block),
                    block,
                    block,
                    edgecolor="black",
                    lw=0.8,
                    facecolor="lightgrey" if skipped else "white",
                    hatch="//" if skipped else None,
                )
            )
    return tiles


def flash_backward_animation(history, block: int, *, interval: int = 700) -> HTML:
    """FlashAttention-2's backward pass, tile by tile, on the page's numbers (chapter 7).

    The backward visits the key blocks in an outer loop and, for each, the query blocks
    in an inner loop (Dao 2023, algorithm 2). Frame f shows the (T, S) grid of score
    tiles with tile f recomputed (orange), the ones done (blue) and the ones never
    computed (hatched, above a causal diagonal); beside it the gradients dK (S, d) and
    dQ (T, d) as they have accumulated so far, with the rows tile f adds to outlined.
    dK of a key block is final once its column of tiles is done; dQ of a query row
    grows with every key block.

    Args:
        history: one entry per computed tile, in order: ``(i, j, dq, dk)`` with i the
            query block, j the key block, and dq (T, d), dk (S, d) the gradients
            accumulated after that tile (tensors or arrays).
        block: rows of a tile (queries and keys), >= 1.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``).

    Raises:
        ValueError: an empty ``history``, ``block`` < 1, or dq / dk that are not 2-D.
        TypeError: a ``block`` that is not an int.
    """
    if not history:
        raise ValueError("history: expected at least one (i, j, dq, dk) entry, got 0")
    _validation.positive_int("block", block)
    frames = [
        (
            i,
            j,
            np.asarray(torch.as_tensor(dq).detach().cpu(), dtype=float),
            np.asarray(torch.as_tensor(dk).detach().cpu(), dtype=float),
        )
        for i, j, dq, dk in history
    ]
    if frames[-1][2].ndim != 2 or frames[-1][3].ndim != 2:
        raise ValueError(
            f"history: expected dq (T, d) and dk (S, d), got shapes "
            f"{frames[-1][2].shape} and {frames[-1][3].shape}"
        )
    t, s = frames[-1][2].shape[0], frames[-1][3].shape[0]
    computed = {(i, j) for i, j, _, _ in frames}
    fig, (ax_g, ax_k, ax_q) = plt.subplots(
        1, 3, figsize=(8.5, 3.2), dpi=72, gridspec_kw={"width_ratios": [1.2, 0.7, 0.7]}
    )
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.17, top=0.8, wspace=0.45)
    tiles = _tile_grid(ax_g, t, s, block, computed)
    vmax = max(np.abs(f[2]).max() for f in frames) or 1.0
    vmax = max(vmax, max(np.abs(f[3]).max() for f in frames) or 1.0)
    images, outlines = [], []
    for ax, grad, name, rows in (
        (ax_k, frames[0][3], "dK", "key"),
        (ax_q, frames[0][2], "dQ", "query"),
    ):
        images.append(
            ax.imshow(
                np.zeros_like(grad),
                cmap="RdBu_r",
                vmin=-vmax,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
        )
        ax.set_title(f"{name} so far", fontsize=10)
        ax.set_yticks(range(0, grad.shape[0], block))
        ax.set_xlabel("feature")
        ax.set_ylabel(f"{rows} position")
        outlines.append(
            ax.add_patch(
                Rectangle(
                    (-0.5, -0.5),
                    grad.shape[1],
                    block,
                    fill=False,
                    edgecolor="tab:orange",
                    lw=2.5,
                )
            )
        )
    title = fig.suptitle("")

    def update(frame: int):
        i, j, dq, dk = frames[frame]
        done = {(a, b) for a, b, _, _ in frames[:frame]}
        for key, patch in tiles.items():
            if key == (i, j):
                patch.set_facecolor("tab:orange")
            elif key in done:
                patch.set_facecolor("lightsteelblue")
        images[0].set_data(dk)
        images[1].set_data(dq)
        outlines[0].set_y(j * block - 0.5)
        outlines[1].set_y(i * block - 0.5)
        title.set_text(
            f"tile {frame + 1} of {len(frames)}: key block {j} (outer loop), "
            f"query block {i} (inner loop)"
        )
        return (*tiles.values(), *images, *outlines, title)

    anim = FuncAnimation(fig, update, frames=len(frames), interval=interval, blit=False)
    return animation_html(
        anim,
        alt=(
            f"Animation in {len(frames)} frames: the backward pass of tiled "
            f"attention on a {t} by {s} grid of scores cut into {block} by {block} "
            "tiles, visited one column of key tiles at a time and, within a column, "
            "query tile by query tile; beside it, heat maps of the gradients dK and "
            "dQ filling in as each tile adds its part, the rows it adds to outlined"
        ),
    )


def _tiles_frames(history, block: int, shape: tuple[int, int]):
    """The figure of ``tiles_animation`` and its frame function: (fig, update, n)."""
    if not history:
        raise ValueError("history: expected at least one (i, j, m, l) entry, got 0")
    _validation.positive_int("block", block)
    if len(shape) != 2:
        raise ValueError(f"shape: expected (T, S), got {shape!r}")
    t, s = shape
    _validation.positive_int("T", t)
    _validation.positive_int("S", s)
    frames = [
        (int(i), int(j), _numpy(m).reshape(-1), _numpy(l).reshape(-1))
        for i, j, m, l in history
    ]
    n_q, n_k = -(-t // block), -(-s // block)
    for i, j, m, l in frames:
        if not (0 <= i < n_q and 0 <= j < n_k):
            raise ValueError(
                f"history: tile ({i}, {j}) lies outside the {n_q} x {n_k} grid "
                f"of shape {shape} in blocks of {block}"
            )
        if m.shape != l.shape or len(m) > block:
            raise ValueError(
                f"history: expected m and l of at most block = {block} rows each, "
                f"got shapes {m.shape} and {l.shape}"
            )
    computed = {(i, j) for i, j, _, _ in frames}
    fig, (ax_g, ax_m, ax_l) = plt.subplots(
        1, 3, figsize=(8.5, 2.9), dpi=72, gridspec_kw={"width_ratios": [1.1, 1, 1]}
    )
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.2, top=0.82, wspace=0.45)
    tiles = _tile_grid(ax_g, t, s, block, computed)
    rows = np.arange(block)
    all_m = np.concatenate([f[2] for f in frames])
    all_l = np.concatenate([f[3] for f in frames])
    finite = all_m[np.isfinite(all_m)]
    low = min(0.0, finite.min()) if finite.size else 0.0
    high = max(0.0, finite.max()) if finite.size else 1.0
    color = style.ROLE_COLORS["query"]
    bars_m = ax_m.bar(rows, np.zeros(block), color=color)
    bars_l = ax_l.bar(rows, np.zeros(block), color=style.tint(color, 0.45))
    ax_m.set_ylim(low - 0.1, high + 0.1)
    ax_l.set_ylim(0, max(all_l.max(), 1e-9) * 1.1)
    for ax, label in ((ax_m, "running max m"), (ax_l, "running sum l")):
        ax.set_xlabel("query row in the block")
        ax.set_ylabel(label)
        ax.set_xticks(rows)
    title = fig.suptitle("")
    current = style.ROLE_COLORS["attention"]
    done_color = style.tint(current, 0.6)

    def update(frame: int):
        i, j, m, l = frames[frame]
        done = {(a, b) for a, b, _, _ in frames[:frame]}
        for key, patch in tiles.items():
            if key == (i, j):
                patch.set_facecolor(current)
            elif key in done:
                patch.set_facecolor(done_color)
            elif key in computed:
                patch.set_facecolor("white")
        for r in range(block):
            seen = r < len(m) and np.isfinite(m[r])
            bars_m[r].set_height(m[r] if seen else 0.0)
            bars_l[r].set_height(l[r] if r < len(l) else 0.0)
        title.set_text(
            f"tile {frame + 1} of {len(frames)}: query block {i}, key block {j}"
        )
        return (*tiles.values(), *bars_m, *bars_l, title)

    update(0)  # the still frame before play already shows a tile and its statistics
    return fig, update, len(frames)


def _numpy(x) -> np.ndarray:
    return np.asarray(torch.as_tensor(x).detach().cpu(), dtype=float)


def tiles_animation(
    history, block: int, shape: tuple[int, int], *, interval: int = 800
) -> HTML:
    """The online softmax of tiled attention, tile by tile, on the page's numbers
    (chapter 7).

    Tiled attention (Dao et al. 2022, algorithm 1; Milakov and Gimelshein 2018) visits
    the query blocks and, for each, the key blocks, keeping per query row a running
    maximum m and a running sum l of exp(score - m). Frame f shows the (T, S) grid of
    score tiles with tile f being computed (reddish purple), the ones done (light) and
    the ones never computed (hatched, e.g. above a causal diagonal); beside it the bars
    of m and l of each row of the current query block after tile f: m jumps when a
    tile brings a larger score, and l is rescaled with it.

    Args:
        history: one entry per computed tile, in order: ``(i, j, m, l)`` with i the
            query block, j the key block, and m, l (rows,) the running maximum and sum
            of the block's query rows after that tile (tensors or arrays; rows <=
            ``block``).
        block: rows of a tile (queries and keys), >= 1.
        shape: (T, S), the number of queries and keys.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``); the frame shown before play is tile 1.

    Raises:
        ValueError: an empty ``history``, a tile outside the grid, m or l longer than
            ``block``, ``block`` or T or S < 1, or a ``shape`` that is not (T, S).
        TypeError: a ``block``, T or S that is not an int.
    """
    fig, update, n = _tiles_frames(history, block, shape)
    anim = FuncAnimation(fig, update, frames=n, interval=interval, blit=False)
    t, s = shape
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: the {t} by {s} grid of attention scores split "
            f"into {block} by {block} tiles, computed one by one, a row of tiles at a "
            "time, the tiles never computed hatched; beside it, bar charts of the "
            "running maximum and running sum of each query row of the current block"
        ),
    )
