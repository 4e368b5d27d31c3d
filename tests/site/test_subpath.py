"""The built site works from a project address: GitHub Pages serves a repository's site
at ``https://<owner>.github.io/<repo>/``, a subpath, not at the server's root. Here
``_build/html`` is served under ``/<repo>/`` (the repository's name in ``_config.yml``)
by a server that answers 404 to anything outside it, as GitHub's does for another
repository's address, and

- every page of both editions is requested over HTTP, and every page, script, style
  sheet, image, font and link it names (and every file the style sheets name, the theme's
  fonts among them) answers 200: a link written from the server's root (``/_static/...``)
  would work at the root and break here;
- the start address ``/<repo>/`` opens the book, and ``/<repo>`` is sent on to it;
- the language switch of each page leads to its other edition and back;
- in chromium, MathJax typesets a chapter's formulas in each edition under the subpath,
  with no request of the page's load answered 404, and clicking the language switch
  opens the Chinese page under the same subpath.

The checks are functions returning their problems, shown rejecting a small site with a
root-absolute link, a missing image and a style sheet naming a missing font.
"""

from __future__ import annotations

import functools
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.error import HTTPError
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
REPO = urlsplit(CONFIG["repository"]["url"]).path.rstrip("/").split("/")[-1]
REPO = REPO.removesuffix(".git")

# (tag, attribute) pairs whose value is an address the browser requests or follows
ADDRESSES = [
    ("a", "href"),
    ("link", "href"),
    ("script", "src"),
    ("img", "src"),
    ("iframe", "src"),
    ("source", "src"),
    ("video", "src"),
    ("video", "poster"),
    ("audio", "src"),
    ("embed", "src"),
    ("object", "data"),
    ("image", "href"),
    ("image", "xlink:href"),
    ("use", "href"),
    ("use", "xlink:href"),
]
NOT_FETCHED = ("mailto:", "javascript:", "data:", "blob:", "tel:", "about:")
CSS_URL = re.compile(
    r"""url\(\s*['"]?([^'")\s]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]"""
)
REFRESH = re.compile(r"url\s*=\s*['\"]?([^'\";\s]+)", re.IGNORECASE)


# -- a server of the site under /<prefix>/ -------------------------------------------


class SubpathHandler(SimpleHTTPRequestHandler):
    """Serves ``directory`` under ``/<prefix>/`` only; records each request's status."""

    prefix: ClassVar[str] = ""
    requests: ClassVar[
        list[tuple[str, int]]
    ] = []  # each subclass gets its own (Served)

    def send_head(self):
        path = urlsplit(self.path).path
        if path != f"/{self.prefix}" and not path.startswith(f"/{self.prefix}/"):
            self.send_error(404, "outside the site's subpath")
            return None
        return super().send_head()

    def translate_path(self, path):
        path = urlsplit(path).path.removeprefix(f"/{self.prefix}")
        return super().translate_path(path or "/")

    def log_request(self, code="-", size="-"):
        self.requests.append((self.path, int(getattr(code, "value", code))))

    def log_message(self, *args):
        pass


class Served:
    """``site`` served on 127.0.0.1 under ``/<prefix>/`` in a thread: ``base`` is the
    site's address (``http://127.0.0.1:<port>/<prefix>``), ``requests`` every request
    answered, as (path, status)."""

    def __init__(self, site: Path, prefix: str):
        handler = type("Handler", (SubpathHandler,), {"prefix": prefix, "requests": []})
        self.requests = handler.requests
        self.httpd = ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(site))
        )
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.base = f"{self.origin}/{prefix}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _NoRedirect(HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect is answered as it is, not followed


_OPENER = build_opener(_NoRedirect)


def fetch(url: str) -> tuple[int, str, bytes, str]:
    """(status, content type, body, Location) of a GET of ``url``, redirects not
    followed."""
    try:
        with _OPENER.open(Request(url), timeout=60) as response:
            return (
                response.status,
                response.headers.get_content_type(),
                response.read(),
                response.headers.get("Location", ""),
            )
    except HTTPError as error:
        return error.code, "", b"", error.headers.get("Location", "")


# -- what a page or a style sheet names ----------------------------------------------


def page_addresses(html: str, page_url: str) -> list[str]:
    """The absolute addresses, without fragment, that a page requests or links."""
    soup = BeautifulSoup(html, "lxml")
    values = []
    for tag, attribute in ADDRESSES:
        values += [el[attribute] for el in soup.find_all(tag) if el.get(attribute)]
    for tag in soup.find_all(["img", "source"], srcset=True):
        values += [part.split()[0] for part in tag["srcset"].split(",") if part.strip()]
    for meta in soup.find_all(
        "meta", attrs={"http-equiv": re.compile("refresh", re.IGNORECASE)}
    ):
        found = REFRESH.search(meta.get("content", ""))
        if found:
            values.append(found.group(1))
    return resolved(values, page_url)


