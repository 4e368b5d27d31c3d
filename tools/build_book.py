"""Build the book the way ``jupyter-book build`` does, reading (and so executing) the
chapters on every core: ``make book`` runs this.

    python tools/build_book.py [jupyter-book build options] [--jobs N]

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
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


ROOT = Path(__file__).resolve().parents[1]
TIMES = ROOT / "_build" / ".jupyter_cache" / "execution-times.json"


def longest_first(docnames: list[str]) -> list[str]:
    """The pages ordered by their expected execution time, longest first."""
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}

    def cost(doc: str) -> tuple[float, int]:
        source = ROOT / f"{doc}.md"
        return (times.get(doc, 0.0), source.stat().st_size if source.exists() else 0)

    return sorted(docnames, key=cost, reverse=True)


def one_page_per_chunk(arguments, nproc: int, maxbatch: int = 10) -> list[list[str]]:
    """Replaces sphinx.util.parallel.make_chunks: one page a chunk, longest first."""
    return [[doc] for doc in longest_first(list(arguments))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--jobs", type=int, default=None)
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
    jupyter_book_cli(["build", *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
