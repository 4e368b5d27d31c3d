"""Chapters 1-2: one query meeting the keys, its scores, softmax and weighted sum."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation

from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html


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
