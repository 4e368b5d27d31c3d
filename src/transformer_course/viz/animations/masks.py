"""Chapter 5: masks applied to the scores, and the mask of a cached decoding step.

Both animations draw numbers the chapter computed: the (T, S) scores of its queries and
keys, its bool masks (True = may attend, the library's convention) and, for decoding,
the weights of each step. The masked softmax drawn here follows the library's rule: a
row with no visible key gets all-zero weights (never NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.colors import LinearSegmentedColormap

from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html

_MINUS_INF = "\u2212\u221e"  # "−∞"


def _matrix(name: str, value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
    array = np.asarray(value)
    if array.ndim != 2:
        raise ValueError(
            f"{name}: expected a 2-D (T, S) array, got shape {array.shape}"
        )
    return array


def masked_softmax(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``scores`` (T, S) over the keys ``mask`` (T, S, bool)
    allows; a row with no allowed key is all zeros (the library's rule)."""
    shifted = np.where(mask, scores, -np.inf)
    top = shifted.max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(shifted - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def _cells(ax, n_rows: int, n_cols: int, cmap, vmin: float, vmax: float, title: str):
    image = ax.imshow(
        np.zeros((n_rows, n_cols)), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto"
    )
    ax.set_xticks(range(n_cols))
    ax.set_yticks(range(n_rows))
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(title)
    texts = [
        [ax.text(j, i, "", ha="center", va="center") for j in range(n_cols)]
        for i in range(n_rows)
    ]
    return image, texts


def mask_scores_animation(
    scores, masks: Mapping[str, object], *, interval: int = 700
) -> HTML:
    """A bool mask applied to the scores, row by row, and the softmax renormalising
    each row over the keys left (chapter 5; Vaswani et al. 2017, section 3.2.3).

    For each mask in turn (e.g. "causal", then "padding"), frame r shows on the left
    the (T, S) scores with rows 0..r masked: the hidden entries become -inf (dark
    cells); on the right the weights, where rows 0..r are the masked softmax and the
    rows below still show the softmax of the unmasked scores, so every frame, the
    first included, shows the contrast. A mask whose rows are all equal (padding
    hides the same keys from every query) is applied to every row in one frame. The
    last frame of each mask is its full weight matrix (the one
    ``scaled_dot_product_attention`` returns).

    Args:
        scores: (T, S) scores ``q k^T / sqrt(d_k)`` of one batch item and head.
        masks: name -> bool mask broadcastable to (T, S), True = may attend; at least
            one, shown in order.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``): T frames per mask, 1 for a mask
        whose rows are all equal.

    Raises:
        ValueError: ``scores`` not 2-D, no masks, or a mask that does not broadcast
            to (T, S).
        TypeError: a mask that is not bool.
    """
    s = _matrix("scores", scores).astype(float)
    if not masks:
        raise ValueError("masks: expected at least one name -> mask, got none")
    t, n_keys = s.shape
    shown = {}
    for name, mask in masks.items():
        m = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else mask
        m = np.asarray(m)
        if m.dtype != bool:
            raise TypeError(f"masks[{name!r}]: expected a bool mask, got {m.dtype}")
        while m.ndim > 2 and m.shape[0] == 1:  # (1, 1, T, S) -> (T, S)
            m = m[0]
        try:
            shown[name] = np.broadcast_to(m, (t, n_keys))
        except ValueError:
            raise ValueError(
                f"masks[{name!r}]: expected a mask broadcastable to (T, S) = "
                f"{(t, n_keys)}, got shape {m.shape}"
            ) from None
    plain = masked_softmax(s, np.ones_like(s, dtype=bool))
    # row by row; a mask whose rows are all equal (padding) in one frame
    frames = [
        (name, r)
        for name, m in shown.items()
        for r in ([t - 1] if (m == m[:1]).all() else range(t))
    ]
    fig, (ax_s, ax_w) = plt.subplots(1, 2, figsize=(6.8, 3.8), dpi=style.SAVE_DPI)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.8, wspace=0.3)
    scores_cmap = LinearSegmentedColormap.from_list(
        "scores", [style.tint(style.ROLE_COLORS["key"], 0.9), style.ROLE_COLORS["key"]]
    )
    weights_cmap = LinearSegmentedColormap.from_list(
        "weights", ["white", style.ROLE_COLORS["attention"]]
    )
    scores_cmap = scores_cmap.with_extremes(bad=style.ROLE_COLORS["mask"])
    weights_cmap = weights_cmap.with_extremes(
        bad=style.tint(style.ROLE_COLORS["mask"], 0.75)
    )
    image_s, text_s = _cells(ax_s, t, n_keys, scores_cmap, s.min(), s.max(), "scores")
    image_w, text_w = _cells(ax_w, t, n_keys, weights_cmap, 0.0, 1.0, "weights")
    title = fig.suptitle("")

    def update(frame: int):
        name, r = frames[frame]
        hidden = ~shown[name] & (np.arange(t)[:, None] <= r)  # rows 0..r masked
        masked = np.ma.masked_array(s, hidden)
        weights = np.where(
            np.arange(t)[:, None] <= r, masked_softmax(s, ~hidden), plain
        )
        image_s.set_data(masked)
        image_w.set_data(np.ma.masked_array(weights, hidden))
        for i in range(t):
            for j in range(n_keys):
                text_s[i][j].set_text(
                    _MINUS_INF if hidden[i, j] else f"{round(s[i, j], 1) + 0.0:.1f}"
                )
                text_s[i][j].set_color("white" if hidden[i, j] else "black")
                text_w[i][j].set_text("" if hidden[i, j] else f"{weights[i, j]:.2f}")
                text_w[i][j].set_color("white" if weights[i, j] > 0.6 else "black")
        if r < t - 1:
            title.set_text(f"{name} mask: rows 0-{r} masked (below: no mask yet)")
        else:
            title.set_text(f"{name} mask: every row masked, each renormalised")
        return (image_s, image_w, title)

    anim = FuncAnimation(fig, update, frames=len(frames), interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {len(frames)} frames: the {t} by {n_keys} attention scores "
            f"under the masks {', '.join(shown)}, one row per frame: the hidden "
            "scores become minus infinity and the softmax of that row spreads its "
            "weight over the keys left, while the rows not yet masked show the "
            "unmasked softmax"
        ),
    )


