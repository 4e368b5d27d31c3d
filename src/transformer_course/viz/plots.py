"""Static figures of attention: heatmaps of weight matrices and grids of heads.

Every function takes tensors (or arrays) and returns a ``matplotlib.figure.Figure``,
in the spirit of d2l's ``show_heatmaps``; the caller decides whether to show or save it.
"""

from __future__ import annotations

import base64
import html
import io
import os
import weakref
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from transformer_course.viz import style


def as_array(name: str, x, ndim: int, shape: str | None = None) -> np.ndarray:
    """``x`` (tensor or array-like) as a float64 numpy array with ``ndim`` dimensions
    (a tensor goes through ``.double()``: no precision is lost on the way). The one
    converter of the figures and the animations (``animations._frames`` re-exports it).

    Args:
        name: the argument's name, for the error message.
        x: tensor, array or nested sequence of numbers.
        ndim: the number of dimensions expected.
        shape: the expected shape in words, e.g. ``"(T, N)"``, for the error message.

    Raises:
        ValueError: naming ``name``, for another number of dimensions or no entries.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    a = np.asarray(x, dtype=float)
    if a.ndim != ndim or a.size == 0:
        what = f"shape {shape}" if shape else f"{ndim} dimension(s)"
        raise ValueError(
            f"{name}: expected a non-empty array with {what}, got shape {a.shape}"
        )
    return a


def _draw(ax, w, x_labels, y_labels, title, cmap, annotate, vmax):
    image = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_xlabel("key position (attended to)")
    ax.set_ylabel("query position (attending)")
    for labels, setter, ticks, n in (
        (x_labels, ax.set_xticklabels, ax.set_xticks, w.shape[1]),
        (y_labels, ax.set_yticklabels, ax.set_yticks, w.shape[0]),
    ):
        if labels is not None:
            if len(labels) != n:
                raise ValueError(f"labels: expected {n} labels, got {len(labels)}")
            ticks(range(n))
            setter(labels, rotation=90 if setter is ax.set_xticklabels else 0)
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                color = "white" if w[i, j] < 0.6 * vmax else "black"
                ax.text(
                    j,
                    i,
                    f"{w[i, j]:.2f}",
                    ha="center",
                    va="center",
                    color=color,
                    fontsize=style.FONT_PT["small"],
                )
    if title:
        ax.set_title(title)
    return image


def attention_heatmap(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    cmap: str = "viridis",
    annotate: bool = False,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Draw one attention weight matrix as a heatmap with a colour bar.

    Args:
        weights: (T, S) tensor or array; rows are queries, columns keys.
        x_labels: S key labels (tokens); y_labels: T query labels.
        title: figure title. annotate: write each weight in its cell.

    Returns:
        The Figure (axes labelled "query position" / "key position").

    Raises:
        ValueError: if ``weights`` is not 2-D or a label list has the wrong length.
    """
    w = as_array("weights", weights, 2)
    if figsize is None:
        figsize = (1.0 + 0.45 * w.shape[1] + 1.2, 1.0 + 0.45 * w.shape[0])
        figsize = style.fit_width((max(figsize[0], 3.5), max(figsize[1], 3.0)))
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    image = _draw(ax, w, x_labels, y_labels, title, cmap, annotate, max(w.max(), 1e-9))
    fig.colorbar(image, ax=ax, label="attention weight")
    plt.close(fig)  # the caller shows it; no stray copy in notebooks
    rows = f" ({', '.join(map(str, y_labels))})" if y_labels is not None else ""
    cols = f" ({', '.join(map(str, x_labels))})" if x_labels is not None else ""
    set_alt_text(
        fig,
        (
            f"{title + ': ' if title else ''}heatmap of attention weights, "
            f"{w.shape[0]} queries{rows} as rows by {w.shape[1]} keys{cols} "
            f"as columns; brighter cells are larger weights (max {w.max():.2f})"
        ),
    )
    return fig


