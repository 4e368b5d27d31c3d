"""Execute one chapter (book/NN_name.md) the way the book build does, and time it.

    python tools/run_chapter.py book/01_qkv.md [--out /tmp/01_qkv.ipynb]

Runs in book/ with TRANSFORMER_COURSE_STATIC=1 (pre-rendered interactive views), stops
at the first cell that raises and names the chapter and cell. Prints the wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chapter", type=Path)
    parser.add_argument("--out", type=Path, help="where to save the executed notebook")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMER_COURSE_STATIC", "1")
    nb = jupytext.read(args.chapter)
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(args.chapter.resolve().parent)}},
    )
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as err:
        print(f"{args.chapter}: a cell raised\n{err}", file=sys.stderr)
        return 1
    finally:
        if args.out:
            nbformat.write(nb, args.out)
    print(f"{args.chapter}: executed in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
