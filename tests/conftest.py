"""Shared fixtures. Site and browser tests read the built book in _build/html, which
`make test` builds first (`make book`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter. Triton reads this variable when it
# is first imported, so it is set here, before any test module imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def site() -> Path:
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no built book: run `make book` first (make test does)")
    return HTML
