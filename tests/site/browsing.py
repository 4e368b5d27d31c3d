"""Helpers shared by the browser tests (test_browser.py, test_a11y.py): the pages of
_toc.yml and of the Chinese edition's book/zh/_toc.yml ("zh/intro"), Debian's chromium
and its flags, and ``Visit``, one page opened with its console errors and outside
requests recorded. The ``server`` and ``browser`` fixtures are in conftest.py. Not a
test module: test modules import this, never each other."""

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
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors, self.outside = [], []
        self.page.on(
            "console", lambda m: m.type == "error" and self.errors.append(m.text)
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        if html is not None:
            self.page.set_content(html, wait_until="load")
        else:
            self.page.goto(url, wait_until="networkidle")

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
