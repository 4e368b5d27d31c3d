"""Chapter 9: smaller models. Heads removed one group at a time with the fidelity
curve they trace (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"),
and a student's softened distribution approaching its teacher's (Hinton et al. 2015,
"Distilling the Knowledge in a Neural Network", section 2)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._frames import as_array
from transformer_course.viz.animations._player import animation_html

_DPI = 80  # 8.5 in x 80 dpi = 680 px: the column's width, 10 pt text at 11 px


def head_pruning_animation(
    order: Sequence[tuple[int, int]],
    n_removed: Sequence[int],
    fidelity,
    *,
    n_layers: int,
    n_heads: int,
    interval: int = 900,
) -> HTML:
    """Heads removed in ``order``, a group per frame, with the fidelity curve (ch. 9).

    Frame f shows the (n_layers, n_heads) grid of heads, each cell shaded by its
    place in ``order`` (darkest: removed first), the ``n_removed[f]`` first heads of
    ``order`` greyed out and crossed, and the heads the next frame removes outlined;
    beside it the fidelity reached after each removal so far (dots on a solid line),
    over the whole curve drawn faintly, so the first frame (nothing removed yet)
    already shows which heads go first and where the curve leads.

    Args:
        order: every head as (layer, head), least important first.
        n_removed: F increasing counts of removed heads, one per frame (e.g. 0, 12,
            ..., 72), each in [0, len(order)].
        fidelity: (F,) the fidelity (e.g. Spearman's rho) with n_removed[f] removed.
        n_layers, n_heads: the grid's size; ``order`` holds each head once.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), F frames.

    Raises:
        ValueError: ``order`` not listing each of the n_layers * n_heads heads once,
            ``fidelity`` not of shape (F,), counts that decrease or fall outside
            [0, len(order)].
        TypeError: n_layers or n_heads not an int.
    """
    _validation.positive_int("n_layers", n_layers)
    _validation.positive_int("n_heads", n_heads)
    order = [(int(layer), int(head)) for layer, head in order]
    every = {(layer, head) for layer in range(n_layers) for head in range(n_heads)}
    if len(order) != len(every) or set(order) != every:
        raise ValueError(
            f"order: expected each of the {n_layers} x {n_heads} heads once, got "
            f"{len(order)} entries covering {len(set(order) & every)} heads"
        )
    counts = [int(k) for k in n_removed]
    rho = as_array("fidelity", fidelity, 1)
    if len(rho) != len(counts) or not counts:
        raise ValueError(
            f"fidelity: expected shape ({len(counts)},), one per n_removed, got "
            f"{rho.shape}"
        )
    if any(b < a for a, b in pairwise(counts)) or not (
        0 <= counts[0] and counts[-1] <= len(order)
    ):
        raise ValueError(
            f"n_removed: expected increasing counts in [0, {len(order)}], got {counts}"
        )
    rank = np.zeros((n_layers, n_heads))
    for i, (layer, head) in enumerate(order):
        rank[layer, head] = i
    fig, (ax_g, ax_c) = plt.subplots(
        1, 2, figsize=(8.5, 4.4), dpi=_DPI, gridspec_kw={"width_ratios": [1.3, 1]}
    )
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.17, top=0.83, wspace=0.3)
    ax_g.imshow(rank, cmap="Purples_r", vmin=-0.3 * len(order), vmax=len(order))
    ax_g.set_xticks(range(0, n_heads, max(1, n_heads // 6)))
    ax_g.set_yticks(range(n_layers))
    ax_g.set_xlabel("head")
    ax_g.set_ylabel("layer")
    removed = {
        key: ax_g.add_patch(
            Rectangle(
                (key[1] - 0.5, key[0] - 0.5),
                1,
                1,
                facecolor="white",
                edgecolor="grey",
                hatch="xx",
                visible=False,
            )
        )
        for key in order
    }
    nxt = {
        key: ax_g.add_patch(
            Rectangle(
                (key[1] - 0.45, key[0] - 0.45),
                0.9,
                0.9,
                fill=False,
                edgecolor=style.ROLE_COLORS["key"],
                lw=2.5,
                visible=False,
            )
        )
        for key in order
    }
    ax_c.plot(counts, rho, "--", color="lightgrey", lw=1.5)
    (line,) = ax_c.plot([], [], "o-", color=style.ROLE_COLORS["attention"])
    ax_c.set_xlim(-0.03 * len(order), 1.03 * len(order))
    ax_c.set_ylim(min(0.0, rho.min() - 0.05), 1.05)
    ax_c.set_xlabel("heads removed")
    ax_c.set_ylabel("fidelity (Spearman)")
    title = fig.suptitle("")

    def update(frame: int):
        k = counts[frame]
        k_next = counts[frame + 1] if frame + 1 < len(counts) else k
        for i, key in enumerate(order):
            removed[key].set_visible(i < k)
            nxt[key].set_visible(k <= i < k_next)
        line.set_data(counts[: frame + 1], rho[: frame + 1])
        then = f"; outlined: the next {k_next - k} to go" if k_next > k else ""
        title.set_text(
            f"{k} of {len(order)} heads removed: fidelity {rho[frame]:.3f}{then}"
        )
        return (*removed.values(), *nxt.values(), line, title)

    anim = FuncAnimation(fig, update, frames=len(counts), interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {len(counts)} frames: a {n_layers} by {n_heads} grid of "
            "attention heads, coloured by how early each is removed, greys out the "
            "least important heads a group at a time, the next group outlined, "
            "while the fidelity curve beside it follows the removals from "
            f"{rho[0]:.2f} to {rho[-1]:.2f}"
        ),
    )


def soft_target_animation(
    teacher_logits,
    student_logits,
    temperature: float,
    *,
    steps=None,
    interval: int = 600,
) -> HTML:
    """A student's softened distribution approaching its teacher's (chapter 9).

    Frame f shows, class by class, the teacher's soft targets
    p = softmax(t / T) (bars) and the student's q = softmax(s_f / T) after training
    snapshot f (dots on stems), with the soft-target loss T^2 KL(p || q) of that
    snapshot in the title. The first frame is the untrained student: the gap to be
    closed is visible before play.

    Args:
        teacher_logits: (C,) the teacher's logits t.
        student_logits: (F, C) the student's logits s at F training snapshots.
        temperature: T > 0, the same for both sides (Hinton et al. 2015, eq. 1).
        steps: F labels of the snapshots (optimiser steps; default 0 .. F - 1).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), F frames.

    Raises:
        ValueError: logits of other shapes than (C,) and (F, C) with the same C, a
            temperature that is not positive, or ``steps`` of another length than F.
    """
    t = as_array("teacher_logits", teacher_logits, 1)
    s = as_array("student_logits", student_logits, 2)
    if s.shape[1] != t.shape[0] or s.shape[0] == 0:
        raise ValueError(
            f"student_logits: expected shape (F, {t.shape[0]}) with F >= 1, got "
            f"{s.shape}"
        )
    _validation.non_negative("temperature", temperature)
    if temperature == 0:
        raise ValueError("temperature: expected a number > 0, got 0")
    steps = list(range(len(s))) if steps is None else [int(x) for x in steps]
    if len(steps) != len(s):
        raise ValueError(f"steps: expected {len(s)} labels, got {len(steps)}")

    def softmax(x):
        e = np.exp((x - x.max(-1, keepdims=True)) / temperature)
        return e / e.sum(-1, keepdims=True)

    p, q = softmax(t), softmax(s)  # (C,), (F, C)
    kl = temperature**2 * (p * (np.log(p) - np.log(q))).sum(-1)  # (F,)
    c = np.arange(len(t))
    fig, ax = plt.subplots(figsize=(8.5, 4.0), dpi=_DPI)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.18, top=0.85)
    ax.bar(
        c, p, color=style.tint(style.ROLE_COLORS["embedding"], 0.45), label="teacher p"
    )
    stems = ax.vlines(c, 0, q[0], color=style.ROLE_COLORS["query"], lw=2)
    (dots,) = ax.plot(c, q[0], "o", color=style.ROLE_COLORS["query"], label="student q")
    ax.set_xticks(c)
    ax.set_xlabel("class")
    ax.set_ylabel(f"probability at T = {temperature:g}")
    ax.set_ylim(0, 1.35 * max(p.max(), q.max()))  # room for the legend
    ax.legend(loc="upper center", ncol=2)
    title = ax.set_title("")

    def update(frame: int):
        stems.set_segments([[(x, 0), (x, y)] for x, y in zip(c, q[frame])])
        dots.set_ydata(q[frame])
        title.set_text(
            f"step {steps[frame]}: soft-target loss T\u00b2 KL(p\u2016q) = "
            f"{kl[frame]:.3f}"
        )
        return stems, dots, title

    anim = FuncAnimation(fig, update, frames=len(s), interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {len(s)} frames: bars of the teacher's softened "
            f"probabilities over {len(t)} classes at temperature {temperature:g}, "
            "and the student's probabilities as dots that move onto the bars as it "
            f"trains, the loss falling from {kl[0]:.2f} to {kl[-1]:.2f}"
        ),
    )
