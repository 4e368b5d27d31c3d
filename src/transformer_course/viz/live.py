"""Live views: the reader's own input through the course's real models, in the browser.

``live_view(kind, config, fallback)`` returns the markup the site's ``live.js`` turns into a
view the reader drives (a text box, layer and head menus, heatmaps drawn from the numbers
an ONNX model computes in the page with onnxruntime-web)::

    <div class="live-view" data-live-kind="minilm" data-live-config='{...}'>
      <div class="live-fallback"> today's pre-rendered view </div>
    </div>

Without JavaScript (and in Jupyter or Colab, where ``live.js`` is not loaded) only the
fallback shows, so a chapter keeps its pre-rendered figure or animation. The model files
named in ``config`` are written by ``transformer_course.export``; the book's Sphinx
extension ``live_views`` copies them into the site. ``live_view_of(module, ...)`` does both
steps in one call: it exports the module and returns the view.
"""

from __future__ import annotations

import html
import json
import math
from numbers import Number

from IPython.display import HTML
from matplotlib.figure import Figure

KINDS = ("lookup", "minilm", "translator")

# The keys each kind's config must have (the browser reads them; see LIVE_CONTRACT).
REQUIRED_KEYS = {
    "lookup": ("query", "keys", "values", "key_labels", "scale"),
    "minilm": ("model", "vocab", "n_layers", "n_heads", "max_len", "example"),
    "translator": (
        "encoder",
        "decoder",
        "vocab",
        "n_layers",
        "n_heads",
        "bos_id",
        "eos_id",
        "pad_id",
        "max_len",
        "example",
    ),
}


def fallback_html(fallback) -> str:
    """The HTML of a chapter's pre-rendered view.

    Args:
        fallback: a matplotlib ``Figure`` (shown as a PNG ``<img>`` with its alt text), a
            matplotlib ``Animation`` (the course's JS player, ``viz.animation_html``), an
            object with ``_repr_html_`` (``IPython.display.HTML``, a ``viz.diagram``, the
            result of ``viz.interactive`` in static mode) or a ``str`` of HTML.

    Returns:
        str: HTML markup.

    Raises:
        TypeError: for any other object (e.g. ``None``, a tensor).
    """
    from matplotlib.animation import Animation

    if isinstance(fallback, str):
        return fallback
    if isinstance(fallback, Figure):
        from transformer_course.viz.plots import figure_html

        return figure_html(fallback)
    if isinstance(fallback, Animation):
        from transformer_course.viz.animations import animation_html

        return animation_html(fallback)._repr_html_() or ""
    if hasattr(fallback, "_repr_html_"):
        out = fallback._repr_html_()
        if isinstance(out, tuple):  # (html, metadata)
            out = out[0]
        if isinstance(out, str):
            return out
    raise TypeError(
        "fallback: expected a matplotlib Figure or Animation, an object with _repr_html_ "
        f"(IPython HTML, a diagram) or an HTML str, got {type(fallback).__name__}"
    )


def _check_config(kind: str, config) -> dict:
    if not isinstance(config, dict):
        raise TypeError(f"config: expected a dict, got {type(config).__name__}")
    missing = [k for k in REQUIRED_KEYS[kind] if k not in config]
    if missing:
        raise ValueError(
            f"config: a {kind!r} view needs the keys {list(REQUIRED_KEYS[kind])}, "
            f"missing {missing}"
        )
    if kind == "lookup":
        _check_lookup(config)
    try:
        text = json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"config: expected JSON-serialisable finite values ({err})"
        ) from err
    return json.loads(text)


def _check_lookup(config: dict) -> None:
    q, keys, values = config["query"], config["keys"], config["values"]

    def vector(name, v):
        if not isinstance(v, (list, tuple)) or not all(
            isinstance(x, Number) and not isinstance(x, bool) for x in v
        ):
            raise TypeError(f"config[{name!r}]: expected a list of numbers, got {v!r}")

    vector("query", q)
    if not keys:
        raise ValueError("config['keys']: expected at least one key, got none")
    for i, k in enumerate(keys):
        vector(f"keys[{i}]", k)
        if len(k) != len(q):
            raise ValueError(
                f"config['keys'][{i}]: expected d_k = len(query) = {len(q)} numbers, "
                f"got {len(k)}"
            )
    if len(values) != len(keys):
        raise ValueError(
            f"config['values']: expected one value per key ({len(keys)}), got {len(values)}"
        )
    for i, v in enumerate(values):
        vector(f"values[{i}]", v)
    if len(config["key_labels"]) != len(keys):
        raise ValueError(
            f"config['key_labels']: expected one label per key ({len(keys)}), "
            f"got {len(config['key_labels'])}"
        )
    scale = config["scale"]
    if (
        not isinstance(scale, Number)
        or isinstance(scale, bool)
        or not math.isfinite(scale)
    ):
        raise TypeError(f"config['scale']: expected a finite number, got {scale!r}")


