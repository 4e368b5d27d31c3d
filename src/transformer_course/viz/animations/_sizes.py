"""The on-page size of an animation's smallest text, for tools/measure_pages.py."""

from __future__ import annotations

from IPython.display import HTML
from matplotlib.figure import Figure

from transformer_course.viz import style


def smallest_frame_text_px(fig: Figure) -> float | None:
    """On-page px of the smallest text of ``fig`` drawn as an animation frame: the
    player shows each frame at the figure's full size (``figsize`` x ``dpi``, no
    cropping), scaled down to the 684 px column when wider."""
    size = style.smallest_text_pt(fig)
    if size is None:
        return None
    return style.on_page_px(size, fig.get_figwidth(), fig.dpi)


def with_text_size(html: HTML, px: float | None) -> HTML:
    """``html`` (an animation) inside a ``<div data-min-text-px>`` stating ``px``."""
    if px is None:
        return html
    return HTML(
        f'<div class="tc-animation" data-min-text-px="{px:.1f}">{html.data}</div>'
    )
