"""Chapter 7: tiled (FlashAttention-style) attention, tile by tile."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.viz.animations._player import animation_html


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
    n_q, n_k = -(-t // block), -(-s // block)
    computed = {(i, j) for i, j, _, _ in frames}
    fig, (ax_g, ax_k, ax_q) = plt.subplots(
        1, 3, figsize=(8.5, 3.2), dpi=72, gridspec_kw={"width_ratios": [1.2, 0.7, 0.7]}
    )
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.17, top=0.8, wspace=0.45)
    ax_g.set_xlim(0, s)
    ax_g.set_ylim(t, 0)
    ax_g.set_aspect("equal")
    ax_g.set_xticks(range(0, s + 1, block))
    ax_g.set_yticks(range(0, t + 1, block))
    ax_g.set_xlabel("key position")
    ax_g.set_ylabel("query position")
    tiles = {}
    for i in range(n_q):
        for j in range(n_k):
            skipped = (i, j) not in computed
            tiles[i, j] = ax_g.add_patch(
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
