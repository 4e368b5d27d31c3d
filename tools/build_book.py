"""Build the book the way ``jupyter-book build`` does, reading (and so executing) the
chapters on every core: ``make book`` runs this.

    python tools/build_book.py [jupyter-book build options] [--jobs N]
    python tools/build_book.py --edition zh [options]   # the Chinese edition, into _build/html/zh/

Jupyter Book 1.x passes Sphinx no ``-j`` (its ``build_sphinx`` has a ``jobs`` argument
that the command line never sets), so the chapters execute one after another although
Sphinx, myst-nb and every extension here are parallel-read safe. This script sets it:
Sphinx reads the pages in N processes, each executing its chapters (myst-nb's cache
mode executes a chapter when its page is read), and merges what they collected. Each
kernel then gets cores / N torch threads (``$OMP_NUM_THREADS``, which the chapters'
``set_cpu_threads()`` follows), so N chapters do not fight over the same cores. N is
``--jobs``, else ``$BOOK_JOBS``, else the number of usable cores.

Sphinx would cut the pages into N alphabetical chunks of equal count, so one process could
get all the long chapters; here each page is its own chunk, handed to the next free
process, longest first: by the execution times the last build recorded
(``_build/.jupyter_cache/execution-times.json``, written by ``book/_ext/library_cache.py``),
else by the size of the page's source.

``--edition zh`` builds the Chinese pages of ``book/zh/`` (their table of contents
``book/zh/_toc.yml``) with the English ``_config.yml`` plus the few Chinese settings of
``book/zh/edition.yml`` (title, ``language: zh_CN``, the footer's wording), its paths made
absolute, and the English build's execution cache (``_build/.jupyter_cache``): a Chinese
page whose code cells are byte-identical to its English page's is taken from that cache,
not executed again. Sphinx writes it to ``_build/zh/_build/html``, which is then copied to
``_build/html/zh/``, so the two editions are one site.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import yaml


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
TIMES = BUILD / ".jupyter_cache" / "execution-times.json"
ZH = ROOT / "book" / "zh"


def longest_first(docnames: list[str]) -> list[str]:
    """The pages ordered by their expected execution time, longest first."""
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}

    def cost(doc: str) -> tuple[float, int]:
        source = ROOT / f"{doc}.md"
        return (times.get(doc, 0.0), source.stat().st_size if source.exists() else 0)

    return sorted(docnames, key=cost, reverse=True)


def one_page_per_chunk(arguments, nproc: int, maxbatch: int = 10) -> list[list[str]]:
    """Replaces sphinx.util.parallel.make_chunks: one page a chunk, in the order that
    makes Sphinx start them longest first. Its ``ParallelTasks`` starts the first
    ``nproc`` chunks at once and then, each time a process is free, the chunk added
    *last* of those still waiting (``dict.popitem()``, last in first out): handed the
    pages longest first, it started every other page shortest first and left the two
    longest after chapter 6 and 7 for the end, about a minute more of the build on
    two cores. So the first ``nproc`` are the longest and the rest follow shortest
    first (tests/sources/test_editions.py runs Sphinx's own ``ParallelTasks``)."""
    pages = [[doc] for doc in longest_first(list(arguments))]
    return pages[:nproc] + pages[nproc:][::-1]


def _absolute(path: str) -> str:
    return str((ROOT / path).resolve())


def chinese_config(english: dict, chinese: dict) -> dict:
    """The Chinese edition's Jupyter Book configuration: the English one with the
    settings of ``book/zh/edition.yml`` on top, every path absolute (the Chinese
    book's folder is ``book/zh/``, not the root) and the English execution cache."""
    config = json.loads(json.dumps(english))  # a deep copy
    config.update({k: v for k, v in chinese.items() if k not in ("sphinx", "html")})
    config["html"].update(chinese.get("html", {}))  # e.g. the footer's wording
    config["exclude_patterns"] = ["**.ipynb_checkpoints", "_build"]
    config["html"]["favicon"] = _absolute(config["html"]["favicon"])
    config["bibtex_bibfiles"] = [_absolute(p) for p in config["bibtex_bibfiles"]]
    sphinx = config["sphinx"]
    sphinx["local_extensions"] = {
        name: _absolute(path) for name, path in sphinx["local_extensions"].items()
    }
    sphinx["config"]["html_static_path"] = [
        _absolute(p) for p in sphinx["config"]["html_static_path"]
    ]
    sphinx["config"].update(chinese.get("sphinx", {}).get("config", {}))
    config["execute"]["cache"] = str(BUILD / ".jupyter_cache")
    return config


def chinese_arguments(rest: list[str]) -> list[str]:
    """jupyter-book build arguments for the Chinese edition (its config generated
    into _build/zh/_config.yml)."""
    english = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    chinese = yaml.safe_load((ZH / "edition.yml").read_text(encoding="utf-8"))
    out = BUILD / "zh"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "_config.yml"
    text = yaml.safe_dump(chinese_config(english, chinese), allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    options = [a for a in rest if a != "."]
    return [str(ZH), "--config", str(path), "--toc", str(ZH / "_toc.yml"),
            "--path-output", str(out), *options]  # fmt: skip


def publish_chinese() -> None:
    """Copy the Chinese site into the English one's zh/ folder."""
    built, target = BUILD / "zh" / "_build" / "html", BUILD / "html" / "zh"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(built, target)
    print(f"build_book: the Chinese edition is in {target}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--edition", choices=("en", "zh"), default="en")
    args, rest = parser.parse_known_args(argv)
    jobs = args.jobs or int(os.environ.get("BOOK_JOBS", "0")) or usable_cores()
    if jobs < 1:
        raise SystemExit(f"--jobs: expected an int >= 1, got {jobs}")
    # The site's pre-rendered figures and views (viz.plots, viz.interactive), as
    # `make book` sets it: a build run by hand must not publish live-widget outputs.
    os.environ.setdefault("TRANSFORMER_COURSE_STATIC", "1")
    if jobs > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // jobs)))
    print(
        f"build_book: {jobs} Sphinx process(es), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        flush=True,
    )

    import sphinx.builders
    from jupyter_book import sphinx as jb_sphinx
    from jupyter_book.cli.main import main as jupyter_book_cli

    # the command line imports build_sphinx from this module when it runs
    jb_sphinx.build_sphinx = functools.partial(jb_sphinx.build_sphinx, jobs=jobs)
    sphinx.builders.make_chunks = one_page_per_chunk  # Builder._read_parallel uses it
    start = time.perf_counter()
    try:
        if args.edition == "en":
            jupyter_book_cli(["build", *rest])
            return
        try:
            jupyter_book_cli(["build", *chinese_arguments(rest)])
        except SystemExit as done:  # click exits, also on success
            if done.code not in (0, None):
                raise
        publish_chinese()
    finally:  # where the book's build time goes: each edition's own line in the log
        edition = {"en": "English", "zh": "Chinese"}[args.edition]
        print(
            f"build_book: the {edition} edition took "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
