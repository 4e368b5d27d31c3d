"""The live views' model files in the site (issue 45; ``transformer_course.viz.live``).

A chapter cell that shows a live view writes its ONNX files and vocab.json into
``_build/.live/<name>-<hash16>/`` (``transformer_course.export``) and emits a
``div.live-view`` whose ``data-live-config`` names them relative to the site's
``_static/live/``. This extension:

- adds ``<meta name="course-live-root" content="REL">`` to every page, REL the relative
  URL from the page to the English build's ``_static/live/`` (a Chinese page, served from
  ``zh/``, points one folder further up: the files are copied once, for both editions);
- after the build, reads every written page's live-view configs and copies the ``.onnx``
  files and vocab.json they name (not state_dict.pt or config.json, which are for the
  tests) into the English site's ``_static/live/`` (the Chinese build, whose outdir is
  the English site's ``zh/``, copies into the same folder: its pages may name another
  export when its chapters executed apart from the English ones); the English build,
  which runs first, removes the folders there that none of its pages names, and the
  Chinese build removes its own copy of onnxruntime-web (14 MB: its pages load the
  English site's, next to the models);
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
RUNTIME = "_static/vendor/onnxruntime"  # onnxruntime-web, copied by make book
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


def referenced(outdir: Path, skip: Path | None = None) -> dict[str, list[str]]:
    """Page file (relative to ``outdir``) -> the files its live views name (relative to
    _static/live/), read from the written HTML; pages under ``skip`` (the Chinese
    edition inside the English site) are not read."""
    found = {}
    for page in sorted(Path(outdir).rglob("*.html")):
        if skip is not None and page.is_relative_to(skip):
            continue
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


def publish(outdir: Path, live: Path, *, chinese: bool) -> list[str]:
    """Check every file the pages of ``outdir`` name and copy it into the English site's
    _static/live/ (``outdir`` itself, or its parent for the Chinese edition); return the
    names. The English build also removes the folders there its pages do not name.
    Raises ExtensionError for a missing one."""
    outdir = Path(outdir)
    site = outdir.parent if chinese else outdir
    names = []
    pages = referenced(outdir, skip=None if chinese else outdir / "zh")
    for page, files in pages.items():
        for name in files:
            source = Path(live) / name
            if ".." in Path(name).parts or not source.is_file():
                raise ExtensionError(
                    f"live_views: {page} shows a live view of {name}, but {source} does "
                    "not exist: the chapter's export did not run in this build (its "
                    "output came from the execution cache?). Delete _build/.jupyter_cache "
                    "and build again."
                )
            target = site / LIVE / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.stat().st_size != source.stat().st_size:
                shutil.copy2(source, target)
            names.append(name)
    if not chinese and (site / LIVE).is_dir():
        kept = {Path(name).parts[0] for name in names}
        for folder in (site / LIVE).iterdir():
            if folder.name not in kept:
                shutil.rmtree(folder) if folder.is_dir() else folder.unlink()
    return sorted(set(names))


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from transformer_course.export import live_dir

    names = publish(Path(app.outdir), live_dir(), chinese=_is_chinese(app))
    if _is_chinese(app):  # its pages load the English site's copy (course-live-root)
        shutil.rmtree(Path(app.outdir) / RUNTIME, ignore_errors=True)
    if names:
        print(f"live_views: {len(names)} model file(s) in the site's {LIVE}")


def setup(app):
    app.connect("html-page-context", _add_meta)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
