"""Sphinx extension: chapters re-execute when the library they import changes.

Jupyter Book's execution cache (``execute_notebooks: cache``, jupyter-cache) keys each
chapter on its own code cells only. After an edit of ``src/transformer_course/`` an
unchanged chapter would keep showing the outputs of the old library, and ``-W`` would
not notice: the build would lie.

This extension hashes every file of the ``transformer_course`` package that the
chapters' kernels import (found as the kernel finds it: the same environment and
``PYTHONPATH``) and keeps one execution cache per library version:
``_build/.jupyter_cache/library-<hash>``. The hash is also a Sphinx config value
(``course_library_hash``, rebuild "env"), so when the library changes Sphinx reads
every page again and every chapter executes against the new, empty cache. With the
library unchanged, the path and the value are the same as last time and a rebuild
executes nothing. Caches of other library versions are deleted.

At the end of a build it also logs each chapter's execution time (myst-nb's own
measurement), marking the chapters taken from the cache, and the total executed in
this build: the build log then shows where the build time goes (issue 14).

The Chinese edition (``tools/build_book.py --edition zh``) is built from ``book/zh/``
into another folder but is given the English build's cache folder
(``nb_execution_cache_path``): both editions use one cache, and a Chinese page whose
code cells equal its English page's is logged "from the cache".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import time
from pathlib import Path

from sphinx.util import logging

PACKAGE = "transformer_course"
LOGGER = logging.getLogger(__name__)


def library_dir(srcdir: str | Path) -> Path | None:
    """The folder of the package the chapters import, or None if it is not found."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    local = Path(srcdir) / "src" / PACKAGE
    return local if local.is_dir() else None


def library_hash(folder: Path | None) -> str:
    """sha256 (first 16 hex digits) over the relative paths and contents of every file
    in ``folder`` except Python's byte-code caches; "none" when there is no folder."""
    if folder is None:
        return "none"
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _per_library_cache(app, config) -> None:
    folder = library_dir(app.srcdir)
    value = library_hash(folder)
    config.course_library_hash = value
    base = Path(
        config.nb_execution_cache_path or Path(app.outdir).parent / ".jupyter_cache"
    )
    cache = base / f"library-{value}"
    if base.is_dir():  # caches of other library versions can never be used again
        for old in base.glob("library-*"):
            if old != cache and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    config.nb_execution_cache_path = str(cache)
    create_cache_database(cache)
    LOGGER.info(f"{PACKAGE} {value} ({folder}): execution cache {cache}")


def create_cache_database(cache: Path) -> None:
    """Create the execution cache's database (its tables) before the pages are read.

    jupyter-cache creates it on first use, in whichever process gets there first: with
    Sphinx reading in several processes (tools/build_book.py) on a fresh clone, a second
    process finds the database file another has just created but not its tables yet,
    skips creating them, and fails with "Unexpected error accessing jupyter cache, it
    may need to be cleared" (sqlite "no such table"). Here the main process, alone,
    creates them first; the readers then only open it."""
    from jupyter_cache import get_cache

    get_cache(str(cache)).get_cache_limit()  # creates the folder, the tables, reads one


_BUILD_START: dict[int, float] = {}  # id(app) -> when the build started


def _note_start(app, config) -> None:
    _BUILD_START[id(app)] = time.time()


def execution_times(env, since: float) -> list[tuple[str, float, bool]]:
    """(docname, seconds, executed in this build) for every executed notebook, from
    myst-nb's execution data; a notebook from the cache reports the seconds it took
    when it was executed, and ``False``."""
    rows = []
    for docname, data in sorted(getattr(env, "nb_metadata", {}).items()):
        run = data.get("exec_data") or {}
        if run.get("runtime") is not None:
            rows.append((docname, float(run["runtime"]), run.get("mtime", 0) >= since))
    return rows


TIMES_FILE = "execution-times.json"  # beside the caches: what tools/build_book.py reads


def _log_execution_times(app, exception) -> None:
    if exception is not None:
        return
    rows = execution_times(app.env, _BUILD_START.get(id(app), 0.0))
    if not rows:
        return
    # the longest pages start first in the next parallel build (tools/build_book.py)
    # The Chinese edition's build shares the cache and this file: it adds its pages.
    record = Path(app.config.nb_execution_cache_path).parent / TIMES_FILE
    times = json.loads(record.read_text()) if record.exists() else {}
    times.update({doc: round(sec, 1) for doc, sec, _ in rows})
    record.write_text(json.dumps(times, indent=1, sort_keys=True))
    LOGGER.info("execution time of each chapter (seconds):")
    for docname, seconds, fresh in rows:
        how = "executed" if fresh else "from the cache (executed earlier)"
        LOGGER.info(f"  {docname:<32} {seconds:7.1f}  {how}")
    executed = sum(seconds for _, seconds, fresh in rows if fresh)
    count = sum(fresh for *_, fresh in rows)
    LOGGER.info(f"  {count} chapter(s) executed in this build: {executed:.1f} s")


# Extensions that Jupyter Book loads without declaring whether Sphinx may read and write
# pages in parallel (tools/build_book.py runs Sphinx with -j): Sphinx then falls back to
# one process with a warning, which -W makes an error. Both keep no per-page state in the
# environment: sphinx_multitoc_numbering only replaces
# TocTreeCollector.assign_section_numbers, which Sphinx calls in the main process after
# merging what the readers collected; sphinx_jupyterbook_latex adds node classes and
# transforms that act on one page at a time (and only for LaTeX).
PARALLEL_SAFE = ("sphinx_multitoc_numbering", "sphinx_jupyterbook_latex")


def _declare_parallel_safe(app, config) -> None:
    for name in PARALLEL_SAFE:
        extension = app.extensions.get(name)
        if extension is None:
            continue
        for attribute in ("parallel_read_safe", "parallel_write_safe"):
            if getattr(extension, attribute) is None:
                setattr(extension, attribute, True)


def setup(app):
    app.add_config_value("course_library_hash", "", "env")
    app.connect("config-inited", _declare_parallel_safe)
    # after myst-nb and Jupyter Book have set nb_execution_cache_path
    app.connect("config-inited", _per_library_cache, priority=900)
    app.connect("config-inited", _note_start)
    app.connect("build-finished", _log_execution_times)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
