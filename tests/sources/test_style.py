"""The code style the README promises: `ruff check` (with no line over 100 characters)
and `ruff format` (lines wrapped at 88) hold over src/, tests/, tools/, benchmarks/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["src", "tests", "tools", "benchmarks", "book/_ext"]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    ruff = ROOT / ".venv" / "bin" / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed")
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, check=False, cwd=cwd
    )


def test_ruff_check_is_clean():
    run = _ruff("check", "--no-cache", *PATHS)
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    run = _ruff("format", "--check", "--no-cache", *PATHS)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_format_check_finds_an_unformatted_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("x = [1,2,\n  3]\n")
    run = _ruff("format", "--check", "--no-cache", "bad.py", cwd=tmp_path)
    assert run.returncode == 1 and "bad.py" in run.stdout
