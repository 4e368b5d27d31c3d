"""Instructor workflow on otter-grader (book/instructor_guide.md).

    python tools/assignments.py assign [--chapters 01 2 ch05 masks ...] [--only LABEL ...]
                                       [--points LABEL=N ...] [--edition en|zh]
                                       [--out dist/assignments] [--no-run-tests]
    python tools/assignments.py grade SUBMISSIONS [--sandbox auto|bwrap|none]
                                      [--assignments dist/assignments] [--out DIR]
                                      [--assignment NAME] [--timeout 600]
                                      [--call-timeout 60] [--memory 4096] [--jobs 1]

(``python -m course_grading ...`` with tools/ on PYTHONPATH is the same.)
"""

from __future__ import annotations

import argparse
import sys

from course_grading.assign import ROOT, assign
from course_grading.grade import grade
from course_grading.sandbox import BACKENDS


def _positive(kind: type) -> type:
    """An argparse type: a number of ``kind`` > 0 (argparse then says "invalid
    value" in one line, instead of a traceback from deep in the grader)."""

    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise ValueError(text)
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build and grade otter assignments.")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assign", help="build dist/assignments/<chapter>/")
    a.add_argument(
        "--chapters",
        nargs="*",
        help="chapter numbers (2, 02, ch02) or names (02_scaled_dot_product, "
        "scaled_dot_product) or a unique prefix of one (default: all)",
    )
    a.add_argument(
        "--only", nargs="*", help="exercise labels to include (default: all)"
    )
    a.add_argument(
        "--points", nargs="*", help="LABEL=N, points of one exercise (default 1)"
    )
    a.add_argument(
        "--out",
        help="where the assignments go (default dist/assignments; "
        "dist/assignments-zh for --edition zh)",
    )
    a.add_argument(
        "--edition",
        choices=("en", "zh"),
        default="en",
        help="the chapters the handouts are made of: book/ (en) or book/zh/ (zh: "
        "Chinese text and Chinese self-check messages)",
    )
    a.add_argument(
        "--no-run-tests",
        action="store_true",
        help="skip otter's run of the reference solutions",
    )
    g = sub.add_parser("grade", help="grade a folder of submitted notebooks or zips")
    g.add_argument("submissions")
    g.add_argument(
        "--assignments",
        default=str(ROOT / "dist" / "assignments"),
        help="the folder `assign` wrote (default dist/assignments)",
    )
    g.add_argument(
        "--assignment", help="assignment of notebooks without otter metadata"
    )
    g.add_argument("--out", help="results folder (default dist/grades/<time>)")
    g.add_argument(
        "--sandbox",
        choices=BACKENDS,
        default="auto",
        help="where the learners' code runs: bubblewrap (auto: refuses when it "
        "cannot run here) or none (unconfined; every grades file says so)",
    )
    g.add_argument(
        "--timeout",
        type=_positive(float),
        default=600,
        help="seconds for one submission's otter run (and for its re-check)",
    )
    g.add_argument(
        "--call-timeout",
        type=_positive(float),
        default=60,
        help="seconds for one call of a learner's function in the re-check",
    )
    g.add_argument(
        "--memory",
        type=_positive(int),
        default=4096,
        help="MiB of address space for each process of the learner's code",
    )
    g.add_argument(
        "--jobs", type=_positive(int), default=1, help="submissions graded at once"
    )
    args = parser.parse_args(argv)
    return assign(args) if args.command == "assign" else grade(args)


if __name__ == "__main__":
    sys.exit(main())
