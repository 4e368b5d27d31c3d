"""The student notebook as it is handed out: its public tests travel inside it."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

INIT_CELL = """# Initialize Otter. This writes the public tests next to the notebook, so that
# grader.check works in Colab and whatever this file is called.
import pathlib

import otter

PUBLIC_TESTS = {tests!r}
pathlib.Path("public_tests").mkdir(exist_ok=True)
for _name, _text in PUBLIC_TESTS.items():
    pathlib.Path("public_tests", _name).write_text(_text, encoding="utf-8")
grader = otter.Notebook(tests_dir="public_tests")"""


def embed_public_tests(student: Path) -> None:
    """Moves the public test files otter wrote into the student notebook's init cell
    (otter refuses tests kept in notebook metadata in Colab, and needs the notebook's
    file name for them); the notebook alone is the handout."""
    folder = student.parent / "tests"
    tests = {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))}
    nb = nbformat.read(student, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "otter.Notebook(" in cell.source:
            cell.source = INIT_CELL.format(tests=tests)
        if cell.cell_type == "markdown" and "generate a zip file" in cell.source:
            cell.source += (
                "\n\nIn Colab, otter cannot export: download this notebook "
                "(File -> Download -> Download .ipynb) and hand in that file."
            )
    nbformat.write(nb, student)
    shutil.rmtree(folder)
