"""A reader who cannot reach Colab (blocked from mainland China) follows a Chinese chapter
page's launch line (issue 41, item 6; book/_ext/course_site.py): download the chapter's
notebook, run the one install command, open the notebook in Jupyter, run it top to bottom.

This does exactly that for chapter 2 (a short chapter: about 10 s of execution):

1. a fresh virtual environment (``python -m venv``, no system site packages), so nothing
   of this repository's .venv helps;
2. the command of the launch line, ``course_site.local_install_command``, run as written
   with that environment's pip. Only the git clone of the repository is redirected: git's
   ``url.<snapshot>.insteadOf`` (set through GIT_CONFIG_* variables, as the Colab
   simulation does, tools/colab_sim.py) makes pip clone a snapshot of the working tree
   instead of GitHub, so the test checks the code under test and needs no GitHub. Every
   other package comes from the configured package index, with the Colab simulation's
   pip cache (warm after one run). requirements.txt's pins are passed as constraints
   (PIP_CONSTRAINT, beside the machine's own): a reader's pip takes the newest releases,
   and from PyPI that is torch's CUDA build, about 3 GB of nvidia wheels; with the pins,
   pip takes the tested versions (torch's CPU build) that lie in the local wheel cache.
   The command itself is unchanged;
3. the notebook the page links, ``notebooks/zh/02_scaled_dot_product.ipynb``, copied alone
   into an empty folder and executed by that environment's own Jupyter (``jupyter
   nbconvert --execute``, which the command installed with jupyterlab) with its kernel.
   While it runs, git's redirect points nowhere: if the notebook's install cell tried to
   install again (it must not: the package is already there), it would fail.

Checked: the command succeeds; the notebook runs without an error; its install cell
printed nothing and did not call pip; the exercise self-checks answered in Chinese.

Measured on the shared 2-core machine, 2026-12-03: 943 s with a cold pip cache for the
packages the local wheel cache lacks (jupyterlab's), most of it waiting on the index.

Cost: the full install (torch and Jupyter included) takes minutes the first time; this is
the slow tier. A cheaper check (``pip install --no-deps``) would not show that the
command's dependencies are enough to run a chapter, which is what a reader needs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import colab_sim
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "02_scaled_dot_product"
NOTEBOOK = ROOT / "notebooks" / "zh" / f"{CHAPTER}.ipynb"


def _course_site():
    spec = importlib.util.spec_from_file_location(
        "course_site", ROOT / "book" / "_ext" / "course_site.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _constraints(folder: Path) -> Path:
    """requirements.txt's exact pins, and the machine's own pip constraints."""
    pins = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if re.match(r"^[A-Za-z0-9_.-]+==[^\s;#]+$", line.strip())
    ]
    machine = Path("/etc/xdg/pip/constraints.txt")
    if machine.exists():
        pins += [
            line.strip()
            for line in machine.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
    path = folder / "constraints.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


def _environment(
    home: Path, venv: Path, clone_from: str, constraints: Path
) -> dict[str, str]:
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "VIRTUAL_ENV": str(venv),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_CACHE_DIR": str(colab_sim.cache_root() / "pip"),
        "PIP_CONSTRAINT": str(constraints),
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.{clone_from}.insteadOf",
        "GIT_CONFIG_VALUE_0": url.rstrip("/"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    for name in ("TMPDIR", "SSL_CERT_FILE"):
        env.setdefault(name, os.environ.get(name, ""))
    for name in os.environ:
        if name.startswith("PIP_"):
            env.setdefault(name, os.environ[name])
    return {k: v for k, v in env.items() if v}


@pytest.mark.slow
def test_a_chinese_chapter_runs_locally_with_the_launch_lines_command(tmp_path):
    course_site = _course_site()
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    command = shlex.split(
        course_site.local_install_command(config["url"], config["branch"])
    )
    assert command[:2] == ["pip", "install"]

    snapshot = colab_sim.snapshot(tmp_path / "snapshot")
    venv, home, work = tmp_path / "venv", tmp_path / "home", tmp_path / "download"
    home.mkdir()
    work.mkdir()
    constraints = _constraints(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", *command],
        env=_environment(home, venv, snapshot.as_uri(), constraints),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)  # "download the chapter's notebook"
    nowhere = (tmp_path / "no-repository").as_uri()
    run = subprocess.run(
        [
            str(venv / "bin" / "jupyter"),
            *["nbconvert", "--to", "notebook", "--execute", "--output", "ran.ipynb"],
            "--ExecutePreprocessor.timeout=600",
            NOTEBOOK.name,
        ],
        env=_environment(home, venv, nowhere, constraints),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    cells = json.loads((work / "ran.ipynb").read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "colab-setup" in code[0]["metadata"].get("tags", [])
    assert code[0]["outputs"] == [], code[0][
        "outputs"
    ]  # installed: the cell did nothing
    printed = "".join(
        "".join(o.get("text", ""))
        for c in code
        for o in c["outputs"]
        if o.get("output_type") == "stream"
    )
    assert "尚未作答" in printed, printed[-2000:]  # the self-checks speak Chinese
    assert "not attempted yet" not in printed
