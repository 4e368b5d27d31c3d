"""Chapter 7: a KV cache growing token by token during decoding.

The cache (Pope et al. 2023, section 2; chapter 7) keeps every layer's keys and values;
each decoding step computes the key and value of the newest token only and appends
them, while its query attends to everything cached.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html

#: how a token's whitespace is drawn in tick labels
_VISIBLE = {"\n": "\u21b5", " ": "\u2423", "\t": "\u21e5"}


def _matrix(name: str, x) -> np.ndarray:
    a = np.asarray(torch.as_tensor(x).detach().float().cpu(), dtype=float)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D tensor (S, d), got shape {a.shape}")
    return a


def _kv_frames(keys, values, tokens: Sequence[str], n_prompt: int):
    """The figure of ``kv_cache_animation`` and its frame function: (fig, update, n)."""
    k, v = _matrix("keys", keys), _matrix("values", values)
    s = k.shape[0]
    if v.shape[0] != s:
        raise ValueError(
            f"values: expected {s} rows (one per cached position, as keys), "
            f"got shape {v.shape}"
        )
    if len(tokens) != s:
        raise ValueError(
            f"tokens: expected {s} labels (one per cached position), got {len(tokens)}"
        )
    _validation.positive_int("n_prompt", n_prompt)
    if n_prompt > s:
        raise ValueError(f"n_prompt: expected at most S = {s}, got {n_prompt}")
    labels = ["".join(_VISIBLE.get(c, c) for c in str(t)) or "\u2205" for t in tokens]
    n = s - n_prompt + 1  # frame 0: the prompt; then one new token a frame
    fig, axes = plt.subplots(
        2, 2, figsize=(8.5, 3.8), dpi=72, gridspec_kw={"width_ratios": [2.2, 1]}
    )
    fig.subplots_adjust(
        left=0.08, right=0.98, bottom=0.14, top=0.86, wspace=0.3, hspace=0.55
    )
    ax_k, ax_v = axes[0, 0], axes[1, 0]
    gs = axes[0, 1].get_gridspec()
    for ax in axes[:, 1]:
        ax.remove()
    ax_w = fig.add_subplot(gs[:, 1])
    images, outlines = [], []
    for ax, data, name, role in ((ax_k, k, "K", "key"), (ax_v, v, "V", "value")):
        vmax = float(np.abs(data).max()) or 1.0
        # grey where a position is not cached yet
        cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#f2f2f2")
        images.append(
            ax.imshow(
                np.full_like(data.T, np.nan),
                cmap=cmap,
                vmin=-vmax,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
        )
        ax.set_xticks(range(s), labels)
        ax.set_yticks([])
        ax.set_ylabel(f"{name} ({data.shape[1]})", color=style.ROLE_COLORS[role])
        for side in ax.spines.values():
            side.set_visible(False)
        outlines.append(
            ax.add_patch(
                Rectangle(
                    (-0.5, -0.5),
                    1,
                    data.shape[1],
                    fill=False,
                    edgecolor=style.ROLE_COLORS[role],
                    lw=2.5,
                )
            )
        )
    ax_v.set_xlabel("cached position (token)")
    # positions run through the model, in total: with a cache each step feeds the new
    # token only; without one it feeds the whole sequence again
    lengths = np.arange(n_prompt, s + 1)
    with_cache = n_prompt + np.arange(n)
    without = np.cumsum(lengths)
    (line_w,) = ax_w.plot([], [], marker="o", color=style.ROLE_COLORS["query"])
    (line_wo,) = ax_w.plot([], [], marker="s", color=style.ROLE_COLORS["norm"])
    ax_w.set_xlim(n_prompt - 0.5, s + 0.5)
    ax_w.xaxis.get_major_locator().set_params(integer=True)
    ax_w.set_ylim(0, without[-1] * 1.1)
    ax_w.set_xlabel("tokens in the sequence")
    ax_w.set_ylabel("positions fed so far")
    ax_w.legend([line_w, line_wo], ["with cache", "without"], loc="upper left")
    title = fig.suptitle("")

    def update(frame: int):
        cached = n_prompt + frame
        for image, data in zip(images, (k, v)):
            shown = np.full_like(data.T, np.nan)
            shown[:, :cached] = data[:cached].T
            image.set_data(shown)
            # tokens not generated yet stay unlabelled
            image.axes.set_xticks(range(s), labels[:cached] + [""] * (s - cached))
        new = slice(0, cached) if frame == 0 else slice(cached - 1, cached)
        for outline in outlines:
            outline.set_x(new.start - 0.5)
            outline.set_width(new.stop - new.start)
        line_w.set_data(lengths[: frame + 1], with_cache[: frame + 1])
        line_wo.set_data(lengths[: frame + 1], without[: frame + 1])
        what = (
            f"the prompt: {cached} positions cached at once"
            if frame == 0
            else f"step {frame}: '{labels[cached - 1]}' appended, {cached} cached"
        )
        title.set_text(f"KV cache of one head, {what}")
        return (*images, *outlines, line_w, line_wo, title)

    update(0)  # the still frame before play already shows the cached prompt
    return fig, update, n


def kv_cache_animation(
    keys, values, tokens: Sequence[str], *, n_prompt: int, interval: int = 700
) -> HTML:
    """A KV cache growing during greedy decoding, on the page's numbers (chapter 7).

    Frame 0 shows the keys and values of the prompt, cached by one forward pass; frame
    f adds the key and value of the f-th generated token (outlined) to one head's
    cache: K above V, one column per cached position, features down the rows, blank
    where nothing is cached yet. Beside them, the positions run through the model so
    far with the cache (the prompt, then one a step) and without it (the whole
    sequence every step), which grows as the square of the length.

    Args:
        keys: (S, d_k) the cached keys of one head of one layer, after decoding
            (e.g. ``caches[0].k[0, 0]``).
        values: (S, d_v) the cached values of the same head.
        tokens: S labels, the token at each position (whitespace drawn visibly).
        n_prompt: how many of the S positions are the prompt (1 <= n_prompt <= S).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), S - n_prompt + 1 frames.

    Raises:
        ValueError: keys or values not 2-D, or with different numbers of rows; labels
            that do not match; ``n_prompt`` outside [1, S].
        TypeError: an ``n_prompt`` that is not an int.
    """
    fig, update, n = _kv_frames(keys, values, tokens, n_prompt)
    anim = FuncAnimation(fig, update, frames=n, interval=interval, blit=False)
    s = len(tokens)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: one attention head's KV cache, keys above and "
            f"values below as heat maps with one column per position, first holding "
            f"the {n_prompt} prompt positions and then growing by one column per "
            f"generated token up to {s}; beside it, the positions fed to the model so "
            "far, growing by one a step with the cache and by the whole sequence a "
            "step without it"
        ),
    )
