"""Helpers shared by the browser tests (test_browser.py, test_a11y.py): the pages of
_toc.yml and of the Chinese edition's book/zh/_toc.yml ("zh/intro"), Debian's chromium
and its flags, ``Visit``, one page opened with its console errors and outside requests
recorded, and ``Pages``, the page a worker has open, shared by that page's tests. The
``server``, ``browser`` and ``pages`` fixtures are in conftest.py. Not a test module:
test modules import this, never each other."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def toc_pages(toc_file: Path = ROOT / "_toc.yml") -> list[str]:
    """Every page of a toc, in order, as its path without suffix ("book/01_qkv")."""
    toc = yaml.safe_load(toc_file.read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return pages


PAGES = toc_pages()
CHAPTERS = [p for p in PAGES if Path(p).name[:2].isdigit()]
# the Chinese edition, served under zh/ (tools/build_book.py --edition zh)
ZH_PAGES = [f"zh/{page}" for page in toc_pages(ROOT / "book" / "zh" / "_toc.yml")]
ZH_CHAPTERS = [p for p in ZH_PAGES if Path(p).name[:2].isdigit()]


def short(page: str) -> str:
    return ("zh-" if page.startswith("zh/") else "") + Path(page).name


class Visit:
    """Open one page, recording console errors and requests to other hosts. Requests to
    other hosts are recorded and aborted, so the check never touches the network."""

    def __init__(self, browser, url=None, *, html=None):
        # tools/measure_pages.py's window (WIDTH, SCREEN): test_measure_pages measures
        # the same page the other tests check
        self.page = browser.new_page(viewport={"width": 1280, "height": 1000})
        self.errors, self.outside = [], []
        self.page.on(
            "console", lambda m: m.type == "error" and self.errors.append(m.text)
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        try:
            if html is not None:
                self.page.set_content(html, wait_until="load")
            else:
                self.page.goto(url, wait_until="networkidle")
        except BaseException:
            self.page.close()  # a page that failed to load stays open no longer
            raise

    def _route(self, route):
        url = route.request.url
        host = urlparse(url).hostname
        if url.startswith(("data:", "blob:", "about:")) or host in (
            "127.0.0.1",
            "localhost",
        ):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()


class Pages:
    """The page of the site a worker has open, handed to the tests of that page one
    after another (tests/conftest.py makes them one work unit, in PAGE_TEST_ORDER), so
    that a page loads once instead of once a test. At most one page is open: opening
    another closes it.

    ``open(name)`` hands over the open page if no test changed it, else loads it again;
    ``open(name, changes=part)``, for a test that changes one part of the page (the
    views' controls, the animations' sliders, the solutions), also takes a page whose
    other parts were changed, and marks the part changed before the test runs (a test
    that fails half-way leaves it changed too); ``open(name, fresh=True)`` loads the
    page anew, so that the console errors and outside requests its Visit recorded are
    those of its own load (the test of the page as it loaded comes first in its unit,
    when no page of that name is open yet)."""

    def __init__(self, browser, server: str):
        self.browser, self.server = browser, server
        self.visit: Visit | None = None
        self.name: str | None = None
        self.changed: set[str] = set()  # parts of it that tests changed

    def open(self, name: str, *, fresh: bool = False, changes: str | None = None):
        """The Visit of ``name`` ("book/01_qkv", "zh/search"), loaded if need be."""
        if not self._reusable(name, fresh, changes):
            self.close()
            self.visit = Visit(self.browser, f"{self.server}/{name}.html")
            self.name = name
        if changes is not None:
            self.changed.add(changes)
        return self.visit

    def _reusable(self, name: str, fresh: bool, changes: str | None) -> bool:
        if fresh or self.visit is None or self.name != name:
            return False
        if self.visit.page.is_closed():
            return False
        return not self.changed if changes is None else changes not in self.changed

    def close(self) -> None:
        if self.visit is not None and not self.visit.page.is_closed():
            self.visit.page.close()
        self.visit, self.name, self.changed = None, None, set()
