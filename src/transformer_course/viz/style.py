"""The book's one style: colours per role, font sizes, figure widths that fit the page.

Every figure, animation and diagram of the course takes its colours from ``ROLE_COLORS``
(queries, keys and values keep one colour each everywhere, as in Jay Alammar's
*The Illustrated Transformer*) and its sizes from here. ``use_book_style()`` sets
matplotlib's defaults once; ``transformer_course.viz`` calls it when imported, so a
chapter that imports any viz function is styled.

Page geometry: the site's code/figure column is ``COLUMN_PX`` = 684 px wide at a
1280 px window. A figure W inches wide saved at D dpi is W * D px wide and is shown at
most that wide (``max-width: 100%``), so a font of s pt shows at
``s * D / 72 * min(1, 684 / (W * D))`` px (``on_page_px``). Text must show at
``MIN_TEXT_PX`` = 10 px or more.

Colours: the Okabe-Ito palette (Okabe and Ito 2008, "Color Universal Design"), which
stays distinguishable with the common colour-vision deficiencies.
"""

from __future__ import annotations

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.text import Text

from transformer_course import _validation

COLUMN_PX = 684  #: width of the page's code/figure column at a 1280 px window
MIN_TEXT_PX = 10  #: smallest text allowed on the page
SAVE_DPI = 100  #: the resolution the book saves figures at (matplotlib's default)
#: widest figure (inches) whose 10 pt text still shows at 10 px: 10 * 684 / (72 * 9.5)
MAX_WIDTH_IN = 9.5
#: figure width (inches) that fills the column with 10 pt text at 13 px
COLUMN_WIDTH_IN = 7.0

#: one colour per role, used by plots, animations and diagrams alike
ROLE_COLORS = {
    "query": "#0072B2",  # blue
    "key": "#E69F00",  # orange
    "value": "#009E73",  # bluish green
    "attention": "#CC79A7",  # reddish purple
    "feedforward": "#56B4E9",  # sky blue
    "norm": "#7F7F7F",  # grey
    "embedding": "#D55E00",  # vermillion
    "mask": "#444444",  # dark grey
    "residual": "#999999",  # light grey
    "linear": "#5A5A8C",  # slate
    "data": "#222222",  # inputs and outputs
}

FONT_PT = {"base": 11, "small": 10, "title": 12}  #: sizes in points

_RC = {
    "font.size": FONT_PT["base"],
    "axes.titlesize": FONT_PT["title"],
    "axes.labelsize": FONT_PT["base"],
    "xtick.labelsize": FONT_PT["small"],
    "ytick.labelsize": FONT_PT["small"],
    "legend.fontsize": FONT_PT["small"],
    "figure.titlesize": FONT_PT["title"],
    "figure.figsize": (COLUMN_WIDTH_IN, 4.0),
    "axes.prop_cycle": mpl.cycler(
        color=[ROLE_COLORS[r] for r in ("query", "key", "value", "attention")]
        + [ROLE_COLORS[r] for r in ("embedding", "feedforward", "norm")]
    ),
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def book_rc() -> dict:
    """The matplotlib rcParams of the book style (a copy)."""
    return dict(_RC)


def use_book_style() -> None:
    """Set matplotlib's defaults to the book style (idempotent)."""
    mpl.rcParams.update(_RC)


def role_color(role: str) -> str:
    """The hex colour of ``role`` (a key of ``ROLE_COLORS``).

    Raises:
        ValueError: for an unknown role, listing the known ones.
    """
    _validation.one_of("role", role, ROLE_COLORS)
    return ROLE_COLORS[role]


def tint(color: str, amount: float = 0.82) -> str:
    """``color`` mixed with white (``amount`` of white, in [0, 1)): box fills whose
    black text stays readable."""
    _validation.probability("amount", amount)
    r, g, b = mpl.colors.to_rgb(color)
    mix = [c + (1 - c) * amount for c in (r, g, b)]
    return mpl.colors.to_hex(mix)


def fit_width(figsize: tuple[float, float]) -> tuple[float, float]:
    """``figsize`` scaled down (keeping its aspect) so it is at most ``MAX_WIDTH_IN``
    wide: the widest figure whose 10 pt text stays at 10 px on the page."""
    w, h = figsize
    if w <= MAX_WIDTH_IN:
        return (w, h)
    return (MAX_WIDTH_IN, h * MAX_WIDTH_IN / w)


def on_page_px(size_pt: float, width_in: float, dpi: float = SAVE_DPI) -> float:
    """On-page size in px of ``size_pt`` text in a figure ``width_in`` inches wide saved
    at ``dpi``: ``size_pt * dpi / 72 * min(1, COLUMN_PX / (width_in * dpi))``.

    Raises:
        ValueError: if a size is not positive.
    """
    for name, value in (("size_pt", size_pt), ("width_in", width_in), ("dpi", dpi)):
        if not value > 0:
            raise ValueError(f"{name}: expected a positive number, got {value!r}")
    native = size_pt * dpi / 72
    return native * min(1.0, COLUMN_PX / (width_in * dpi))


def smallest_text_pt(fig: Figure) -> float | None:
    """The font size (pt) of the smallest visible, non-empty text in ``fig`` (titles,
    labels, tick labels, annotations), or None for a figure without text."""
    if not isinstance(fig, Figure):
        raise TypeError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
    fig.canvas.draw()  # tick labels exist only once drawn
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_figure() is not None
    ]
    return min(sizes) if sizes else None


def smallest_text_px(fig: Figure, dpi: float = SAVE_DPI) -> float | None:
    """On-page px of ``fig``'s smallest text when saved at ``dpi`` with
    ``bbox_inches="tight"`` (as the book does) and shown in the 684 px column."""
    size = smallest_text_pt(fig)
    if size is None:
        return None
    width_in = fig.get_tightbbox().width  # inches, the saved width
    return on_page_px(size, width_in, dpi)
