"""Chapter 1: one query meeting the keys: its scores, the softmax, the weighted sum.

Each function takes the chapter's own tensors and returns the animation's HTML
(``animation_html``) in a ``div.tc-animation`` that states its smallest text
(``_frames.play``); frames fill the page's column. The first frame, the one
a reader sees before pressing play, already shows the whole row it works on (the final
weights as dashed outlines, the steps still to come named).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from IPython.display import HTML

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._frames import (
    OUTLINE,
    PENDING,
    as_array,
    check_labels,
    frame_figure,
    key_axis,
    play,
    softmax,
)


def query_scan_animation(
    scores,
    key_tokens: Sequence[str],
    *,
    query_token: str = "query",
    interval: int = 600,
) -> HTML:
    """One query scanning the keys while its attention weights form (chapter 1).

    Frame j (of S) shows the scores of keys 0..j (left) and the softmax over the keys
    seen so far (right); the full row of scores and the final weights are drawn as
    dashed outlines from the first frame on. The last frame is the full softmax, the
    query's weight row. The running normalisation is the same idea the FlashAttention
    chapter calls the online softmax.

    Args:
        scores: (S,) scores of one query against S keys (tensor or array).
        key_tokens: S labels.
        query_token: label of the query, used in the title.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``) in a ``div.tc-animation``.

    Raises:
        ValueError: if ``scores`` is not 1-D or the labels do not match it.
    """
    s = as_array("scores", scores, 1)
    check_labels("key_tokens", key_tokens, len(s))
    n, x = len(s), np.arange(len(s))
    fig, (ax_s, ax_w) = frame_figure(1, 2, 3.4)
    fig.subplots_adjust(left=0.08, right=0.99, bottom=0.3, top=0.86, wspace=0.25)
    pad = 0.1 * (np.abs(s).max() + 1e-9)
    ax_s.set_ylim(min(s.min(), 0) - pad, max(s.max(), 0) + pad)
    ax_w.set_ylim(0, 1.05)
    final = softmax(s)
    for ax, label, whole in (
        (ax_s, "score  q \u00b7 k / \u221ad", s),
        (ax_w, "softmax weight", final),
    ):
        key_axis(ax, key_tokens)
        ax.set_ylabel(label)
        ax.axhline(0, color="grey", lw=0.5)
        ax.bar(x, whole, fill=False, edgecolor=OUTLINE, linestyle="--", lw=0.8)
    bars_s = ax_s.bar(x, np.zeros(n), color=style.ROLE_COLORS["query"])
    bars_w = ax_w.bar(x, np.zeros(n), color=style.ROLE_COLORS["attention"])
    ax_w.text(
        0.98,
        0.95,
        "dashed: final weights",
        transform=ax_w.transAxes,
        ha="right",
        va="top",
        fontsize=style.FONT_PT["small"],
    )
    title = fig.suptitle("")

    def update(frame: int):
        w = softmax(s[: frame + 1])
        for j in range(n):
            bars_s[j].set_height(s[j] if j <= frame else 0.0)
            bars_w[j].set_height(w[j] if j <= frame else 0.0)
        title.set_text(
            f"query '{query_token}': {frame + 1} of {n} keys scanned"
            + (" (final weights)" if frame == n - 1 else "")
        )
        return (*bars_s, *bars_w, title)

    return play(
        fig,
        update,
        n,
        interval=interval,
        alt=(
            f"Animation in {n} frames: query '{query_token}' scans the keys "
            f"{', '.join(map(str, key_tokens))} one by one; left, the bar chart of its "
            "scores; right, the softmax over the keys seen so far, ending with its final "
            "attention weights"
        ),
    )


#: the steps of ``softmax_animation``: (name on the step bar, y label)
SOFTMAX_STEPS = (
    ("scores s", "score $s$"),
    ("s \u2212 max s", "$s - \\max\\, s$"),
    ("exp", "exp($s - \\max\\, s$)"),
    ("\u00f7 sum", "weight"),
)


def softmax_steps(s: np.ndarray) -> list[np.ndarray]:
    """The four rows ``softmax_animation`` draws: s, s - max s, its exp, the weights."""
    shifted = s - s.max()
    e = np.exp(shifted)
    return [s, shifted, e, e / e.sum()]


def softmax_animation(
    scores,
    key_tokens: Sequence[str],
    *,
    query_token: str = "query",
    interval: int = 1500,
) -> HTML:
    """The softmax turning one query's scores into its weights, step by step (chapter 1).

    Four frames, one per step of the stable softmax: the scores s; s - max s (the
    largest is 0, so no exponential can overflow); e^(s - max s), positive, the largest
    1, and their sum Z; e^(s - max s) / Z, the weights, which sum to 1. Each bar carries
    its number; a bar across the top names the four steps and marks the current one.

    Args:
        scores: (S,) scores of one query against S keys (tensor or array).
        key_tokens: S labels.
        query_token: label of the query, used in the title.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``) in a ``div.tc-animation``.

    Raises:
        ValueError: if ``scores`` is not 1-D or the labels do not match it.
    """
    s = as_array("scores", scores, 1)
    check_labels("key_tokens", key_tokens, len(s))
    rows, n, x = softmax_steps(s), len(s), np.arange(len(s))
    fig, ax = frame_figure(1, 1, 3.6)
    fig.subplots_adjust(left=0.09, right=0.99, bottom=0.27, top=0.8)
    key_axis(ax, key_tokens)
    ax.axhline(0, color="grey", lw=0.5)
    bars = ax.bar(x, np.zeros(n))
    numbers = [ax.text(j, 0, "", ha="center", fontsize=10) for j in range(n)]
    steps = [
        fig.text(
            0.1 + 0.23 * i,
            0.9,
            f"{i + 1}. {name}" + (" \u2192" if i < 3 else ""),
            fontsize=11,
        )
        for i, (name, _) in enumerate(SOFTMAX_STEPS)
    ]
    title = ax.set_title("", fontsize=11)
    colours = [style.ROLE_COLORS["query"]] * 2 + [style.ROLE_COLORS["attention"]] * 2

    def update(frame: int):
        row = rows[frame]
        pad = 0.25 * (np.abs(row).max() + 1e-9)
        ax.set_ylim(min(row.min(), 0) - pad, max(row.max(), 0) + pad)
        for j, (bar, text) in enumerate(zip(bars, numbers)):
            bar.set_height(row[j])
            bar.set_color(colours[frame])
            bar.set_alpha(0.55 if frame == 2 else 1.0)
            text.set_text(f"{row[j]:.2f}")
            text.set_y(row[j] + (0.04 if row[j] >= 0 else -0.04) * 2 * pad)
            text.set_va("bottom" if row[j] >= 0 else "top")
        for i, step in enumerate(steps):
            step.set_color("black" if i == frame else "#888888")
            step.set_fontweight("bold" if i == frame else "normal")
        ax.set_ylabel(SOFTMAX_STEPS[frame][1])
        title.set_text(
            [
                f"the scores of query '{query_token}'",
                f"the largest score, {s.max():.2f}, subtracted: the largest is 0",
                f"exponentials, all in (0, 1]: their sum Z = {rows[2].sum():.2f}",
                f"divided by Z: the weights, which sum to {rows[3].sum():.2f}",
            ][frame]
        )
        return (*bars, *numbers, *steps, title)

    return play(
        fig,
        update,
        len(rows),
        interval=interval,
        alt=(
            f"Animation in 4 frames: the softmax of query '{query_token}' over the "
            f"keys {', '.join(map(str, key_tokens))}, as bar charts with each number "
            "written on its bar: the scores, the scores minus the largest one, their "
            "exponentials, and the exponentials divided by their sum, the weights"
        ),
    )


def weighted_sum_animation(
    weights,
    values,
    key_tokens: Sequence[str],
    *,
    query_token: str = "query",
    dims: int = 16,
    interval: int = 700,
) -> HTML:
    """One query's output row built as the weighted sum of the values (chapter 1).

    The keys are added in order of weight, largest first, one a frame (S frames).
    Left: the query's weights, the keys added so far coloured and the current one
    outlined. Middle: the current key's value row v_j (dashed outline) and its
    contribution w_j v_j (bars). Right: the output so far, sum of w_i v_i over the keys
    added, with the final output ``weights @ values`` as black marks. The last frame's
    bars are the output. Only the first ``dims`` components are drawn.

    Args:
        weights: (S,) attention weights of one query (tensor or array).
        values: (S, d_v) value rows, one per key.
        key_tokens: S labels.
        query_token: label of the query, used in the title.
        dims: how many components of the values and the output to draw (at most d_v).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``) in a ``div.tc-animation``.

    Raises:
        ValueError: if ``weights`` is not 1-D, ``values`` not (S, d_v) with the same S,
            the labels do not match, or ``dims`` < 1.
        TypeError: if ``dims`` is not an int.
    """
    w = as_array("weights", weights, 1)
    v = as_array("values", values, 2)
    if v.shape[0] != len(w):
        raise ValueError(
            f"values: expected shape ({len(w)}, d_v), one row per weight, got {v.shape}"
        )
    check_labels("key_tokens", key_tokens, len(w))
    _validation.positive_int("dims", dims)
    v = v[:, :dims]  # (S, dims)
    n, order = len(w), np.argsort(-w, kind="stable")
    running = np.cumsum(w[order, None] * v[order], axis=0)  # (S, dims), keys in order
    fig, (ax_w, ax_v, ax_o) = frame_figure(
        1, 3, 3.8, gridspec_kw={"width_ratios": [1.1, 1, 1]}
    )
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.3, top=0.8, wspace=0.35)
    x, d = np.arange(n), np.arange(v.shape[1])
    key_axis(ax_w, key_tokens)
    ax_w.set_ylabel("weight")
    ax_w.set_ylim(0, 1.05 * w.max())
    bars_w = ax_w.bar(x, w, color=PENDING)
    v_lim = 1.1 * np.abs(v).max()
    o_lim = 1.1 * max(np.abs(running).max(), 1e-9)
    for ax, lim, name in ((ax_v, v_lim, "w_j v_j"), (ax_o, o_lim, "output so far")):
        ax.set_ylim(-lim, lim)
        ax.set_xlabel("component")
        ax.set_title(name, fontsize=11)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(d[:: max(1, len(d) // 4)])
    outline = ax_v.bar(
        d, np.zeros(len(d)), fill=False, edgecolor=OUTLINE, linestyle="--", lw=0.8
    )
    contribution = ax_v.bar(d, np.zeros(len(d)), color=style.ROLE_COLORS["value"])
    output = ax_o.bar(d, np.zeros(len(d)), color=style.ROLE_COLORS["value"])
    ax_o.plot(d, running[-1], "_", color="black", markersize=12, mew=2)
    title = fig.suptitle("")

    def update(frame: int):
        j = order[frame]
        for i, bar in enumerate(bars_w):
            added = i in order[: frame + 1]
            bar.set_color(style.ROLE_COLORS["attention"] if added else PENDING)
            bar.set_edgecolor("black" if i == j else "none")
        for c in range(len(d)):
            outline[c].set_height(v[j, c])
            contribution[c].set_height(w[j] * v[j, c])
            output[c].set_height(running[frame, c])
        ax_v.set_title(f"'{key_tokens[j]}': {w[j]:.2f} \u00d7 value", fontsize=11)
        title.set_text(
            f"query '{query_token}': {frame + 1} of {n} keys added, largest weight "
            "first (black marks: the final output)"
        )
        return (*bars_w, *outline, *contribution, *output, title)

    return play(
        fig,
        update,
        n,
        interval=interval,
        alt=(
            f"Animation in {n} frames: the output of query '{query_token}' built as "
            "the weighted sum of the values, one key a frame in order of weight; left, "
            "the weights over the keys with those added so far coloured; middle, the "
            "current key's value row times its weight; right, the running sum of the "
            f"first {len(d)} output components against the final output"
        ),
    )
