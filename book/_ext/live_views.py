"""The live views' model files in the site (issue 45; ``transformer_course.viz.live``).

A chapter cell that shows a live view writes its ONNX files and vocab.json into
``_build/.live/<name>-<hash16>/`` (``transformer_course.export``) and emits a
``div.live-view`` whose ``data-live-config`` names them relative to the site's
``_static/live/``. This extension:

- adds ``<meta name="course-live-root" content="REL">`` to every page, REL the relative
  URL from the page to the English build's ``_static/live/`` (a Chinese page, served from
  ``zh/``, points one folder further up: the files are copied once, for both editions);
- after the build, reads every written page's live-view configs and, in the English
  build, copies the ``.onnx`` files and vocab.json they name (not state_dict.pt or
  config.json, which are for the tests) into ``<outdir>/_static/live/``;
- fails the build, naming the page and the file, when a config names a file missing
  from ``_build/.live`` (e.g. a chapter taken from the execution cache after the folder
  was deleted: delete ``_build/.jupyter_cache`` to execute it again).

The folder of the exports follows ``transformer_course.export.live_dir()``
(``$TRANSFORMER_COURSE_LIVE_DIR`` overrides it), as in the chapters' kernels.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

from sphinx.errors import ExtensionError

LIVE = "_static/live/"
SERVED = (".onnx", "vocab.json")
_CONFIG = re.compile(r'class="live-view"[^>]*?data-live-config="([^"]*)"')


def _is_chinese(app) -> bool:
    return (app.config.language or "").replace("-", "_") == "zh_CN"


def live_root(pagename: str, chinese: bool) -> str:
    """The relative URL from page ``pagename`` to the English build's _static/live/."""
    depth = pagename.count("/") + (1 if chinese else 0)
    return "../" * depth + LIVE


def _add_meta(app, pagename, templatename, context, doctree):
    root = live_root(pagename, _is_chinese(app))
    tag = f'<meta name="course-live-root" content="{html.escape(root)}">\n'
    context["metatags"] = context.get("metatags", "") + tag


def referenced(outdir: Path) -> dict[str, list[str]]:
    """Page file (relative to ``outdir``) -> the files its live views name (relative to
    _static/live/), read from the written HTML."""
    found = {}
    for page in sorted(Path(outdir).rglob("*.html")):
        text = page.read_text("utf-8", errors="replace")
        if "live-view" not in text:
            continue
        files = []
        for raw in _CONFIG.findall(text):
            config = json.loads(html.unescape(raw))
            files += [
                v for v in config.values() if isinstance(v, str) and v.endswith(SERVED)
            ]
        if files:
            found[str(page.relative_to(outdir))] = files
    return found


def publish(outdir: Path, live: Path, *, copy: bool) -> list[str]:
    """Check (and with ``copy`` copy into ``outdir/_static/live/``) every file the pages
    name; return the names. Raises ExtensionError for a missing one."""
    names = []
    for page, files in referenced(outdir).items():
        for name in files:
            source = Path(live) / name
            if ".." in Path(name).parts or not source.is_file():
                raise ExtensionError(
                    f"live_views: {page} shows a live view of {name}, but {source} does "
                    "not exist: the chapter's export did not run in this build (its "
                    "output came from the execution cache?). Delete _build/.jupyter_cache "
                    "and build again."
                )
            if copy:
                target = Path(outdir) / LIVE / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if (
                    not target.exists()
                    or target.stat().st_size != source.stat().st_size
                ):
                    shutil.copy2(source, target)
            names.append(name)
    return sorted(set(names))


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from transformer_course.export import live_dir

    names = publish(Path(app.outdir), live_dir(), copy=not _is_chinese(app))
    if names:
        where = (
            "checked (the English build serves them)" if _is_chinese(app) else "copied"
        )
        print(f"live_views: {len(names)} model file(s) {where}")


def setup(app):
    app.connect("html-page-context", _add_meta)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
