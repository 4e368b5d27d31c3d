"""A chapter cell that raises must fail the book build, and the log must name the
chapter. Builds a one-chapter copy of this book's configuration in a temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT = (ROOT / "book" / "01_qkv.md").read_text().split("---\n")[1]


def _book(tmp_path: Path, cell: str) -> Path:
    (tmp_path / "book" / "_static" / "vendor_root").mkdir(parents=True)
    shutil.copy(ROOT / "_config.yml", tmp_path)
    shutil.copytree(ROOT / "book" / "_ext", tmp_path / "book" / "_ext")
    for name in ("references.bib", "favicon.svg"):
        shutil.copy(ROOT / "book" / name, tmp_path / "book" / name)
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n  - file: book/99_broken\n"
    )
    (tmp_path / "book" / "intro.md").write_text("# Intro\n\nText.\n")
    (tmp_path / "book" / "99_broken.md").write_text(
        f"---\n{FRONT}---\n\n# Broken\n\n```{{code-cell}} ipython3\n{cell}\n```\n"
    )
    return tmp_path


def _build(path: Path) -> subprocess.CompletedProcess:
    jb = Path(sys.executable).parent / "jupyter-book"
    return subprocess.run(
        [str(jb), "build", str(path), "-W", "-n", "--keep-going", "--builder", "html"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "TRANSFORMER_COURSE_STATIC": "1"},
    )


@pytest.mark.parametrize(
    "cell, ok", [("1 / 0", False), ("print(1 + 1)", True)], ids=["raises", "fine"]
)
def test_a_raising_cell_fails_the_build_and_names_the_chapter(tmp_path, cell, ok):
    result = _build(_book(tmp_path, cell))
    log = result.stdout + result.stderr
    if ok:
        assert result.returncode == 0, log[-3000:]
    else:
        assert result.returncode != 0
        assert "99_broken" in log and "ZeroDivisionError" in log
