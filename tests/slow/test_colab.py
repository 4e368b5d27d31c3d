"""Learners in Colab, simulated (tools/colab_sim.py): each chapter's generated notebook,
alone in an empty folder outside the repository, runs top to bottom in a fresh
environment with only what Colab preinstalls (torch, numpy, matplotlib, seaborn,
ipywidgets) plus what its own first cell installs from a snapshot of this repository.

Slow (minutes a chapter on 2 CPU cores): marked ``colab``; the variable
TRANSFORMER_COURSE_COLAB_CHAPTERS (comma-separated) limits it to some chapters. The
environment is cached between runs under ~/.cache/transformer_course/colab-sim/ (keyed
on the pins).
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import colab_sim

# One xdist worker runs them all: the simulation builds its environment once a session.
pytestmark = [pytest.mark.colab, pytest.mark.xdist_group("colab")]

CHAPTERS = [
    c for c in colab_sim.toc_chapters() if (ROOT / "notebooks" / f"{c}.ipynb").exists()
]
# Optionally only some chapters, e.g. TRANSFORMER_COURSE_COLAB_CHAPTERS=01_qkv,05_masks
ONLY = os.environ.get("TRANSFORMER_COURSE_COLAB_CHAPTERS", "")
RUN = [c for c in CHAPTERS if not ONLY or c in ONLY.split(",")]


@pytest.fixture(scope="module")
def sim():
    simulation = colab_sim.Simulation()
    yield simulation
    simulation.close()


def test_the_wheel_holds_every_module(sim):
    names = set(zipfile.ZipFile(sim.wheel).namelist())
    package = ROOT / "src" / "transformer_course"
    files = [
        *package.rglob("*.py"),
        *package.rglob("*.safetensors"),
    ]  # + chapter 9's student
    assert any(path.suffix == ".safetensors" for path in files)
    for path in files:
        rel = path.relative_to(ROOT / "src").as_posix()
        assert rel in names, f"{sim.wheel.name} lacks {rel}"


def test_install_cell_targets_the_configured_repository():
    url, branch = colab_sim.repository()
    for name in CHAPTERS:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        first = nb.cells[0].source
        assert f"git+{url}@{branch}" in first, (
            f"{name}: first cell does not install {url}"
        )


@pytest.mark.parametrize("name", RUN)
def test_chapter_runs_in_colab_without_the_repository(sim, name):
    result = sim.run(ROOT / "notebooks" / f"{name}.ipynb")
    print(f"{name}: {result.seconds:.0f} s")
    assert result.ok, f"{name} failed in the Colab simulation:\n{result.error}"


def test_a_notebook_that_needs_the_repository_fails(sim, tmp_path):
    """The check can fail: the environment does not hold the package until a notebook
    installs it, and the repository is not reachable from the notebook's folder."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import importlib.util\n"
            "assert importlib.util.find_spec('transformer_course') is None, 'leaked'\n"
            "open('../book/01_qkv.md').read()"
        )
    ]
    path = tmp_path / "needs_repo.ipynb"
    nbformat.write(nb, path)
    result = sim.run(path, timeout=120)
    assert not result.ok
    assert re.search(r"FileNotFoundError", result.error), result.error
