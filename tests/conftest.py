"""Shared fixtures. Site and browser tests read the built book in _build/html, which
`make test` builds first (`make book`)."""

from __future__ import annotations

import functools
import os
import re
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

# The folder a test lives in says what it needs, and is its marker (README, "Tests"):
#   lib        library tests, one file per module of src/transformer_course
#   exercises  the learners' self-checks, one file per chapter
#   sources    reads chapter sources, notebooks and configuration without executing them
#   slow       book builds, benchmarks, the GPU check, grading end to end, the Colab
#              simulation, scripts
#   site       the built book in _build/html, and a real browser on it
TIERS = ("lib", "exercises", "sources", "slow", "site")
# Two modules keep state that two of their tests must not touch at once: the Colab
# simulation (one cached environment that each notebook restores and installs into) and
# the grading tests (a session fixture that grades once; checks for the stray processes
# and temporary folders a grading run leaves). Under pytest-xdist (make test runs pytest
# with -n auto --dist loadgroup) each of them is one work unit, GROUPS, that one worker
# runs test after test; the two units, the largest, are handed out first, to different
# workers (first_units). The grouping is by module path (GroupScheduling below), not by
# ``xdist_group`` marks: pytest-xdist 3.8 marks a group by renaming ``item._nodeid``,
# which pytest 9 no longer reads, so marked tests spread over every worker (they did, and
# broke each other, in the runs of 2026-12-01 before d2e6a2c).
GROUPS = {"tests/slow/test_colab.py": "colab", "tests/slow/test_grading.py": "grading"}
# The browser tests of one page of the built site ("[01_qkv]", "[zh-01_qkv]", "[search]":
# browsing.short of the page) are one work unit too, "site:01_qkv", so that one worker
# runs them one after another, in PAGE_TEST_ORDER, on the page it loaded once
# (browsing.Pages, the ``pages`` fixture) instead of loading it for each (5 to 18 s a
# load on CI's 2 cores). Every other test is a unit of its own.
PAGE_MODULES = (
    "tests/site/test_a11y.py",
    "tests/site/test_browser.py",
    "tests/site/test_measure_pages.py",
    "tests/site/test_live.py",
)
# The order of a page's tests: the check of the page as it loaded first, then the checks
# that only read it, then those that change it, each a part of its own (the views'
# controls, the animations' sliders, the solutions). A test missing here runs after them,
# on a page Pages loads again if a test changed it.
PAGE_TEST_ORDER = (
    "test_page_loads_cleanly_and_stays_on_this_host",
    "test_chapter_reads_as_an_illustrated_page",
    "test_no_serious_or_critical_axe_violation",
    "test_math_renders",
    "test_chinese_headings_render_in_a_cjk_font",
    "test_every_animation_control_shows_an_icon",
    "test_every_interactive_view_responds_to_each_control",
    "test_live_views_speak_the_pages_language",
    "test_live_tokenizers_match_python_on_100_sentences",
    "test_live_views_match_the_library",
    "test_every_animation_plays",
    "test_every_solution_starts_hidden_and_opens_on_click",
)
_PAGE_TEST = re.compile(r"(\w+)\[([\w-]+)\]")  # a function with one page parameter


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its module's name in GROUPS; "site:<page>" for a
    test of PAGE_MODULES parametrized by a page; else the test itself."""
    module, _, rest = nodeid.partition("::")
    if module in GROUPS:
        return GROUPS[module]
    match = _PAGE_TEST.fullmatch(rest) if module in PAGE_MODULES else None
    return f"site:{match.group(2)}" if match else nodeid


def unit_order(nodeids: list[str]) -> list[int]:
    """The order to run tests in (indexes into ``nodeids``): the tests of a page's unit
    together, where its first test was, in PAGE_TEST_ORDER (others after, as they came);
    every other test where it was."""
    units: dict[str, list[int]] = {}
    for i, nodeid in enumerate(nodeids):
        units.setdefault(work_unit(nodeid), []).append(i)

    def rank(i: int) -> int:
        name = nodeids[i].partition("::")[2].split("[")[0]
        return (PAGE_TEST_ORDER + (name,)).index(name)

    order = []
    for unit, indexes in units.items():
        order += sorted(indexes, key=rank) if unit.startswith("site:") else indexes
    return order


def first_units(workqueue: dict[str, dict]) -> None:
    """Move the GROUPS units to the front of an xdist work queue (``OrderedDict`` of
    unit: tests), the largest first, whatever the size of the other units: they are the
    longest, and each must start on a worker of its own."""
    groups = sorted(
        (u for u in workqueue if u in GROUPS.values()), key=lambda u: len(workqueue[u])
    )
    for unit in groups:  # the smallest moved first ends up behind the larger
        workqueue.move_to_end(unit, last=False)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` groups by work_unit (see GROUPS) and hands out the GROUPS
    units first (first_units); the other units go largest first (xdist's own order)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            first_units(self.workqueue)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


# Under pytest-xdist the workers share the cores: one torch thread each (and in the
# kernels and scripts they start, through the environment), instead of every worker
# starting as many threads as there are cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def tier_of(path: Path) -> str | None:
    """The tier folder of a test file (tests/<tier>/...), or None outside them."""
    rel = Path(path).resolve().relative_to(ROOT / "tests")
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in TIERS else None


# Known failures, found by the last full run and not yet fixed: each says what breaks. They
# still run (xfail, not skip) until a commit fixes them and empties this table.
KNOWN_FAILURES: dict[str, str] = {}


def pytest_collection_modifyitems(config, items):
    """Mark every test with its folder's tier (``-m lib``, ``-m "not slow"``, ...), and
    run a page's browser tests together, in PAGE_TEST_ORDER (unit_order)."""
    items[:] = [items[i] for i in unit_order([item.nodeid for item in items])]
    for item in items:
        if item.nodeid in KNOWN_FAILURES:
            item.add_marker(pytest.mark.xfail(reason=KNOWN_FAILURES[item.nodeid]))
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid}: tests live in one of tests/{{{','.join(TIERS)}}}/"
            )
        item.add_marker(getattr(pytest.mark, tier))


