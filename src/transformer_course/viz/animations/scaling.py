"""Chapter 2: the scale 1/sqrt(d_k), and what the softmax does without it.

Frames have the page column's width (``_frames.FRAME_WIDTH_IN`` at ``FRAME_DPI``),
so 10 pt text shows at 10.6 px; the first frame already shows every number it works on
(rows still to come faded, the whole curve of the largest weight drawn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from IPython.display import HTML

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._frames import (
    as_array,
    frame_figure,
    play,
)

#: the three maps: (panel title, the words of the frame's title)
STAGES = (
    ("scores q\u00b7k", "its scores q\u00b7k"),
    ("scaled by 1/\u221ad_k", "scaled by 1/\u221ad_k"),
    ("softmax over keys", "softmax over the keys"),
)
FADED = 0.2  #: opacity of the rows not computed yet


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """The stable softmax over the last axis."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def scaled_scores_animation(scores, d_k: int, *, interval: int = 500) -> HTML:
    """Query by query: the raw scores, the same row scaled by 1/sqrt(d_k), then its
    softmax (chapter 2; Vaswani et al. 2017, section 3.2.1, equation 1).

    Three heat maps of shape (T, S): ``scores``, ``scores / sqrt(d_k)`` and its
    row-wise softmax. Frame 3 r + i lights up row r of map i (and the rows above it in
    every map); the rows not computed yet stay faded, so the first frame already
    shows all three maps. 3 T frames.

    Args:
        scores: (T, S) raw scores ``q @ k.T`` (tensor or array).
        d_k: the size of queries and keys, >= 1.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``) in a ``div.tc-animation``.

    Raises:
        ValueError: if ``scores`` is not 2-D or ``d_k`` < 1.
        TypeError: if ``d_k`` is not an int.
    """
    raw = as_array("scores", scores, 2)
    _validation.positive_int("d_k", d_k)
    t, s = raw.shape
    scaled = raw / math.sqrt(d_k)
    stages = [raw, scaled, softmax_rows(scaled)]
    fig, axes = frame_figure(1, 3, 3.0)
    fig.subplots_adjust(left=0.06, right=0.97, bottom=0.18, top=0.78, wspace=0.45)
    images = []
    for ax, stage, (name, _) in zip(axes, stages, STAGES):
        lim = np.abs(stage).max()
        cmap, vmin = ("viridis", 0.0) if stage is stages[2] else ("RdBu_r", -lim)
        images.append(ax.imshow(stage, cmap=cmap, vmin=vmin, vmax=lim))
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_xticks(range(s))
        ax.set_yticks(range(t))
        fig.colorbar(images[-1], ax=ax, shrink=0.85)
    title = fig.suptitle("")

    def update(frame: int):
        row, stage = divmod(frame, 3)
        for i, image in enumerate(images):
            alpha = np.full((t, s), FADED)
            alpha[: row + 1 if i <= stage else row] = 1.0
            image.set_alpha(alpha)
        title.set_text(f"query {row} (of {t}): {STAGES[stage][1]}")
        return (*images, title)

    return play(
        fig,
        update,
        3 * t,
        interval=interval,
        alt=(
            f"Animation in {3 * t} frames: three heat maps of {t} queries by {s} keys, "
            f"the raw scores, the scores divided by the square root of d_k = {d_k}, "
            "and their softmax over the keys, filled in query by query and stage by "
            "stage; rows not computed yet are faded"
        ),
    )