def decode_step_animation(
    masks: Sequence, weights: Sequence, *, interval: int = 700
) -> HTML:
    """Decoding with a KV cache, one new query per step (chapter 5).

    Frame t is step t: the new query t meets the S = t + 1 cached and new keys. Left,
    the causal picture of the whole decode so far: row t is the new query's mask row
    (bottom-right aligned, so all of it may attend), the rows above are earlier steps
    (faded), the keys not yet generated are blank. Right, that query's attention
    weights over its t + 1 keys, as bars.

    Args:
        masks: one bool mask per step, step t of shape (1, t + 1) (or broadcastable
            to it, e.g. ``causal_mask(1, t + 1)``).
        weights: one weight row per step, step t of shape (t + 1,) (or (1, t + 1)).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), one frame per step.

    Raises:
        ValueError: no steps, ``masks`` and ``weights`` of different lengths, or a
            step whose mask or weights do not have t + 1 keys.
        TypeError: a mask that is not bool.
    """
    if not weights or len(masks) != len(weights):
        raise ValueError(
            "masks, weights: expected one mask and one weight row per step (at least "
            f"one), got {len(masks)} masks and {len(weights)} weight rows"
        )
    n = len(weights)
    rows, bars = np.zeros((n, n)), []
    for t, (m, w) in enumerate(zip(masks, weights)):
        m = np.asarray(m.detach().cpu() if isinstance(m, torch.Tensor) else m)
        w = np.asarray(
            w.detach().cpu().float() if isinstance(w, torch.Tensor) else w, dtype=float
        ).reshape(-1)
        if m.dtype != bool:
            raise TypeError(f"masks[{t}]: expected a bool mask, got {m.dtype}")
        if m.shape[-1] != t + 1 or m.size != t + 1 or w.shape != (t + 1,):
            raise ValueError(
                f"masks[{t}], weights[{t}]: expected step {t} to have {t + 1} keys, "
                f"got a mask of shape {m.shape} and weights of shape {w.shape}"
            )
        rows[t, : t + 1] = np.where(m.reshape(-1), 1.0, 0.5)
        bars.append(w)
    fig, (ax_m, ax_w) = plt.subplots(
        1, 2, figsize=(7.0, 3.0), dpi=style.SAVE_DPI, width_ratios=[1, 1.3]
    )
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.18, top=0.84, wspace=0.35)
    cmap = LinearSegmentedColormap.from_list(
        "allowed", ["white", style.ROLE_COLORS["mask"]]
    )
    image = ax_m.imshow(np.zeros((n, n)), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax_m.set_xticks(range(n))
    ax_m.set_yticks(range(n))
    ax_m.set_xlabel("key position (cache + new)")
    ax_m.set_ylabel("decoding step (query)")
    ax_m.set_title("mask rows (dark = may attend)")
    bar = ax_w.bar(range(n), np.zeros(n), color=style.ROLE_COLORS["attention"])
    ax_w.set_xticks(range(n))
    ax_w.set_xlim(-0.5, n - 0.5)
    ax_w.set_ylim(0, 1)
    ax_w.set_xlabel("key position")
    ax_w.set_ylabel("weight of the new query")
    title = fig.suptitle("")

    def update(t: int):
        shown = rows.copy()
        shown[:t] *= 0.45  # earlier steps faded
        shown[t + 1 :] = 0.0
        image.set_data(shown)
        for j, rect in enumerate(bar):
            rect.set_height(bars[t][j] if j <= t else 0.0)
        seen = int(rows[t].sum() - 0.5 * (rows[t] == 0.5).sum())
        title.set_text(f"step {t}: the new query may attend to {seen} of {t + 1} keys")
        return (image, *bar, title)

    anim = FuncAnimation(fig, update, frames=n, interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: decoding with a KV cache; at step t the new "
            "query's mask row over the t + 1 cached keys (all of them may be "
            "attended) and its attention weights as bars"
        ),
    )
