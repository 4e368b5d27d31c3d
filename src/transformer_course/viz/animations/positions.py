"""Chapter 4: positions, animated on the chapter's vectors.

``rotary_pairs_animation`` turns the feature pairs of a query and a key as both move
along the sequence (rotary position embedding, Su et al. 2021, section 3.2, equations
13-16): the angle between them, and so their score, stays fixed.
``sinusoidal_offset_animation`` slides a position along the sinusoidal table (Vaswani
et al. 2017, section 3.5) and shows that the dot product of two encodings depends on
their offset only.

Shape letters: d features (even), L table length, F frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation

from transformer_course import _validation, positional
from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html


def _vector(name: str, x) -> torch.Tensor:
    """``x`` a floating-point (d,) tensor with d even."""
    _validation.float_tensor(name, x, min_dim=1)
    if x.dim() != 1 or x.shape[0] % 2:
        raise ValueError(
            f"{name}: expected shape (d,) with d even, got {tuple(x.shape)}"
        )
    return x.detach().cpu().double()


def _frame_positions(positions) -> torch.Tensor:
    """``positions`` (F,) integers, F >= 1."""
    positions = torch.as_tensor(positions)
    _validation.integer_tensor("positions", positions)
    if positions.dim() != 1 or len(positions) == 0:
        raise ValueError(
            f"positions: expected shape (F,) with F >= 1, got {tuple(positions.shape)}"
        )
    return positions.cpu()


def _rotated_pairs(q, k, positions, offset: int, base: float = 10000.0):
    """The rotated query and key of each frame: q at ``positions`` (F,) and k at
    ``positions - offset``, by ``positional.apply_rotary`` in the interleaved layout
    (pair i = features 2i, 2i+1). Returns two arrays (F, d/2, 2)."""
    q, k = _vector("q", q), _vector("k", k)
    if q.shape != k.shape:
        raise ValueError(
            f"k: expected q's shape {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    p = _frame_positions(positions)
    _validation.positive_int("offset", offset, minimum=0)
    f, d = len(p), q.shape[0]
    rq = positional.apply_rotary(q.expand(f, d), p, layout="interleaved", base=base)
    rk = positional.apply_rotary(
        k.expand(f, d), p - offset, layout="interleaved", base=base
    )
    return rq.view(f, d // 2, 2).numpy(), rk.view(f, d // 2, 2).numpy()  # (F, d/2, 2)


def _rotary_frames(q, k, positions, offset, pairs, base):
    """The figure and frame function of ``rotary_pairs_animation`` (for tests):
    returns ``(fig, update, n_frames, arrows)``, ``arrows`` one (query, key) pair of
    quivers per drawn feature pair."""
    rq, rk = _rotated_pairs(q, k, positions, offset, base)
    p = _frame_positions(positions)
    n_pairs = rq.shape[1]
    if not pairs or any(not 0 <= i < n_pairs for i in pairs):
        raise ValueError(
            f"pairs: expected indices in [0, {n_pairs}) (d/2 pairs), got {list(pairs)}"
        )
    scores = (rq * rk).sum(axis=(1, 2))  # (F,) the full q . k of each frame
    theta = base ** (-np.arange(0, 2 * n_pairs, 2) / (2 * n_pairs))
    # each pair drawn as a unit arrow: its direction is what rotates
    uq = rq / np.maximum(np.linalg.norm(rq, axis=-1, keepdims=True), 1e-12)
    uk = rk / np.maximum(np.linalg.norm(rk, axis=-1, keepdims=True), 1e-12)
    lim = 1.2
    n_cols = min(len(pairs), 2)  # two panels a row: large enough to read
    n_rows = -(-len(pairs) // n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(6.4, 2.5 * n_rows + 0.7), dpi=72, squeeze=False
    )
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.07, top=0.84, hspace=0.3)
    for ax in axes.flat[len(pairs) :]:
        ax.set_visible(False)
    arrows = []
    for ax, i in zip(axes.flat, pairs):
        ax.add_patch(plt.Circle((0, 0), 1, fill=False, color="0.85"))
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_xlabel(f"pair {i}: \u03b8 = {theta[i]:.3g}")
        arrows.append(
            tuple(
                ax.quiver(
                    0,
                    0,
                    *v[0, i],
                    color=style.ROLE_COLORS[role],
                    angles="xy",
                    scale_units="xy",
                    scale=1,
                    width=0.025,
                )
                for v, role in ((uq, "query"), (uk, "key"))
            )
        )
    title = fig.suptitle("", fontsize=style.FONT_PT["title"])

    def update(frame: int):
        for (qa, ka), i in zip(arrows, pairs):
            qa.set_UVC(*uq[frame, i])
            ka.set_UVC(*uk[frame, i])
        title.set_text(
            f"query (blue) at {int(p[frame])}, key (orange) at "
            f"{int(p[frame]) - offset}\nscore q \u00b7 k = {scores[frame]:.3f}"
        )
        return ()

    update(0)
    return fig, update, len(p), arrows


def rotary_pairs_animation(
    q,
    k,
    positions,
    *,
    offset: int,
    pairs: Sequence[int] = (0, 1, 2, 3),
    base: float = 10000.0,
    interval: int = 500,
) -> HTML:
    """A query and a key rotated by rotary embedding as they move along (chapter 4).

    One panel per drawn feature pair i (interleaved layout: features 2i, 2i+1): the
    query's pair (blue) rotated to the frame's position p and the key's (orange) to
    p - ``offset``, both by ``positional.apply_rotary``, drawn as unit arrows (the
    direction is what rotates; the lengths never change). Fast pairs spin, slow ones
    barely move, and the angle between query and key stays the same in every pair,
    so the score q . k printed in the title (over all d features) is the same in
    every frame. The first frame already shows both vectors.

    Args:
        q, k: (d,) query and key before rotation, d even.
        positions: (F,) the query's position in each frame (integers).
        offset: how many positions the key is behind the query (>= 0).
        pairs: which feature pairs to draw (indices in [0, d/2)).
        base: the rotary frequency base.
        interval: milliseconds between frames.

    Returns:
        Animation HTML with F frames (see ``animation_html``).

    Raises:
        TypeError: non-float q or k, non-integer positions or offset.
        ValueError: q or k not (d,) with d even or of different shapes, empty
            positions, a negative offset, or a pair index out of range.
    """
    fig, update, n_frames, _ = _rotary_frames(q, k, positions, offset, pairs, base)
    anim = FuncAnimation(fig, update, frames=n_frames, interval=interval)
    alt = (
        f"Animation in {n_frames} frames: pairs {', '.join(map(str, pairs))} of a "
        f"query and of a key {offset} positions behind it, drawn as arrows that "
        "rotary embedding turns as both move along the sequence; the angle between "
        "them and their score stay the same"
    )
    return animation_html(anim, alt=alt)


def _offset_frames(pe, positions, max_offset: int):
    """The figure and frame function of ``sinusoidal_offset_animation`` (for tests):
    returns ``(fig, update, n_frames, (line_abs, line_rel))``."""
    _validation.float_tensor("pe", pe, min_dim=2)
    if pe.dim() != 2:
        raise ValueError(f"pe: expected shape (L, d), got {tuple(pe.shape)}")
    p = _frame_positions(positions)
    n = pe.shape[0]
    if int(p.min()) < 0 or int(p.max()) >= n:
        raise ValueError(
            f"positions: expected values in [0, {n}) (rows of pe), got "
            f"{int(p.min())} to {int(p.max())}"
        )
    _validation.positive_int("max_offset", max_offset)
    table = pe.detach().cpu().double()
    dots = (table[p] @ table.T).numpy()  # (F, L): PE(p) . PE(q) for every q
    offsets = np.arange(-max_offset, max_offset + 1)
    fig, (ax_a, ax_r) = plt.subplots(1, 2, figsize=(9, 3.3), dpi=72, sharey=True)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.17, top=0.8, wspace=0.1)
    ax_a.set_xlim(0, n - 1)
    ax_r.set_xlim(-max_offset, max_offset)
    pad = 0.05 * (dots.max() - dots.min())
    ax_a.set_ylim(dots.min() - pad, dots.max() + pad)
    ax_a.set_xlabel("other position q")
    ax_a.set_ylabel("PE(p) \u00b7 PE(q)")
    ax_r.set_xlabel("offset q - p")
    ax_a.set_title("against the position")
    ax_r.set_title("against the offset")
    color = style.ROLE_COLORS["embedding"]

    def relative(frame: int) -> np.ndarray:
        q = int(p[frame]) + offsets
        ok = (q >= 0) & (q < n)
        return np.where(ok, dots[frame, np.clip(q, 0, n - 1)], np.nan)

    for f in range(len(p)):  # every frame's curve, faint: they coincide
        ax_r.plot(offsets, relative(f), color="0.8", lw=1)
    (line_abs,) = ax_a.plot(np.arange(n), dots[0], color=color)
    marker = ax_a.axvline(int(p[0]), color=style.ROLE_COLORS["query"], lw=1)
    (line_rel,) = ax_r.plot(offsets, relative(0), color=color, lw=2)
    title = fig.suptitle("", fontsize=style.FONT_PT["title"])

    def update(frame: int):
        line_abs.set_ydata(dots[frame])
        marker.set_xdata([int(p[frame])] * 2)
        line_rel.set_ydata(relative(frame))
        title.set_text(
            f"p = {int(p[frame])}: the peak moves with p (left), "
            "the curve against the offset does not (right)"
        )
        return ()

    update(0)
    return fig, update, len(p), (line_abs, line_rel)


def sinusoidal_offset_animation(
    pe, positions, *, max_offset: int = 60, interval: int = 700
) -> HTML:
    """The dot product of sinusoidal encodings as a position slides (chapter 4).

    Frame f takes p = ``positions[f]`` and draws PE(p) . PE(q) for every row q of the
    table: left against q (the peak follows p), right against the offset q - p, over
    the faint curves of all the frames, which coincide: the dot product is
    sum_i cos((q - p) omega_i), a function of the offset only.

    Args:
        pe: (L, d) a sinusoidal table, e.g. ``positional.sinusoidal_encoding(L, d)``.
        positions: (F,) the positions p of the frames, integers in [0, L).
        max_offset: the offsets drawn on the right, -max_offset to max_offset.
        interval: milliseconds between frames.

    Returns:
        Animation HTML with F frames (see ``animation_html``).

    Raises:
        TypeError: non-float ``pe``, non-integer ``positions`` or ``max_offset``.
        ValueError: ``pe`` not 2-D, empty positions or positions outside the table,
            ``max_offset`` < 1.
    """
    fig, update, n_frames, _ = _offset_frames(pe, positions, max_offset)
    anim = FuncAnimation(fig, update, frames=n_frames, interval=interval)
    alt = (
        f"Animation in {n_frames} frames: the dot product of the sinusoidal "
        "encoding at a sliding position p with every other position, against the "
        "position (the peak moves) and against the offset (the curve stays)"
    )
    return animation_html(anim, alt=alt)