def softmax_saturation_animation(
    scores, d_ks: Sequence[int], *, interval: int = 900
) -> HTML:
    """Scores for growing d_k, with and without the scale 1/sqrt(d_k), and the softmax
    they give (chapter 2; Vaswani et al. 2017, section 3.2.1, footnote 4).

    One frame per d_k. Top left: the raw scores q . k of the first query (their spread
    grows like sqrt(d_k)) and the scaled ones (it stays put). Bottom: the softmax of
    each, the unscaled one going one-hot. Top right: the largest weight against d_k,
    averaged over the N queries, both curves drawn whole from the first frame on and
    the current d_k marked.

    Args:
        scores: raw scores q . k against S keys, one block per d_k: (n, N, S) for N
            queries, or (n, S) for one (tensor or array).
        d_ks: the n sizes d_k (ints >= 1), in the order of ``scores``.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``) in a ``div.tc-animation``.

    Raises:
        ValueError: if ``scores`` is not 2-D or 3-D, or ``d_ks`` does not have one
            entry per block of scores, or a d_k < 1.
        TypeError: if a d_k is not an int.
    """
    raw = scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores
    raw = np.asarray(raw, dtype=float)
    raw = as_array("scores", raw[:, None] if raw.ndim == 2 else raw, 3)  # (n, N, S)
    d_ks = list(d_ks)
    if len(d_ks) != len(raw):
        raise ValueError(
            f"d_ks: expected {len(raw)} sizes (one per block of scores), "
            f"got {len(d_ks)}"
        )
    for d_k in d_ks:
        _validation.positive_int("d_ks", d_k)
    n, _, s = raw.shape
    scaled = raw / np.sqrt(np.array(d_ks, dtype=float))[:, None, None]
    weights = {"unscaled": softmax_rows(raw), "scaled": softmax_rows(scaled)}
    colour = {
        "unscaled": style.ROLE_COLORS["embedding"],
        "scaled": style.ROLE_COLORS["attention"],
    }
    fig, ((ax_s, ax_m), (ax_u, ax_k)) = frame_figure(2, 2, 5.4)
    fig.subplots_adjust(
        left=0.08, right=0.98, bottom=0.1, top=0.9, wspace=0.25, hspace=0.6
    )
    x, half = np.arange(s), 0.4
    lim = 1.15 * np.abs(raw[:, 0]).max()
    ax_s.set_ylim(-lim, lim)
    ax_s.axhline(0, color="grey", lw=0.5)
    ax_s.set_ylabel("score")
    bars = {
        name: ax_s.bar(x + shift, np.zeros(s), half, color=colour[name], label=label)
        for name, shift, label in (
            ("unscaled", -half / 2, "q\u00b7k"),
            ("scaled", half / 2, "q\u00b7k / \u221ad_k"),
        )
    }
    ax_s.legend(loc="upper left", ncol=2, fontsize=10, frameon=False)
    for name, w in weights.items():
        ax_m.semilogx(
            d_ks,
            w.max(-1).mean(-1),
            "o-",
            base=2,
            color=colour[name],
            label=name,
            markersize=4,
        )
    ax_m.set_ylim(0, 1.05)
    ax_m.set_xticks(d_ks[::2], [str(d) for d in d_ks[::2]])
    ax_m.minorticks_off()
    ax_m.set_xlabel("d_k")
    ax_m.set_ylabel("largest weight")
    ax_m.set_title(f"mean over {raw.shape[1]} queries", fontsize=11)
    ax_m.legend(loc="center right", fontsize=10, frameon=False)
    (marker,) = ax_m.plot([], [], "o", color="black", markersize=9, fillstyle="none")
    weight_bars = {}
    for ax, name in ((ax_u, "unscaled"), (ax_k, "scaled")):
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("weight")
        weight_bars[name] = ax.bar(x, np.zeros(s), color=colour[name])
    for ax in (ax_s, ax_u, ax_k):
        ax.set_xlabel("key")
        ax.set_xticks(x[:: max(1, s // 8)])
    title = fig.suptitle("")

    def update(frame: int):
        d_k = d_ks[frame]
        for name in ("unscaled", "scaled"):
            w = weights[name][frame, 0]
            row = (raw if name == "unscaled" else scaled)[frame, 0]
            for j in range(s):
                bars[name][j].set_height(row[j])
                weight_bars[name][j].set_height(w[j])
        marker.set_data(
            [d_k] * 2, [weights[name][frame].max(-1).mean() for name in weights]
        )
        ax_s.set_title("scores of the first query", fontsize=11)
        for ax, name in ((ax_u, "unscaled"), (ax_k, "scaled")):
            top = weights[name][frame, 0].max()
            ax.set_title(f"{name}: largest weight {top:.2f}", fontsize=11)
        title.set_text(f"d_k = {d_k} ({frame + 1} of {n})")
        return (*bars["unscaled"], *bars["scaled"], marker, title)

    return play(
        fig,
        update,
        n,
        interval=interval,
        alt=(
            f"Animation in {n} frames, one per d_k from {d_ks[0]} to {d_ks[-1]}: the "
            f"scores of one query against {s} keys without and with the scale "
            "1/sqrt(d_k), the softmax weights of each (the unscaled ones go one-hot "
            "as d_k grows, the scaled ones do not), and the largest weight against "
            "d_k, averaged over the queries"
        ),
    )
