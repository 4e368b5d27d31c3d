"""The core modules load neither matplotlib nor IPython nor ipywidgets (DESIGN.md:
only ``viz/`` and the chapters do), so a training script or a server imports them
cheaply. Each import runs in a fresh interpreter: this process has loaded them all."""

import subprocess
import sys

import pytest

CORE = ["attention", "masks", "positional", "layers", "model", "decoding", "training"]
HEAVY = ["matplotlib", "IPython", "ipywidgets"]


def _loaded(statement: str) -> list[str]:
    code = (
        f"import sys\n{statement}\nprint(*[m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_plotting_or_notebook_package(module):
    assert _loaded(f"import transformer_course.{module}") == []


def test_import_check_sees_a_plotting_import():
    # known wrong: viz does load them, and the check must notice
    assert "matplotlib" in _loaded("import transformer_course.viz")
