"""One call for an interactive view that also works on the static site.

``interactive(fn, **controls)`` shows ipywidgets controls in a live kernel (Jupyter,
Colab). In the book build, where no kernel runs behind the page, widgets cannot
recompute (MyST-NB #458, pitfall P19), so the same call pre-renders ``fn`` for every
combination of control values and emits HTML whose sliders and menus swap the
pre-rendered images with a few lines of JavaScript. The build selects that mode by
setting the environment variable ``TRANSFORMER_COURSE_STATIC=1``.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import os
import uuid
from collections.abc import Callable, Sequence
from numbers import Number

import matplotlib.pyplot as plt
from IPython.display import HTML, display
from matplotlib.figure import Figure

from transformer_course.viz.plots import alt_text

STATIC_ENV = "TRANSFORMER_COURSE_STATIC"
MAX_FRAMES = 240


def static_mode() -> bool:
    """True when views must be pre-rendered: the book build (``TRANSFORMER_COURSE_STATIC``
    set to 1/true/yes) or ipywidgets is not installed."""
    if os.environ.get(STATIC_ENV, "").lower() in {"1", "true", "yes"}:
        return True
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return True
    return False


def _options(name: str, values) -> list[tuple[str, object]]:
    if isinstance(values, dict):
        pairs = [(str(k), v) for k, v in values.items()]
    elif isinstance(values, Sequence) and not isinstance(values, str):
        pairs = [(str(v), v) for v in values]
    else:
        raise TypeError(
            f"{name}: expected a list of values or a dict label -> value, "
            f"got {type(values).__name__}"
        )
    if not pairs:
        raise ValueError(f"{name}: expected at least one value, got none")
    return pairs


def _png(fig: Figure, dpi: int) -> str:
    if not isinstance(fig, Figure):
        raise TypeError(
            f"fn: expected it to return a matplotlib Figure, got {type(fig).__name__}"
        )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def static_html(
    fn: Callable[..., Figure], controls: dict, *, alt: str | None = None, dpi: int = 72
) -> str:
    """Pre-render ``fn`` for every combination of control values; return the HTML.

    Args:
        fn: called as ``fn(**values)``; returns a matplotlib Figure.
        controls: name -> list of values (or dict label -> value).
        alt: alt text of the image (what the view shows); default: described from the
            first figure's titles and axis labels (``viz.plots.alt_text``).
        dpi: resolution of the pre-rendered images.

    Raises:
        ValueError: if there are more than ``MAX_FRAMES`` combinations.
    """
    names = list(controls)
    opts = [_options(n, controls[n]) for n in names]
    n_frames = 1
    for o in opts:
        n_frames *= len(o)
    if n_frames > MAX_FRAMES:
        raise ValueError(
            f"controls: {n_frames} combinations to pre-render, expected at most {MAX_FRAMES}"
        )
    frames = {}
    for idx in itertools.product(*(range(len(o)) for o in opts)):
        values = {n: opts[i][j][1] for i, (n, j) in enumerate(zip(names, idx))}
        fig = fn(**values)
        if alt is None and isinstance(fig, Figure):
            alt = alt_text(fig)
        frames["-".join(map(str, idx))] = _png(fig, dpi)
        plt.close(fig)  # else Jupyter shows every pre-rendered figure below the view
    uid = "tc-" + uuid.uuid4().hex[:10]
    parts = []
    for i, (name, o) in enumerate(zip(names, opts)):
        numeric = all(isinstance(v, Number) for _, v in o) and len(o) > 1
        label = html.escape(name)
        if numeric:
            parts.append(
                f'<label>{label} <input type="range" min="0" max="{len(o) - 1}" '
                f'step="1" value="0" data-control="{i}" aria-label="{label}"> '
                f'<span class="tc-value"></span></label>'
            )
        else:
            items = "".join(
                f'<option value="{j}">{html.escape(lab)}</option>'
                for j, (lab, _) in enumerate(o)
            )
            parts.append(
                f'<label>{label} <select data-control="{i}" aria-label="{label}">'
                f"{items}</select></label>"
            )
    labels = [[lab for lab, _ in o] for o in opts]
    first = frames["-".join("0" for _ in names)]
    return f"""<div class="tc-interactive" id="{uid}">
<div class="tc-controls" style="display:flex;gap:1.5em;flex-wrap:wrap;margin-bottom:.5em">
{"".join(parts)}</div>
<img class="tc-frame" alt="{html.escape(alt)}" src="{first}" style="max-width:100%">
</div>
<script>
(function () {{
  const root = document.getElementById("{uid}");
  const frames = {json.dumps(frames)};
  const labels = {json.dumps(labels)};
  const controls = Array.from(root.querySelectorAll("[data-control]"));
  function update() {{
    controls.forEach(function (c, i) {{
      const out = c.parentElement.querySelector(".tc-value");
      if (out) out.textContent = labels[i][c.value];
    }});
    root.querySelector("img.tc-frame").src =
      frames[controls.map(function (c) {{ return c.value; }}).join("-")];
  }}
  controls.forEach(function (c) {{ c.addEventListener("input", update); }});
  update();
}})();
</script>"""


def interactive(
    fn: Callable[..., Figure],
    *,
    alt: str | None = None,
    dpi: int = 72,
    **controls,
):
    """Show ``fn`` with one control per keyword argument, live or pre-rendered.

    Args:
        fn: called as ``fn(**values)``; must return a matplotlib Figure.
        alt: alt text for the static image (what the figure shows); default:
            described from the first figure's titles and axis labels.
        dpi: resolution of pre-rendered images (static mode only).
        **controls: name -> list of values (numbers give a slider, other values a
            menu), or dict label -> value.

    Returns:
        In a live kernel, the ipywidgets container (displayed by Jupyter). In static
        mode (``static_mode()``), an ``IPython.display.HTML`` with the pre-rendered
        view, which keeps working without a kernel.

    Raises:
        TypeError: if a control is not a list or dict, or ``fn`` returns no Figure.
        ValueError: for an empty control or too many combinations to pre-render.

    Example:
        >>> interactive(lambda temperature: plot(temperature), temperature=[0.5, 1, 2])
    """
    if not controls:
        raise ValueError("controls: expected at least one keyword control, got none")
    if static_mode():
        return HTML(static_html(fn, controls, alt=alt, dpi=dpi))
    import ipywidgets as widgets

    made = {}
    for name, values in controls.items():
        opts = _options(name, values)
        if all(isinstance(v, Number) for _, v in opts) and len(opts) > 1:
            made[name] = widgets.SelectionSlider(options=opts, description=name)
        else:
            made[name] = widgets.Dropdown(options=opts, description=name)

    def show(**values):
        fig = fn(**values)
        display(fig)
        if isinstance(fig, Figure):
            plt.close(fig)  # shown in the view only, not again below the cell

    out = widgets.interactive_output(show, made)
    return widgets.VBox([widgets.HBox(list(made.values())), out])