def time_by_file(reports) -> list[tuple[str, float, int]]:
    """(test file, seconds of setup + call + teardown, tests) of test reports, the
    most expensive file first: where a run's time goes, a line a file."""
    seconds: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for report in reports:
        if getattr(report, "when", None) not in ("setup", "call", "teardown"):
            continue
        path = report.nodeid.split("::")[0]
        seconds[path] = seconds.get(path, 0.0) + report.duration
        tests.setdefault(path, set()).add(report.nodeid)
    rows = [(path, seconds[path], len(tests[path])) for path in seconds]
    return sorted(rows, key=lambda row: -row[1])


def pytest_terminal_summary(terminalreporter, config):
    """With ``--durations`` (the Makefile's test targets): seconds by test file too."""
    if config.getoption("durations", None) is None:
        return
    reports = [r for rs in terminalreporter.stats.values() for r in rs]
    rows = time_by_file(reports)[:20]
    if rows:
        terminalreporter.section("seconds by test file (all workers together)")
        for path, seconds, n in rows:
            terminalreporter.write_line(f"{seconds:8.1f} s  {n:4d} tests  {path}")


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


@pytest.fixture(scope="session")
def tiny_lm():
    """A factory of tiny Llama-style ``DecoderOnlyLM``s in eval mode, weights drawn after
    ``torch.manual_seed(0)``: rotary positions, RMSNorm, SwiGLU, no biases, 4 query heads
    sharing 2 key/value heads, d_model 32, 2 layers, a vocabulary of 40, 48 positions
    (chapter 11's serving tests); keyword arguments override the config."""
    from transformer_course.model import DecoderOnlyLM, TransformerConfig

    def make(**overrides):
        base = {
            "src_vocab_size": 20,
            "tgt_vocab_size": 40,
            "d_model": 32,
            "n_heads": 4,
            "n_kv_heads": 2,
            "d_ff": 64,
            "n_layers": 2,
            "dropout": 0.0,
            "max_len": 48,
            "positional": "rope",
            "norm": "rms",
            "activation": "swiglu",
            "bias": False,
        }
        torch.manual_seed(0)
        return DecoderOnlyLM(TransformerConfig(**{**base, **overrides})).eval()

    return make


@pytest.fixture
def qkv():
    """A factory of random queries, keys and values:
    ``qkv(b=2, h=2, t=8, s=None, d=16, *, dtype, requires_grad, seed)`` returns
    q (B, H, T, d), k and v (B, H, S, d), drawn in that order, S defaulting to T.
    With ``seed`` they come from a ``torch.Generator`` of their own (the same data
    whatever ran before); without, from the global stream the ``seed`` fixture resets."""

    def make(
        b=2,
        h=2,
        t=8,
        s=None,
        d=16,
        *,
        dtype=torch.float32,
        requires_grad=False,
        seed=None,
    ):
        s = t if s is None else s
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        return tuple(
            torch.randn(b, h, n, d, dtype=dtype, generator=gen).requires_grad_(
                requires_grad
            )
            for n in (t, s, s)
        )

    return make


@pytest.fixture
def quiet_check(capsys):
    """Run a learner's self-check (``check(fn)``) and swallow the two lines it prints;
    returns what the check returns (True / False)."""

    def run(check, fn):
        result = check(fn)
        capsys.readouterr()
        return result

    return run


@pytest.fixture(scope="session")
def site() -> Path:
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no built book: run `make book` first (make test does)")
    return HTML


# -- the built site in Debian's chromium (test_browser.py, test_a11y.py, ...) ---------
# One server and one browser a worker (session scope: a page's tests come from three
# modules, and module-scoped fixtures would start them again at each change of module).


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def server(site):
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def pages(browser, server):
    """The worker's open page of the site (browsing.Pages), handed to the tests of that
    page one after another (their work unit, PAGE_TEST_ORDER)."""
    from browsing import Pages

    opened = Pages(browser, server)
    yield opened
    opened.close()
