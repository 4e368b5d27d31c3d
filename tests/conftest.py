"""Shared fixtures. Site and browser tests read the built book in _build/html, which
`make test` builds first (`make book`)."""

from __future__ import annotations

import functools
import os
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
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
def seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture
def tiny_config():
    """A factory of tiny ``TransformerConfig``s (d_model 32, 4 heads, no dropout) that
    run in milliseconds; keyword arguments override the defaults."""
    from transformer_course.model import TransformerConfig

    def make(**overrides) -> TransformerConfig:
        base = {
            "src_vocab_size": 20,
            "tgt_vocab_size": 12,
            "d_model": 32,
            "n_heads": 4,
            "d_ff": 64,
            "dropout": 0.0,
            "max_len": 16,
        }
        return TransformerConfig(**{**base, **overrides})

    return make


class ListCache:
    """The smallest KV cache: ``update`` appends along the length axis."""

    def __init__(self):
        self.k = self.v = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


@pytest.fixture
def quiet_check(capsys):
    """Run a learner's self-check (``check(fn)``) and swallow the two lines it prints;
    returns what the check returns (True / False)."""

    def run(check, fn):
        result = check(fn)
        capsys.readouterr()
        return result

    return run


@pytest.fixture
def list_cache():
    """The ``ListCache`` class: call it for a fresh, empty cache."""
    return ListCache


@pytest.fixture(scope="session")
def site() -> Path:
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no built book: run `make book` first (make test does)")
    return HTML


# -- the built site in Debian's chromium (test_browser.py, test_a11y.py) --------------


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from browsing import CHROMIUM, FLAGS

    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail(
            f"{CHROMIUM} is missing: run tools/ensure_browser.sh (make test does)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()