def live_view_html(kind: str, config: dict, fallback) -> str:
    """The markup of a live view (a str); see ``live_view``."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {list(KINDS)}, got {kind!r}")
    data = _check_config(kind, config)
    inner = fallback_html(fallback)
    # html.escape(quote=True) escapes ' and ", so the JSON sits safely in a quoted attribute.
    attr = html.escape(
        json.dumps(data, ensure_ascii=False, separators=(",", ":")), quote=True
    )
    return (
        f'<div class="live-view" data-live-kind="{kind}" data-live-config="{attr}">\n'
        f'<div class="live-fallback">\n{inner}\n</div>\n</div>'
    )


def live_view(kind: str, config: dict, fallback) -> HTML:
    """A view the reader drives in the browser, with a pre-rendered fallback.

    Args:
        kind: "lookup" (chapters 1-2: the soft lookup computed in JavaScript, no model),
            "minilm" (chapter 3: MiniLM's attention on the reader's sentence) or
            "translator" (chapter 6: the translator decoding the reader's number).
        config: the JSON the browser reads (keys per kind in ``REQUIRED_KEYS``; model
            paths relative to the site's ``_static/live/``). For "lookup": ``query``
            (d_k floats), ``keys`` (n x d_k), ``values`` (n x d_v), ``key_labels`` (n
            str) and ``scale`` (1/sqrt(d_k)). For "minilm"/"translator" use the
            ``config`` of ``transformer_course.export.export_minilm``/
            ``export_translator``.
        fallback: the view shown before the model loads and without JavaScript (see
            ``fallback_html`` for the accepted types).

    Returns:
        ``IPython.display.HTML``: ``div.live-view`` with ``data-live-kind``,
        ``data-live-config`` (the JSON) and a ``div.live-fallback`` inside.

    Raises:
        ValueError: for an unknown kind, a config missing a key or with NaN/inf, a lookup
            whose keys and query differ in length.
        TypeError: for a config that is not a dict or a fallback of another type.
    """
    return HTML(live_view_html(kind, config, fallback))


def live_view_of(
    module, tokenizer_or_data, fallback, *, example: str | None = None, out_dir=None
):
    """Export ``module`` to ONNX and return its live view: the one call a chapter makes.

    Args:
        module: a ``pretrained.MiniLMEncoder`` (kind "minilm") or a ``model.Transformer``
            trained on the number translation task (kind "translator").
        tokenizer_or_data: for MiniLM, its tokenizer (None: the shipped one; see
            ``export.export_minilm``); for the translator, its
            ``translation_data.TranslationData`` (the vocabularies).
        fallback: the pre-rendered view (see ``fallback_html``).
        example: the text first shown in the text box (default: the export's).
        out_dir: the exports' base folder (default ``export.live_dir()``).

    Returns:
        In the book build (``viz.static_mode()``): ``IPython.display.HTML`` (see
        ``live_view``), the exported files in the folder ``config`` names. In a live
        kernel (Jupyter, Colab), where no ``live.js`` runs the view: ``fallback`` itself,
        unchanged (an ``interactive`` view stays live), and nothing is exported.

    Raises:
        TypeError: if ``module`` is neither kind. ImportError: without the package
            ``onnx`` (``pip install transformer-course[live]``).
    """
    from transformer_course import export
    from transformer_course.viz.interactive import static_mode

    if not static_mode():
        return fallback
    kwargs = {} if example is None else {"example": example}
    exported = export.export(module, tokenizer_or_data, out_dir, **kwargs)
    return live_view(exported.kind, exported.config, fallback)