def css_addresses(css: str, css_url: str) -> list[str]:
    """The absolute addresses a style sheet loads (``url(...)``, ``@import``)."""
    return resolved([a or b for a, b in CSS_URL.findall(css)], css_url)


def resolved(values: list[str], base_url: str) -> list[str]:
    out = []
    for value in values:
        value = value.strip()
        if not value or value.startswith("#") or value.lower().startswith(NOT_FETCHED):
            continue
        out.append(urldefrag(urljoin(base_url, value)).url)
    return out


def site_problems(served: Served, pages: list[str]) -> tuple[list[str], dict]:
    """Request every page in ``pages`` (paths under the site, "book/intro.html") and
    everything they and their style sheets name on this server; return the problems
    (an address that does not answer 200, with the page that names it) and
    {address: status} of every address requested."""
    status: dict[str, int] = {}
    named_by: dict[str, str] = {}
    todo = [f"{served.base}/{page}" for page in pages]
    for url in todo:
        named_by[url] = "(the page list)"
    problems: list[str] = []

    def visit(url: str) -> list[str]:
        code, kind, body, _ = fetch(url)
        status[url] = code
        if code != 200:
            return []
        text = body.decode("utf-8", errors="replace")
        if kind == "text/html":
            return page_addresses(text, url)
        if kind == "text/css":
            return css_addresses(text, url)
        return []

    with ThreadPoolExecutor(max_workers=8) as pool:
        while todo:
            batch, todo = todo, []
            for url, found in zip(batch, pool.map(visit, batch), strict=True):
                for address in found:
                    local = address.split("?")[0]
                    if urlsplit(local).netloc != urlsplit(served.origin).netloc:
                        continue  # another host: test_site checks that none loads
                    if local not in named_by:
                        named_by[local] = url
                        todo.append(local)
    for url, code in sorted(status.items()):
        if code != 200:
            problems.append(f"{url} answered {code}, named by {named_by[url]}")
    return problems, status


def html_pages(site: Path) -> list[str]:
    """Every HTML file of the built site, as a path under it."""
    return sorted(
        str(p.relative_to(site))
        for p in site.rglob("*.html")
        if "_sources" not in p.parts and "_static" not in p.parts
    )


# -- tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(site):
    server = Served(site, REPO)
    yield server
    server.close()


@pytest.fixture(scope="module")
def crawled(site, served):
    pages = html_pages(site)
    problems, status = site_problems(served, pages)
    return pages, problems, status


def test_every_page_and_what_it_names_loads_under_the_subpath(site, crawled):
    pages, problems, status = crawled
    english = [p for p in pages if p.startswith("book/")]
    chinese = [p for p in pages if p.startswith("zh/")]
    assert len(english) >= 10 and len(chinese) >= 10, (english, chinese)
    assert not problems, (
        f"{len(problems)} address(es) fail under /{REPO}/: {problems[:20]}"
    )
    mathjax = [u for u in status if u.endswith("vendor/mathjax/tex-svg.js")]
    assert mathjax, "no page names MathJax"
    fonts = [u for u in status if u.endswith((".woff2", ".woff", ".ttf"))]
    assert fonts, "no style sheet's font was requested (the theme's icons)"


def test_the_start_address_opens_the_book(served):
    code, kind, body, _ = fetch(f"{served.base}/")
    assert code == 200 and kind == "text/html"
    start = page_addresses(body.decode("utf-8"), f"{served.base}/")
    assert start, "index.html sends the reader nowhere"
    assert all(fetch(url)[0] == 200 for url in start), start
    code, _, _, location = fetch(served.base)
    assert code in (301, 302) and location.endswith(f"/{REPO}/"), (code, location)


def test_the_language_switch_leads_there_and_back_under_the_subpath(site, served):
    switched = 0
    for english in sorted((site / "book").glob("*.html")):
        url = f"{served.base}/book/{english.name}"
        soup = BeautifulSoup(english.read_text(encoding="utf-8"), "lxml")
        links = soup.select("p.edition-link a[href]")
        if not links:
            continue
        chinese_url = urldefrag(urljoin(url, links[0]["href"])).url
        assert chinese_url == f"{served.base}/zh/{english.name}", chinese_url
        code, _, body, _ = fetch(chinese_url)
        assert code == 200, chinese_url
        back = BeautifulSoup(body, "lxml").select("p.edition-link a[href]")
        assert back and urljoin(chinese_url, back[0]["href"]) == url, chinese_url
        switched += 1
    assert switched >= 10, f"only {switched} English pages have a language switch"


