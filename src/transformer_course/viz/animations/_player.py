"""Animations that play on the static site: matplotlib ``FuncAnimation`` rendered to
self-contained JavaScript HTML (``to_jshtml``), with the figure closed so no stray still
frame is shown beside it (pitfall P21), and no request to a font CDN.
"""

from __future__ import annotations

import base64
import io
import os
import re
from html import escape

import matplotlib.pyplot as plt
from IPython.display import HTML
from matplotlib.animation import Animation
from PIL import Image

from transformer_course.viz import style
from transformer_course.viz.animations._labels import player_in_chinese
from transformer_course.viz.plots import alt_text

# to_jshtml() draws its buttons with Font Awesome 4 icons loaded from a CDN. The site
# must make no outside request, and Unicode symbols (U+23EE ...) are missing from the
# site's fonts and common Linux fonts (they render as empty boxes), so each icon becomes
# a small inline SVG: it shows wherever the HTML goes (the site, Jupyter, Colab) with no
# font or file to load. Each button keeps its title and aria-label.
_TRIANGLE_RIGHT, _TRIANGLE_LEFT = "M4 2v12l9-6z", "M12 2v12L3 8z"
_PATHS = {
    "fa fa-fast-backward": "M2 2h2v12H2zM9 2v12L4 8zM15 2v12L9 8z",
    "fa fa-step-backward": "M3 2h2v12H3zM14 2v12L6 8z",
    "fa fa-play fa-flip-horizontal": _TRIANGLE_LEFT,
    "fa fa-pause": "M3 2h4v12H3zM9 2h4v12H9z",
    "fa fa-play": _TRIANGLE_RIGHT,
    "fa fa-step-forward": "M2 2v12l8-6zM11 2h2v12h-2z",
    "fa fa-fast-forward": "M1 2v12l6-6zM7 2v12l5-6zM12 2h2v12h-2z",
    "fa fa-minus": "M2 7h12v2H2z",
    "fa fa-plus": "M2 7h12v2H2zM7 2h2v12H7z",
}
_ICONS = {
    cls: '<svg class="tc-icon" width="14" height="14" viewBox="0 0 16 16" '
    f'aria-hidden="true" focusable="false"><path fill="currentColor" d="{d}"/></svg>'
    for cls, d in _PATHS.items()
}
_LINK = re.compile(r"<link[^>]*font-awesome[^>]*>", re.DOTALL)


def _keep_first_layout(fig) -> None:
    """Lay a figure with a layout engine (constrained, tight) out once, when its first
    frame is drawn, and keep that layout for every later frame. Otherwise each frame's
    ``savefig`` solves the layout again, with an extra draw (about half the time of
    rendering an animation), and the axes can jitter between frames."""
    if fig.get_layout_engine() is None:
        return

    def freeze(event) -> None:
        fig.canvas.mpl_disconnect(connection)
        fig.set_layout_engine("none")  # the positions just computed stay

    connection = fig.canvas.mpl_connect("draw_event", freeze)


PALETTE = 128  #: colours of a frame's PNG (an adaptive palette: a third of the bytes)
_FRAME = re.compile(r'(frames\[\d+\] = "data:image/png;base64,)(.*?)(")', re.DOTALL)


def smaller_frames(html: str, colors: int = PALETTE) -> str:
    """``html`` of ``to_jshtml`` with each PNG frame re-encoded with an adaptive
    palette of ``colors`` colours (what keeps a page with three animations within its
    2 MB)."""

    def shrink(match: re.Match) -> str:
        png = base64.b64decode(match[2].replace("\\\n", ""))
        image = Image.open(io.BytesIO(png)).convert("RGB")
        image = image.quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
        out = io.BytesIO()
        image.save(out, "PNG", optimize=True)
        return match[1] + base64.b64encode(out.getvalue()).decode("ascii") + match[3]

    return _FRAME.sub(shrink, html)


def frame_text_px(fig) -> float | None:
    """On-page px of the smallest text of ``fig`` drawn as an animation frame: the
    player shows each frame at the figure's full size (``figsize`` x ``dpi``), scaled
    down to the page's column when wider. None for a figure without text."""
    size = style.smallest_text_pt(fig)
    return None if size is None else style.on_page_px(size, fig.get_figwidth(), fig.dpi)


def animation_html(
    anim: Animation, *, default_mode: str = "once", alt: str | None = None
) -> HTML:
    """Render an animation as self-contained JS HTML and close its figure.

    Args:
        anim: a matplotlib ``Animation`` (e.g. ``FuncAnimation``).
        default_mode: "once", "loop" or "reflect" (the player's initial mode).
        alt: what the animation shows, for readers who cannot see it (the frame
            image's alt text); default: described from the figure's titles and axis
            labels (``viz.plots.alt_text``) as they stand after the last frame.

    Returns:
        ``IPython.display.HTML`` with a frame slider (labelled for screen readers) and
        play buttons (titled in Chinese when ``TRANSFORMER_COURSE_LANG`` is "zh", as
        in the Chinese notebooks), inside a ``div.tc-animation`` whose
        ``data-min-text-px`` states the frames' smallest text on the page (read by
        ``tools/measure_pages.py``; the smaller of the figure before the first frame and
        after the last); the PNG frames have an adaptive palette (``smaller_frames``).
        Displaying it gives exactly one text/html output.

    Raises:
        TypeError: if ``anim`` is not a matplotlib Animation.
    """
    if not isinstance(anim, Animation):
        raise TypeError(
            f"anim: expected a matplotlib Animation, got {type(anim).__name__}"
        )
    fig = anim._fig
    _keep_first_layout(fig)
    sizes = [frame_text_px(fig)]
    # Saving a frame draws the figure; FuncAnimation would draw it once more before
    # (draw_idle), for a screen this figure never has: half the rendering time saved.
    fig.canvas.draw_idle = lambda *args, **kwargs: None
    html = smaller_frames(anim.to_jshtml(default_mode=default_mode))
    sizes.append(frame_text_px(fig))
    plt.close(fig)
    html = _LINK.sub("", html)
    for cls, icon in _ICONS.items():
        html = html.replace(f'<i class="{cls}"></i>', icon)
    if "<i class=" in html:  # a matplotlib with other icons: fail loudly, not blank
        raise RuntimeError(
            "animation_html: to_jshtml() used an icon without an SVG "
            "here: add it to viz.animations._player._PATHS"
        )
    if alt is None:
        alt = "Animation. " + alt_text(anim._fig)
    html = re.sub(
        r'<img id="(_anim_img\w+)">',
        lambda m: f'<img id="{m[1]}" alt="{escape(alt)}">',
        html,
    )
    html = re.sub(
        r'(<input id="_anim_slider\w+" type="range" class="anim-slider")',
        r'\1 aria-label="Animation frame"',
        html,
    )
    if os.environ.get("TRANSFORMER_COURSE_LANG", "").strip() == "zh":
        html = player_in_chinese(html)  # a Chinese notebook (notebooks/zh)
    stated = [px for px in sizes if px is not None]
    px = f' data-min-text-px="{min(stated):.1f}"' if stated else ""
    return HTML(f'<div class="tc-animation"{px}>{html}</div>')
