"""What the chapters' animations share (chapters 1-2): frames of the page column's
width, PNG frames with an adaptive palette, and the ``div.tc-animation`` around the
player that states the frames' smallest text in px (read by ``tools/measure_pages.py``).

Frames are ``FRAME_WIDTH_IN`` inches at ``FRAME_DPI``: exactly the 684 px of the page's
column (``style.COLUMN_PX``), so a frame is never scaled down and 10 pt text shows at
10.6 px.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML
from matplotlib.animation import FuncAnimation

from transformer_course import _validation
from transformer_course.viz.animations._player import animation_html
from transformer_course.viz.plots import as_array  # noqa: F401 (the animations' converter)

FRAME_DPI = 76  #: frames are FRAME_WIDTH_IN * FRAME_DPI = 684 px wide: the column
FRAME_WIDTH_IN = 9.0
PENDING = "#DDDDDD"  #: what is still to come (light grey)
OUTLINE = "#555555"  #: dashed outlines of the final result


def check_labels(name: str, labels, n: int) -> None:
    """``labels``: a sequence of ``n`` labels, one per key.

    Raises:
        ValueError: naming ``name``, the expected and the received count.
    """
    if isinstance(labels, str) or len(labels) != n:
        got = "a string" if isinstance(labels, str) else f"{len(labels)} labels"
        raise ValueError(f"{name}: expected {n} labels (one per key), got {got}")


def frame_figure(nrows: int, ncols: int, height_in: float, **kwargs):
    """A figure of the column's width at ``FRAME_DPI`` (no layout engine: the
    positions are fixed once, so the axes do not jump between frames)."""
    return plt.subplots(
        nrows, ncols, figsize=(FRAME_WIDTH_IN, height_in), dpi=FRAME_DPI, **kwargs
    )


def play(fig, update, n_frames: int, *, alt: str, interval: int) -> HTML:
    """Animate ``update(frame)`` over ``n_frames`` frames of ``fig``: the player's
    HTML in a ``div.tc-animation`` that states the frames' smallest text in px."""
    _validation.positive_int("interval", interval)
    update(0)  # the titles of the first frame count for the text size
    anim = FuncAnimation(fig, update, frames=n_frames, interval=interval, blit=False)
    return animation_html(anim, alt=alt)


def softmax(s: np.ndarray) -> np.ndarray:
    """The stable softmax of a vector (the largest score subtracted first)."""
    e = np.exp(s - s.max())
    return e / e.sum()


def key_axis(ax, tokens: Sequence[str]) -> None:
    """One tick per key, labelled with its token, upright labels that never overlap."""
    ax.set_xticks(np.arange(len(tokens)))
    ax.set_xticklabels(tokens, rotation=90)
    ax.set_xlabel("key")