REDIRECT = re.compile(r'\s*<meta http-equiv="Refresh" content="0; url=[^"]+" />\s*$')
FOOTER = re.compile(
    r'<div class="extra_footer">\s*<p class="license-footer">(.*?)</p>', re.DOTALL
)


def footer_problems(name: str, html: str) -> list[str]:
    """A page whose footer does not state the two licenses (_config.yml's
    ``extra_footer``, book/zh/edition.yml's in Chinese) in its edition's words."""
    found = FOOTER.search(html)
    if found is None:
        return [f"{name}: no license footer"]
    text = found.group(1)
    words = (
        ("正文与图片", "MIT 许可证") if name.startswith("zh/") else ("Text and", "MIT")
    )
    if "creativecommons.org/licenses/by-sa/4.0/" not in text or not all(
        w in text for w in words
    ):
        return [f"{name}: the footer does not state both licenses: {text[:120]}"]
    return []


def test_every_page_states_the_licenses_in_its_footer(site):
    pages = [p for p in html_pages(site) if p.startswith(("book/", "zh/"))]
    problems = []
    for page in pages:
        html = (site / page).read_text(encoding="utf-8")
        if not REDIRECT.match(html):  # zh/index.html only sends the reader on
            problems += footer_problems(page, html)
    assert pages and not problems, problems[:10]


def test_the_footer_check_rejects_a_page_without_it_or_in_the_wrong_language():
    english = (
        '<div class="extra_footer"><p class="license-footer">Text and figures: <a '
        'href="https://creativecommons.org/licenses/by-sa/4.0/">CC BY-SA 4.0</a>. '
        "Code: MIT License.</p></div>"
    )
    assert footer_problems("book/intro.html", english) == []
    assert footer_problems("zh/intro.html", english)[0].startswith(
        "zh/intro.html: the footer does not state both licenses"
    )
    assert footer_problems("book/x.html", "<footer></footer>") == [
        "book/x.html: no license footer"
    ]


def test_the_subpath_check_finds_what_breaks_there(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "ok.css").write_text(
        "@font-face { src: url(fonts/gone.woff2); } .x { background: url(data:,) }"
    )
    (tmp_path / "_static" / "ok.png").write_bytes(b"\x89PNG")
    (tmp_path / "book" / "intro.html").write_text(
        '<html><head><link rel="stylesheet" href="../_static/ok.css">'
        '<link rel="stylesheet" href="/_static/ok.css"></head><body>'
        '<img src="../_static/ok.png"><img src="missing.png">'
        '<a href="#top">here</a><a href="https://example.org/x">away</a>'
        '<a href="mailto:a@b.c">mail</a></body></html>'
    )
    server = Served(tmp_path, "repo")
    try:
        problems, status = site_problems(server, ["book/intro.html"])
    finally:
        server.close()
    base = server.base
    assert problems == [
        f"{server.origin}/_static/ok.css answered 404, named by {base}/book/intro.html",
        f"{base}/_static/fonts/gone.woff2 answered 404, named by {base}/_static/ok.css",
        f"{base}/book/missing.png answered 404, named by {base}/book/intro.html",
    ]
    assert status[f"{base}/_static/ok.png"] == 200


@pytest.mark.browser
@pytest.mark.parametrize(
    "page", ["book/02_scaled_dot_product", "zh/02_scaled_dot_product"]
)
def test_math_renders_and_nothing_is_missing_in_a_browser_under_the_subpath(
    browser, served, page
):
    from browsing import Visit

    served.requests.clear()
    visit = Visit(browser, f"{served.base}/{page}.html")
    try:
        tab = visit.page
        tab.wait_for_selector("mjx-container svg", state="attached", timeout=60_000)
        tab.evaluate("() => MathJax.startup.promise")
        rendered = tab.locator("mjx-container").count()
        errors = tab.locator("mjx-merror").count()
        missing = [(path, code) for path, code in served.requests if code >= 400]
        assert rendered > 0 and errors == 0, (rendered, errors)
        assert not missing, f"{page} under /{REPO}/: {missing}"
        if page.startswith("book/"):
            with tab.expect_navigation():
                tab.click("p.edition-link a")
            assert tab.url == f"{served.base}/zh/02_scaled_dot_product.html", tab.url
            heading = tab.locator("h1").first.inner_text()
            assert re.search(r"[\u4e00-\u9fff]", heading), heading
    finally:
        visit.page.close()
