"""A build that can lie (issue 12, item 5): Jupyter Book's execution cache keys a chapter
on its own code, so after a library edit an unchanged chapter would keep the old
library's outputs. book/_ext/library_cache.py keys the cache on the library too.

Builds a one-chapter copy of this book's configuration, with its own copy of the
library, three times: fresh, unchanged (nothing executes), and after editing a library
function (the chapter executes again and the page shows the new value). Slow (three
small builds), like tests/slow/test_build_errors.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRONT = (ROOT / "book" / "01_qkv.md").read_text().split("---\n")[1]
CELL = (
    "from transformer_course.training import noam_lr\nprint('lr =', noam_lr(4, 16, 4))"
)
RETURN = "    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)\n"


def _book(tmp_path: Path) -> Path:
    (tmp_path / "book" / "_static" / "vendor_root").mkdir(parents=True)
    shutil.copy(ROOT / "_config.yml", tmp_path)
    shutil.copytree(ROOT / "book" / "_ext", tmp_path / "book" / "_ext")
    shutil.copytree(
        ROOT / "src" / "transformer_course",
        tmp_path / "src" / "transformer_course",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("references.bib", "favicon.svg"):
        shutil.copy(ROOT / "book" / name, tmp_path / "book" / name)
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n  - file: book/99_lib\n"
    )
    (tmp_path / "book" / "intro.md").write_text("# Intro\n\nText.\n")
    (tmp_path / "book" / "99_lib.md").write_text(
        f"---\n{FRONT}---\n\n# Library\n\n```{{code-cell}} ipython3\n{CELL}\n```\n"
    )
    return tmp_path


def _build(path: Path) -> str:
    jb = Path(sys.executable).parent / "jupyter-book"
    env = {
        **os.environ,
        "TRANSFORMER_COURSE_STATIC": "1",
        "PYTHONPATH": str(path / "src"),
    }  # the chapters import this copy
    result = subprocess.run(
        [str(jb), "build", str(path), "-W", "-n", "--keep-going", "--builder", "html"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    return log


def _printed(path: Path) -> list[str]:
    page = (path / "_build" / "html" / "book" / "99_lib.html").read_text()
    return re.findall(r"lr = ([0-9.]+)", page)


def test_a_library_edit_reexecutes_the_chapters(tmp_path):
    book = _book(tmp_path)
    log = _build(book)
    assert "Executed notebook" in log
    assert _printed(book) == ["0.125"]  # 16^-0.5 * min(4^-0.5, 4 * 4^-1.5)
    # the log lists each chapter's execution time (issue 14)
    assert re.search(r"book/99_lib +[0-9]+\.[0-9] +executed\n", log), log[-2000:]
    assert "1 chapter(s) executed in this build" in log

    log = _build(book)  # nothing changed: nothing executes
    assert "Executed notebook" not in log
    assert re.search(r"book/99_lib +[0-9]+\.[0-9] +from the cache", log), log[-2000:]
    assert "0 chapter(s) executed in this build: 0.0 s" in log

    module = book / "src" / "transformer_course" / "training.py"
    source = module.read_text()
    assert RETURN in source, "noam_lr changed: update this test's edit"
    module.write_text(source.replace(RETURN, RETURN.replace("return ", "return 2 * ")))
    log = _build(book)
    assert "Executed notebook" in log
    assert _printed(book) == ["0.25"], "the page shows the old library's output"
    assert "1 chapter(s) executed in this build" in log
    caches = sorted(
        p.name
        for p in (book / "_build" / ".jupyter_cache").iterdir()
        if p.name.startswith("library-")
    )
    assert len(caches) == 1  # the old library's cache is gone
