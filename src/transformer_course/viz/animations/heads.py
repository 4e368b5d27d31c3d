"""Chapter 3: multi-head attention, head by head.

``split_merge_animation`` shows the split of the queries into heads, each head's
attention and the merge of their outputs (Vaswani et al. 2017, section 3.2.2,
"Concat(head_1, ..., head_H) W^O"); ``head_patterns_animation`` steps through the heads
of one layer of a real model on one sentence. Both take the chapter's tensors.

Shape letters: H heads, T queries, S keys, d_k / d_v per-head sizes, D = H d_k.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html

_FADED = 0.15  # alpha of the heads a frame is not about
_SMALL = style.FONT_PT["small"]


def _head_colors(n_heads: int) -> list:
    """One colour per head, from a palette apart from the Q/K/V role colours."""
    return [plt.get_cmap("Dark2")(h % 8) for h in range(n_heads)]


def _per_head(name: str, x, batch: int) -> np.ndarray:
    """``x`` (B, H, T, n) or (H, T, n) as a float array (H, T, n) of item ``batch``."""
    _validation.float_tensor(name, x, min_dim=3)
    if x.dim() == 4:
        x = x[batch]
    if x.dim() != 3:
        raise ValueError(
            f"{name}: expected shape (B, H, T, n) or (H, T, n), got {tuple(x.shape)}"
        )
    return x.detach().float().cpu().numpy()


def _split_merge_frames(q, weights, heads, batch: int = 0):
    """The figure and frame function of ``split_merge_animation`` (for tests):
    returns ``(fig, update, n_frames, panels)`` with ``panels`` the images by name."""
    qa, wa, oa = (
        _per_head(n, t, batch)
        for n, t in (("q", q), ("weights", weights), ("heads", heads))
    )
    n_heads, t, d_k = qa.shape
    if wa.shape[:2] != (n_heads, t) or oa.shape[:2] != (n_heads, t):
        raise ValueError(
            f"weights, heads: expected (H, T, ...) = ({n_heads}, {t}, ...) like q, got "
            f"{wa.shape} and {oa.shape}"
        )
    d_v = oa.shape[2]
    queries = qa.transpose(1, 0, 2).reshape(t, n_heads * d_k)  # (T, H * d_k)
    merged = oa.transpose(1, 0, 2).reshape(t, n_heads * d_v)  # (T, H * d_v)
    colors = _head_colors(n_heads)
    lim_q = float(max(np.abs(queries).max(), 1e-9))
    lim_o = float(max(np.abs(merged).max(), 1e-9))

    fig = plt.figure(figsize=(9.5, 5.4), dpi=72)
    grid = fig.add_gridspec(
        3,
        n_heads + 2,
        left=0.06,
        right=0.99,
        bottom=0.1,
        top=0.8,
        hspace=0.35,
        wspace=0.35,
        width_ratios=[2.2] + [1] * n_heads + [2.2],
    )
    ax_in, ax_out = fig.add_subplot(grid[:, 0]), fig.add_subplot(grid[:, -1])
    big_q = {"cmap": "RdBu_r", "vmin": -lim_q, "vmax": lim_q, "aspect": "auto"}
    big_o = {"cmap": "RdBu_r", "vmin": -lim_o, "vmax": lim_o, "aspect": "auto"}
    panels = {
        "queries": ax_in.imshow(queries, **big_q),
        "merged": ax_out.imshow(merged, **big_o),
    }
    for ax, label in ((ax_in, "queries (T, D)"), (ax_out, "merged (T, D)")):
        ax.set_title(label, fontsize=_SMALL + 1)
        ax.set_xlabel("feature")
        ax.set_yticks(range(t))
    ax_in.set_ylabel("token")
    ax_out.set_yticklabels([])
    # the features of each head, outlined in its colour on both sides
    outlines = []
    for h in range(n_heads):
        for ax, d in ((ax_in, d_k), (ax_out, d_v)):
            outlines.append(
                ax.add_patch(
                    Rectangle(
                        (h * d - 0.5, -0.5), d, t, fill=False, lw=3, edgecolor=colors[h]
                    )
                )
            )
    # the not-yet-merged features of the output, veiled
    veil = ax_out.add_patch(
        Rectangle((-0.5, -0.5), 0, t, facecolor="white", alpha=0.85, lw=0)
    )
    probs = {"cmap": "viridis", "vmin": 0, "vmax": 1, "aspect": "auto"}
    rows = [
        ("head input", qa, big_q),
        ("weights", wa, probs),
        ("head output", oa, big_o),
    ]
    small = []
    for r, (label, data, kw) in enumerate(rows):
        row = []
        for h in range(n_heads):
            ax = fig.add_subplot(grid[r, h + 1])
            row.append(ax.imshow(data[h], **kw))
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(True)
                spine.set_edgecolor(colors[h])
                spine.set_linewidth(2)
            if r == 0:
                ax.set_title(f"head {h}", fontsize=_SMALL, color=colors[h])
            if h == 0:
                ax.set_ylabel(label, fontsize=_SMALL)
        small.append(row)
    panels["heads"] = small
    title = fig.suptitle("", fontsize=style.FONT_PT["title"])

    def update(frame: int):
        last = frame == n_heads  # the final frame: every head merged
        for h in range(n_heads):
            on = last or h == frame
            for row in small:
                row[h].set_alpha(1.0 if on else _FADED)
            for o in outlines[2 * h : 2 * h + 2]:
                o.set_visible(on)
        veil.set_x(min(frame + 1, n_heads) * d_v - 0.5)
        veil.set_width((n_heads - min(frame + 1, n_heads)) * d_v)
        if last:
            title.set_text(
                f"all {n_heads} heads attended; merged = their outputs side by "
                "side, in the features they came from"
            )
        else:
            title.set_text(
                f"head {frame}: features {frame * d_k}-{(frame + 1) * d_k - 1} of "
                f"every token's query, its own attention,\nand its output written "
                f"into features {frame * d_v}-{(frame + 1) * d_v - 1} of the merge"
            )
        return ()

    update(0)
    return fig, update, n_heads + 1, panels


def split_merge_animation(q, weights, heads, *, batch: int = 0, interval=900) -> HTML:
    """Heads split out of the queries, attending, and merged back (chapter 3).

    Left: the queries (T, D) of one batch item, each head's d_k features outlined in
    its colour; middle, one column per head: its slice of the queries (T, d_k), its
    attention weights (T, S) and its output (T, d_v); right: the merged output
    (T, H d_v). Frame h (h < H) highlights head h and the features it reads and
    writes, with the output merged up to head h (the rest veiled); the last frame shows
    every head and the whole merge. The first frame already shows one head's path.

    Args:
        q: the split queries, (B, H, T, d_k) or (H, T, d_k).
        weights: the attention weights, (B, H, T, S) or (H, T, S).
        heads: the per-head outputs before the merge, (B, H, T, d_v) or (H, T, d_v).
        batch: which batch item to draw (for 4-D inputs).
        interval: milliseconds between frames.

    Returns:
        Animation HTML with H + 1 frames (see ``animation_html``).

    Raises:
        TypeError: if an input is not a floating-point tensor.
        ValueError: if an input is not 3-D or 4-D, or weights / heads do not have q's
            number of heads and queries.
    """
    fig, update, n_frames, _ = _split_merge_frames(q, weights, heads, batch)
    n_heads = n_frames - 1
    anim = FuncAnimation(fig, update, frames=n_frames, interval=interval)
    alt = (
        f"Animation in {n_frames} frames: the queries are cut into {n_heads} heads by "
        "features; each head in turn is highlighted with its slice, its attention "
        "weights and its output, which is written into the same features of the "
        "merged output; the last frame shows all heads merged"
    )
    return animation_html(anim, alt=alt)


def _head_pattern_frames(weights, tokens: Sequence[str], query: int | None = None):
    """The figure and frame function of ``head_patterns_animation`` (for tests):
    returns ``(fig, update, n_frames, image)`` with ``image`` the big heatmap."""
    _validation.float_tensor("weights", weights, min_dim=3)
    if weights.dim() != 3:
        raise ValueError(
            f"weights: expected shape (H, T, S) (one layer), got {tuple(weights.shape)}"
        )
    w = weights.detach().float().cpu().numpy()
    n_heads, t, s = w.shape
    if len(tokens) != s or t != s:
        raise ValueError(
            f"tokens: expected {s} labels for self-attention weights (H, T, S) = "
            f"{w.shape}, got {len(tokens)}"
        )
    if query is not None and not 0 <= query < t:
        raise ValueError(f"query: expected an index in [0, {t}), got {query}")
    n_cols = 4
    n_rows = -(-n_heads // n_cols)
    fig = plt.figure(figsize=(9, 5.2), dpi=72)
    grid = fig.add_gridspec(
        n_rows,
        2 + n_cols,
        left=0.13,
        right=0.99,
        bottom=0.2,
        top=0.86,
        width_ratios=[4.6, 0.5] + [1] * n_cols,
        wspace=0.12,
        hspace=0.12,
    )
    ax = fig.add_subplot(grid[:, 0])
    image = ax.imshow(w[0], cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(s))
    ax.set_xticklabels(tokens, rotation=90)
    ax.set_yticks(range(t))
    ax.set_yticklabels(tokens)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    row_box = None
    if query is not None:
        row_box = ax.add_patch(
            Rectangle(
                (-0.5, query - 0.5),
                s,
                1,
                fill=False,
                lw=2,
                edgecolor=style.ROLE_COLORS["query"],
            )
        )
    thumbs = []
    for h in range(n_heads):
        a = fig.add_subplot(grid[h // n_cols, 2 + h % n_cols])
        a.imshow(w[h], cmap="viridis", vmin=0, vmax=1)
        a.set_xticks([])
        a.set_yticks([])
        a.set_title(f"{h}", fontsize=_SMALL, pad=2)
        for spine in a.spines.values():
            spine.set_visible(True)
            spine.set_linewidth(1)
        thumbs.append(a)
    title = fig.suptitle("", fontsize=style.FONT_PT["title"])

    def update(frame: int):
        image.set_data(w[frame])
        for h, a in enumerate(thumbs):
            for spine in a.spines.values():
                spine.set_edgecolor(
                    style.ROLE_COLORS["attention"] if h == frame else "0.8"
                )
                spine.set_linewidth(4 if h == frame else 1)
        text = f"head {frame} of {n_heads} (the {n_heads} heads at the right)"
        if row_box is not None:
            top = int(w[frame, query].argmax())
            text += (
                f"\nquery '{tokens[query]}' looks most at '{tokens[top]}' "
                f"(weight {w[frame, query, top]:.2f})"
            )
        title.set_text(text)
        return ()

    update(0)
    return fig, update, n_heads, image


def head_patterns_animation(
    weights, tokens: Sequence[str], *, query: int | None = None, interval=1200
) -> HTML:
    """The heads of one attention layer on one sentence, one head a frame (chapter 3).

    Left: head h's weights (T, T), queries as rows and keys as columns, labelled by
    the tokens (with ``query`` given, its row is outlined and the title names the key
    it weights most). Right: every head of the layer as a thumbnail, head h outlined,
    so the first frame already shows how differently the heads look.

    Args:
        weights: (H, T, T) self-attention weights of one layer, e.g.
            ``attention_maps(sentence, model)[1][layer]``.
        tokens: the T token labels.
        query: optional index of a query token to follow through the heads.
        interval: milliseconds between frames.

    Returns:
        Animation HTML with H frames (see ``animation_html``).

    Raises:
        TypeError: if ``weights`` is not a floating-point tensor.
        ValueError: if ``weights`` is not (H, T, T), the labels do not match T, or
            ``query`` is out of range.
    """
    fig, update, n_heads, _ = _head_pattern_frames(weights, tokens, query)
    anim = FuncAnimation(fig, update, frames=n_heads, interval=interval)
    alt = (
        f"Animation in {n_heads} frames: the attention weights of each of {n_heads} "
        f"heads on the tokens {' '.join(tokens)}, one head at a time, beside "
        "thumbnails of all the heads"
    )
    return animation_html(anim, alt=alt)
