"""The built site in a real browser: Debian's chromium driven by Playwright (no browser
download). Pages load without console errors and without any request to another host;
animations and interactive views respond to their controls; math renders."""

from __future__ import annotations

import functools
import re
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHAPTERS = sorted(re.findall(r"file: book/(\d\d_\w+)", (ROOT / "_toc.yml").read_text()))
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


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
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (see .ci/run)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


class Visit:
    """Open one page, recording console errors and requests to other hosts."""

    def __init__(self, browser, url):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors, self.outside = [], []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", self._request)
        self.page.goto(url, wait_until="networkidle")

    def _request(self, request):
        host = urlparse(request.url).hostname
        if request.url.startswith(("data:", "blob:", "about:")):
            return
        if host not in ("127.0.0.1", "localhost"):
            self.outside.append(request.url)


@pytest.mark.parametrize("name", ["intro", *CHAPTERS])
def test_page_loads_cleanly_and_stays_on_this_host(browser, server, name):
    visit = Visit(browser, f"{server}/book/{name}.html")
    assert not visit.outside, f"requests to other hosts: {visit.outside}"
    assert not visit.errors, f"console errors: {visit.errors}"
    visit.page.close()


def test_chapter_1_animation_slider_changes_the_frame(browser, server):
    page = Visit(browser, f"{server}/book/01_qkv.html").page
    slider = page.locator("input.anim-slider").first
    image = page.locator("img[id^='_anim_img']").first
    before = image.get_attribute("src")
    last = int(slider.get_attribute("max"))
    slider.evaluate(
        "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", last
    )
    after = image.get_attribute("src")
    assert before and after and before != after
    page.close()


def test_chapter_1_interactive_view_responds_to_its_controls(browser, server):
    page = Visit(browser, f"{server}/book/01_qkv.html").page
    view = page.locator("div.tc-interactive").first
    frame = view.locator("img.tc-frame")
    start = frame.get_attribute("src")
    view.locator("select[data-control]").first.select_option(index=2)
    after_menu = frame.get_attribute("src")
    assert after_menu != start
    slider = view.locator("input[type=range][data-control]").first
    slider.evaluate("(el) => { el.value = el.max; el.dispatchEvent(new Event('input')); }")
    assert frame.get_attribute("src") not in (start, after_menu)
    assert view.locator(".tc-value").first.inner_text() != ""
    page.close()


def test_math_renders(browser, server):
    page = Visit(browser, f"{server}/book/01_qkv.html").page
    page.wait_for_selector("mjx-container svg", timeout=20_000)
    assert page.locator("mjx-container").count() > 5
    page.close()


def test_solution_starts_hidden_and_opens_on_click(browser, server):
    page = Visit(browser, f"{server}/book/01_qkv.html").page
    solution = page.locator("div.solution").first
    body = solution.locator("pre").first
    assert not body.is_visible()
    solution.locator("button.toggle-button").first.click()
    body.wait_for(state="visible", timeout=5_000)
    page.close()
