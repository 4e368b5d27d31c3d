"""Execute one chapter (book/NN_name.md) the way the book build does, and time it.

    python tools/run_chapter.py book/01_qkv.md [--out /tmp/01_qkv.ipynb] [--cells 10]

Runs in book/ with TRANSFORMER_COURSE_STATIC=1 (pre-rendered interactive views), stops
at the first cell that raises and names the chapter and cell. Prints the wall time,
and with ``--cells N`` the N slowest cells (seconds, cell number, first code line), to
find where a chapter's build time goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
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
    parser.add_argument(
        "--cells", type=int, default=0, metavar="N", help="print the N slowest cells"
    )
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMER_COURSE_STATIC", "1")
    nb = jupytext.read(args.chapter)
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(args.chapter.resolve().parent)}},
    )
    start, cpu_start = time.perf_counter(), _children_cpu_seconds()
    try:
        client.execute()
    except CellExecutionError as err:
        print(f"{args.chapter}: a cell raised\n{err}", file=sys.stderr)
        return 1
    finally:
        if args.out:
            nbformat.write(nb, args.out)
    wall, cpu = time.perf_counter() - start, _children_cpu_seconds() - cpu_start
    load = (
        f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    )
    # the kernel's CPU time varies less than the wall time on a shared machine
    print(f"{args.chapter}: executed in {wall:.1f} s (kernel CPU {cpu:.1f} s{load})")
    if args.cells:
        _print_slowest(nb, args.cells)
    return 0


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's finished children (the kernel)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cell_seconds(cell) -> float:
    """Seconds between the kernel starting a cell and its reply (nbclient's timing)."""
    timing = cell.get("metadata", {}).get("execution", {})
    began, ended = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (began and ended):
        return 0.0
    parse = datetime.fromisoformat
    return (
        parse(ended.replace("Z", "+00:00")) - parse(began.replace("Z", "+00:00"))
    ).total_seconds()


def _print_slowest(nb, count: int) -> None:
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    timed = sorted(
        ((_cell_seconds(c), n, c) for n, (_, c) in enumerate(code, 1)),
        key=lambda t: -t[0],
    )
    print(f"slowest {min(count, len(timed))} of {len(timed)} code cells:")
    for seconds, number, cell in timed[:count]:
        lines = [
            x for x in cell.source.splitlines() if x.strip() and not x.startswith("#")
        ]
        print(f"  {seconds:6.1f} s  cell {number:3d}  {(lines or [''])[0][:60]}")


if __name__ == "__main__":
    sys.exit(main())
