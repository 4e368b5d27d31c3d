"""Animations that play on the static site: matplotlib ``FuncAnimation`` rendered to
self-contained JavaScript HTML (``to_jshtml``), with the figure closed so no stray still
frame is shown beside it (pitfall P21), and no request to a font CDN.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import Animation, FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.plots import alt_text

# to_jshtml() draws its buttons with Font Awesome 4 icons loaded from a CDN. The site
# must make no outside request, and Unicode symbols (U+23EE ...) are missing from the
# site's fonts and common Linux fonts (they render as empty boxes), so each icon becomes
# a small inline SVG: it shows wherever the HTML goes (the site, Jupyter, Colab) with no
# font or file to load. Each button keeps its title and aria-label.
_TRIANGLE_RIGHT, _TRIANGLE_LEFT = "M4 2v12l9-6z", "M12 2v12L3 8z"
_PATHS = {
    "fa fa-fast-backward": "M2 2h2v12H2zM9 2v12L4 8zM15 2v12L9 8z",
    "fa fa-step-backward": "M3 2h2v12H3zM14 2v12L6 8z",
    "fa fa-play fa-flip-horizontal": _TRIANGLE_LEFT,
    "fa fa-pause": "M3 2h4v12H3zM9 2h4v12H9z",
    "fa fa-play": _TRIANGLE_RIGHT,
    "fa fa-step-forward": "M2 2v12l8-6zM11 2h2v12h-2z",
    "fa fa-fast-forward": "M1 2v12l6-6zM7 2v12l5-6zM12 2h2v12h-2z",
    "fa fa-minus": "M2 7h12v2H2z",
    "fa fa-plus": "M2 7h12v2H2zM7 2h2v12H7z",
}
_ICONS = {
    cls: '<svg class="tc-icon" width="14" height="14" viewBox="0 0 16 16" '
    f'aria-hidden="true" focusable="false"><path fill="currentColor" d="{d}"/></svg>'
    for cls, d in _PATHS.items()
}
_LINK = re.compile(r"<link[^>]*font-awesome[^>]*>", re.DOTALL)


def _keep_first_layout(fig) -> None:
    """Lay a figure with a layout engine (constrained, tight) out once, when its first
    frame is drawn, and keep that layout for every later frame. Otherwise each frame's
    ``savefig`` solves the layout again, with an extra draw (about half the time of
    rendering an animation), and the axes can jitter between frames."""
    if fig.get_layout_engine() is None:
        return

    def freeze(event) -> None:
        fig.canvas.mpl_disconnect(connection)
        fig.set_layout_engine("none")  # the positions just computed stay

    connection = fig.canvas.mpl_connect("draw_event", freeze)


def animation_html(
    anim: Animation, *, default_mode: str = "once", alt: str | None = None
) -> HTML:
    """Render an animation as self-contained JS HTML and close its figure.

    Args:
        anim: a matplotlib ``Animation`` (e.g. ``FuncAnimation``).
        default_mode: "once", "loop" or "reflect" (the player's initial mode).
        alt: what the animation shows, for readers who cannot see it (the frame
            image's alt text); default: described from the figure's titles and axis
            labels (``viz.plots.alt_text``) as they stand after the last frame.

    Returns:
        ``IPython.display.HTML`` with a frame slider (labelled for screen readers) and
        play buttons; displaying it gives exactly one text/html output.

    Raises:
        TypeError: if ``anim`` is not a matplotlib Animation.
    """
    if not isinstance(anim, Animation):
        raise TypeError(
            f"anim: expected a matplotlib Animation, got {type(anim).__name__}"
        )
    _keep_first_layout(anim._fig)
    html = anim.to_jshtml(default_mode=default_mode)
    plt.close(anim._fig)
    html = _LINK.sub("", html)
    for cls, icon in _ICONS.items():
        html = html.replace(f'<i class="{cls}"></i>', icon)
    if "<i class=" in html:  # a matplotlib with other icons: fail loudly, not blank
        raise RuntimeError(
            "animation_html: to_jshtml() used an icon without an SVG "
            "here: add it to viz.animations._PATHS"
        )
    if alt is None:
        alt = "Animation. " + alt_text(anim._fig)
    html = re.sub(
        r'<img id="(_anim_img\w+)">',
        lambda m: f'<img id="{m[1]}" alt="{escape(alt)}">',
        html,
    )
    html = re.sub(
        r'(<input id="_anim_slider\w+" type="range" class="anim-slider")',
        r'\1 aria-label="Animation frame"',
        html,
    )
    return HTML(html)


def query_scan_animation(
    scores,
    key_tokens: Sequence[str],
    *,
    query_token: str = "query",
    interval: int = 600,
) -> HTML:
    """One query scanning the keys while its attention weights form (chapter 1).

    Frame j shows the scores of keys 0..j (left) and the softmax over the keys seen so
    far (right); the last frame is the full softmax, i.e. the query's weight row. The
    running normalisation is the same idea the FlashAttention chapter calls the online
    softmax.

    Args:
        scores: (S,) scores of one query against S keys.
        key_tokens: S labels.
        query_token: label of the query, used in the title.

    Returns:
        Animation HTML (see ``animation_html``).

    Raises:
        ValueError: if ``scores`` is not 1-D or the labels do not match it.
    """
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().float().cpu().numpy()
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1 or len(key_tokens) != len(s):
        raise ValueError(
            f"scores: expected shape (S,) with S = len(key_tokens) = {len(key_tokens)}, "
            f"got {s.shape}"
        )
    n = len(s)
    # A fixed layout: constrained layout would be recomputed for every frame.
    fig, (ax_s, ax_w) = plt.subplots(1, 2, figsize=(9, 3.4))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.3, top=0.85, wspace=0.3)
    x = np.arange(n)
    pad = 0.1 * (np.abs(s).max() + 1e-9)
    ax_s.set_ylim(min(s.min(), 0) - pad, max(s.max(), 0) + pad)
    ax_w.set_ylim(0, 1.05)
    for ax, label in ((ax_s, "score  q \u00b7 k / \u221ad"), (ax_w, "softmax weight")):
        ax.set_xticks(x)
        ax.set_xticklabels(key_tokens, rotation=45, ha="right")
        ax.set_xlabel("key")
        ax.set_ylabel(label)
        ax.axhline(0, color="grey", lw=0.5)
    bars_s = ax_s.bar(x, np.zeros(n), color=style.ROLE_COLORS["query"])
    bars_w = ax_w.bar(x, np.zeros(n), color=style.ROLE_COLORS["attention"])
    title = fig.suptitle("")

    def update(frame: int):
        seen = s[: frame + 1]
        w = np.exp(seen - seen.max())
        w = w / w.sum()
        for j in range(n):
            bars_s[j].set_height(s[j] if j <= frame else 0.0)
            bars_w[j].set_height(w[j] if j <= frame else 0.0)
        title.set_text(
            f"query '{query_token}': {frame + 1} of {n} keys scanned"
            + (" (final weights)" if frame == n - 1 else "")
        )
        return (*bars_s, *bars_w, title)

    anim = FuncAnimation(fig, update, frames=n, interval=interval, blit=False)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: query '{query_token}' scans the keys "
            f"{', '.join(map(str, key_tokens))} one by one; left, the bar chart of its "
            "scores; right, the softmax over the keys seen so far, ending with its final "
            "attention weights"
        ),
    )


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