def attention_grid(
    weights,
    *,
    row_label: str = "layer",
    col_label: str = "head",
    tokens: Sequence[str] | None = None,
    title: str | None = None,
    cmap: str = "viridis",
    cell_size: float = 1.6,
) -> Figure:
    """Draw a grid of attention matrices, e.g. every (layer, head) of a model.

    Args:
        weights: (R, C, T, S) or (C, T, S) tensor/array.
        row_label, col_label: what the grid's rows and columns are.
        tokens: optional token labels, drawn on the first column / last row only.

    Returns:
        The Figure.

    Raises:
        ValueError: if ``weights`` is not 3-D or 4-D.
    """
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().float().cpu().numpy()
    w = np.asarray(weights, dtype=float)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4:
        raise ValueError(f"weights: expected (R, C, T, S) or (C, T, S), got {w.shape}")
    n_rows, n_cols = w.shape[:2]
    small = style.FONT_PT["small"]
    fig, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=style.fit_width((cell_size * n_cols, cell_size * n_rows)),
        squeeze=False,
        layout="constrained",
    )
    # token labels only when they fit side by side under a panel (no overlapping text)
    panel_in = fig.get_size_inches()[0] / n_cols
    fits = tokens is not None and len(tokens) * small * 1.3 / 72 <= panel_in
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r, c]
            ax.imshow(w[r, c], cmap=cmap, vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"{col_label} {c}", fontsize=small)
            if c == 0:
                ax.set_ylabel(
                    f"{row_label} {r}" if n_rows > 1 else "query", fontsize=small
                )
            if tokens is not None and r == n_rows - 1 and fits:
                ax.set_xticks(range(len(tokens)))
                ax.set_xticklabels(tokens, rotation=90, fontsize=small)
    if title:
        fig.suptitle(title)
    plt.close(fig)
    set_alt_text(
        fig,
        (
            f"{title + ': ' if title else ''}grid of {n_rows} by {n_cols} "
            f"attention weight maps, {row_label}s as rows and {col_label}s as "
            f"columns; each map has queries as rows and keys as columns"
        ),
    )
    return fig


# -- alt text: every figure on the static site gets a text description ------------------

_ALT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_alt_text(fig: Figure, text: str) -> Figure:
    """Attach a description (alt text) to ``fig`` for readers who cannot see it; the book
    build writes it as the image's ``alt`` attribute. Returns ``fig``.

    Raises:
        TypeError: if ``fig`` is not a Figure or ``text`` is not a non-empty string.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
    if not isinstance(text, str) or not text.strip():
        raise TypeError(f"text: expected a non-empty string, got {text!r}")
    _ALT[fig] = text.strip()
    return fig


def describe_figure(fig: Figure) -> str:
    """A description of ``fig`` built from what it states: its title, and each panel's
    title and axis labels (the first 6 panels)."""
    parts = []
    suptitle = fig._suptitle.get_text().strip() if fig._suptitle else ""
    if suptitle:
        parts.append(suptitle)
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for ax in axes[:6]:
        bits = [ax.get_title().strip()]
        if ax.get_xlabel().strip():
            bits.append(f"x: {ax.get_xlabel().strip()}")
        if ax.get_ylabel().strip():
            bits.append(f"y: {ax.get_ylabel().strip()}")
        bits = [b for b in bits if b]
        if bits:
            parts.append(", ".join(bits))
    if len(axes) > 6:
        parts.append(f"and {len(axes) - 6} more panels")
    if not parts:
        return f"Figure with {len(axes)} panel(s)"
    return "Figure: " + "; ".join(parts)


def alt_text(fig: Figure) -> str:
    """The alt text of ``fig``: the one given to ``set_alt_text``, else
    ``describe_figure(fig)``."""
    return _ALT.get(fig) or describe_figure(fig)


def figure_html(fig: Figure) -> str:
    """``fig`` as an HTML ``<img>`` (PNG data URI) with its alt text."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=style.SAVE_DPI)
    data = base64.b64encode(buf.getvalue()).decode()
    px = style.smallest_text_px(fig)
    return (
        f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt_text(fig))}" '
        'class="tc-figure" style="max-width:100%"'
        + (f' data-min-text-px="{px:.1f}">' if px else ">")
    )


def _static_figure_html(fig: Figure) -> str | None:
    # IPython calls this for every Figure it displays; None keeps the usual PNG output.
    if os.environ.get("TRANSFORMER_COURSE_STATIC", "").lower() not in {
        "1",
        "true",
        "yes",
    }:
        return None
    try:
        return figure_html(fig)
    except Exception:  # noqa: BLE001 (never break a cell's output; fall back to the PNG)
        return None


def register_alt_text_display() -> bool:
    """In the book build (``TRANSFORMER_COURSE_STATIC=1``), show every Figure as an
    ``<img>`` with alt text instead of a bare PNG (myst-nb gives output PNGs no alt
    text). Called when ``transformer_course.viz`` is imported inside IPython; returns
    whether a running IPython was found."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False

    def register():
        ip.display_formatter.formatters["text/html"].for_type(
            Figure, _static_figure_html
        )

    # The inline backend removes every Figure formatter when it starts, which matplotlib
    # does lazily at the first figure: start it now (importing it is what starts it), and
    # register again before and after each cell in case it restarts.
    if "matplotlib_inline" in os.environ.get("MPLBACKEND", ""):  # set by ipykernel
        import matplotlib_inline.backend_inline  # noqa: F401
    register()
    if not getattr(ip, "_transformer_course_alt_text", False):
        ip.events.register("pre_execute", register)
        ip.events.register("post_execute", register)
        ip._transformer_course_alt_text = True
    return True
