"""The built site in a real browser: Debian's chromium driven by Playwright (no browser
download), over every page listed in _toc.yml.

Every page loads without console errors and without any request to another host; on
every chapter page every animation plays (moving its slider changes the frame), every
interactive view responds to each of its controls, every exercise solution starts hidden
and opens on click, and the math renders. The search page finds "multi-head" once
chapter 3 is in the toc, and the Chinese search page finds a Chinese word; Chinese
headings render in a CJK font, not as empty boxes (tofu). A full-page screenshot of
every chapter lands in _build/screenshots/ for review.

Each check is a helper that returns the problems it found, and each helper is shown
rejecting a known-broken page at the end of the file. The tests of one page share one
load of it (the ``pages`` fixture, browsing.Pages: the tests that change the page say
which part; the test of the page as it loaded loads it anew).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from browsing import CHAPTERS, PAGES, ZH_CHAPTERS, ZH_PAGES, Pages, Visit, short
from bs4 import BeautifulSoup

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"


# -- checks: each returns a list of problems (empty = fine) ---------------------------


def _set(locator, value) -> None:
    locator.evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input'));"
        " el.dispatchEvent(new Event('change')); }",
        value,
    )


def animation_problems(page) -> list[str]:
    """Each matplotlib to_jshtml animation: moving its slider to the last frame and
    back to the first changes the displayed frame."""
    problems = []
    sliders = page.locator("input.anim-slider")
    for i in range(sliders.count()):
        slider = sliders.nth(i)
        anim_id = slider.get_attribute("id").removeprefix("_anim_slider")
        image = page.locator(f"img#_anim_img{anim_id}")
        last = int(slider.get_attribute("max") or 0)
        if last < 1:
            problems.append(f"animation {i}: only one frame")
            continue
        _set(slider, 0)
        first = image.get_attribute("src")
        _set(slider, last)
        final = image.get_attribute("src")
        if not first or first == final:
            problems.append(
                f"animation {i}: moving the slider did not change the frame"
            )
    return problems


def interactive_problems(page) -> list[str]:
    """Each pre-rendered interactive view (viz.interactive): changing any one of its
    controls changes the displayed image, and sliders show their current value."""
    problems = []
    views = page.locator("div.tc-interactive")
    for i in range(views.count()):
        view = views.nth(i)
        frame = view.locator("img.tc-frame")
        controls = view.locator("[data-control]")
        if controls.count() == 0:
            problems.append(f"view {i}: no controls")
        for j in range(controls.count()):
            control = controls.nth(j)
            tag = control.evaluate("el => el.tagName.toLowerCase()")
            if tag == "select":
                n = control.locator("option").count()
            else:
                n = int(control.get_attribute("max") or 0) + 1
            if n < 2:
                continue  # a single value: nothing to change
            before_value = control.evaluate("el => el.value")
            before = frame.get_attribute("src")
            other = n - 1 if before_value == "0" else 0
            _set(control, other)
            if frame.get_attribute("src") == before:
                problems.append(
                    f"view {i}: control {j} ({tag}) did not change the image"
                )
            if (
                tag == "input"
                and not control.locator("xpath=..")
                .locator(".tc-value")
                .inner_text()
                .strip()
            ):
                problems.append(f"view {i}: slider {j} shows no value")
            _set(control, before_value)
    return problems


def solution_problems(page) -> list[str]:
    """Each sphinx-exercise solution starts hidden and opens when its button is clicked."""
    problems = []
    solutions = page.locator("div.solution")
    for i in range(solutions.count()):
        solution = solutions.nth(i)
        body = solution.locator(".admonition-title ~ *").first
        if body.count() == 0:
            problems.append(f"solution {i}: no body")
            continue
        if body.is_visible():
            problems.append(f"solution {i}: visible before clicking")
            continue
        solution.locator("button.toggle-button").first.click()
        try:
            body.wait_for(state="visible", timeout=5_000)
        except Exception:  # noqa: BLE001 (playwright's TimeoutError)
            problems.append(f"solution {i}: did not open on click")
    return problems


def math_problems(page, timeout: int = 30_000) -> list[str]:
    """MathJax typeset every formula: there is rendered math, no TeX error box, and no
    unprocessed math left in the text."""
    if page.locator(".math, span.math, div.math").count() == 0:
        return []
    try:
        page.wait_for_selector("mjx-container svg", state="attached", timeout=timeout)
        page.evaluate("() => MathJax.startup.promise")  # typesetting finished
    except Exception:  # noqa: BLE001 (playwright's TimeoutError)
        return ["MathJax did not render any formula"]
    problems = []
    errors = page.locator("mjx-merror, [data-mjx-error]")
    if errors.count():
        problems.append(
            f"{errors.count()} TeX error(s), e.g. "
            f"{errors.first.get_attribute('data-mjx-error') or errors.first.inner_text()}"
        )
    left = page.evaluate(
        "() => Array.from(document.querySelectorAll('.math'))"
        ".filter(el => !el.querySelector('mjx-container'))"
        ".map(el => el.textContent.slice(0, 60))"
    )
    if left:
        problems.append(f"{len(left)} formula(s) not typeset, e.g. {left[:2]}")
    return problems


_ICON_JS = """button => {
  const box = el => el.getBoundingClientRect();
  const shown = el => { const r = box(el), st = getComputedStyle(el);
    return r.width >= 4 && r.height >= 4 && st.visibility !== 'hidden'
      && st.display !== 'none' && parseFloat(st.opacity) > 0; };
  const webFont = family => {  // a font the page loaded itself (@font-face), not a system font
    const first = family.split(',')[0].trim().replace(/^["']|["']$/g, '');
    return Array.from(document.fonts).some(f => f.status === 'loaded'
      && f.family.replace(/^["']|["']$/g, '') === first);
  };
  const text = Array.from(button.childNodes).filter(n => n.nodeType === 3)
    .map(n => n.textContent.trim()).join('');
  const textFont = getComputedStyle(button).fontFamily;
  if (text && !webFont(textFont)) return {problem: `shows the text ${JSON.stringify(text)}`
    + ` in ${textFont}, not an icon from a font or image the site ships`};
  for (const el of button.querySelectorAll('svg, img')) {
    if (!shown(el)) continue;
    if (el.tagName.toLowerCase() === 'img') {
      const local = /^(data:|blob:)/.test(el.src) || new URL(el.src).host === location.host;
      if (el.complete && el.naturalWidth > 0 && local) return {icon: 'img'};
      continue;
    }
    const shapes = Array.from(el.querySelectorAll('path, rect, circle, polygon, use'))
      .filter(s => { const b = s.getBBox(); return b.width * b.height > 0
        && getComputedStyle(s).fill !== 'none'; });
    if (shapes.length) return {icon: 'svg', clip: box(el).toJSON()};
  }
  for (const el of button.querySelectorAll('*')) {
    const before = getComputedStyle(el, '::before');
    if (before.content && !['none', 'normal', '""'].includes(before.content)
        && webFont(before.fontFamily) && shown(el)) return {icon: 'font', clip: box(el).toJSON()};
  }
  return {problem: 'no visible icon (svg, image or web-font glyph)'};
}"""


def _ink(page, clip) -> int:
    """Pixels that differ from the most common colour in ``clip`` of a screenshot."""
    import io

    from PIL import Image

    png = page.screenshot(clip={k: clip[k] for k in ("x", "y", "width", "height")})
    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = sorted(image.getcolors(image.width * image.height), reverse=True)
    return sum(n for n, _ in counts[1:])


def animation_control_problems(page) -> list[str]:
    """Every animation control (play, pause, step, speed buttons) shows a visible icon
    drawn from something the page itself has: an inline SVG with painted shapes, a
    same-host or data: image, or a glyph of a web font the page loaded. A bare Unicode
    symbol (U+23EE ...) fails: the site's fonts lack it and it shows as an empty box."""
    problems = []
    buttons = page.locator("div.anim-buttons button")
    for i in range(buttons.count()):
        button = buttons.nth(i)
        name = button.get_attribute("title") or f"button {i}"
        button.scroll_into_view_if_needed()
        found = button.evaluate(_ICON_JS)
        if "problem" in found:
            problems.append(f"control {i} ({name}): {found['problem']}")
        elif "clip" in found and _ink(page, found["clip"]) == 0:
            problems.append(f"control {i} ({name}): its {found['icon']} icon is blank")
    return problems


TOFU_JS = """([text, font]) => {
  const draw = (ch) => {
    const c = document.createElement('canvas');
    c.width = 64; c.height = 64;
    const g = c.getContext('2d');
    g.font = font; g.textBaseline = 'top'; g.fillText(ch, 4, 4);
    return c.toDataURL();
  };
  const box = draw('\\uE000');  // a private-use character: no font has a glyph for it
  const chars = [...new Set([...text].filter(ch => ch.charCodeAt(0) > 0x2E80))];
  const seen = new Map();
  return chars.filter(ch => {
    const image = draw(ch);
    const tofu = image === box || seen.has(image);
    seen.set(image, ch);
    return tofu;
  });
}"""


def tofu(page, text: str, font: str) -> list[str]:
    """The CJK characters of ``text`` that render, in ``font`` (CSS shorthand), as the
    same box as a character no font has, or as the same image as another character."""
    return page.evaluate(TOFU_JS, [text, font])


def heading_tofu(page) -> list[str]:
    """tofu() of the page's first heading, in the heading's own computed font."""
    heading = page.locator("h1").first
    font = heading.evaluate(
        "el => { const s = getComputedStyle(el);"
        " return `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`; }"
    )
    return tofu(page, heading.inner_text(), font)


# -- the site ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", [*PAGES, "search", "genindex", *ZH_PAGES, "zh/search"], ids=short
)
def test_page_loads_cleanly_and_stays_on_this_host(pages, name):
    visit = pages.open(name, fresh=True)  # what its own load recorded
    if name in CHAPTERS:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        visit.page.screenshot(
            path=str(SCREENSHOTS / f"{short(name)}.png"), full_page=True
        )
    assert not visit.outside, f"requests to other hosts: {visit.outside}"
    assert not visit.errors, f"console errors: {visit.errors}"


@pytest.mark.parametrize("name", [*CHAPTERS, *ZH_CHAPTERS], ids=short)
def test_every_animation_plays(pages, name):
    # the check leaves the animations at their last frame
    page = pages.open(name, changes="animations").page
    count = page.locator("input.anim-slider").count()
    problems = animation_problems(page)
    assert count, f"{short(name)} has no animation (every chapter needs one)"
    assert not problems, f"{short(name)}: {problems}"


@pytest.mark.parametrize("name", [*CHAPTERS, *ZH_CHAPTERS], ids=short)
def test_every_interactive_view_responds_to_each_control(pages, name):
    # the check sets each control back, unless it fails half-way
    page = pages.open(name, changes="views").page
    count = page.locator("div.tc-interactive").count()
    problems = interactive_problems(page)
    assert count, f"{short(name)} has no interactive view (every chapter needs one)"
    assert not problems, f"{short(name)}: {problems}"


@pytest.mark.parametrize("name", [*CHAPTERS, *ZH_CHAPTERS], ids=short)
def test_every_solution_starts_hidden_and_opens_on_click(pages, name):
    page = pages.open(name, changes="solutions").page  # leaves them open
    count = page.locator("div.solution").count()
    problems = solution_problems(page)
    assert count, f"{short(name)} has no exercise solution"
    assert not problems, f"{short(name)}: {problems}"


@pytest.mark.parametrize("name", [*PAGES, *ZH_PAGES], ids=short)
def test_math_renders(pages, name):
    problems = math_problems(pages.open(name).page)
    assert not problems, f"{short(name)}: {problems}"


@pytest.mark.skipif(
    "book/03_multi_head" not in PAGES, reason="chapter 3 not in the toc"
)
def test_search_finds_multi_head(browser, server):
    page = Visit(browser, f"{server}/search.html?q=multi-head").page
    page.wait_for_selector("#search-results ul.search li a", timeout=60_000)
    hrefs = page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.getAttribute('href'))"
    )
    page.close()
    assert any("03_multi_head" in h for h in hrefs), hrefs


@pytest.mark.parametrize("name", ZH_PAGES, ids=short)
def test_chinese_headings_render_in_a_cjk_font(pages, name):
    page = pages.open(name).page
    text = page.locator("h1").first.inner_text()
    missing = heading_tofu(page)
    assert any(ord(ch) > 0x2E80 for ch in text), f"{name}: no Chinese heading: {text}"
    assert not missing, (
        f"{name}: {missing} render as empty boxes (install fonts-noto-cjk)"
    )


def test_tofu_check_rejects_characters_no_font_has(browser):
    page = browser.new_page()
    page.set_content("<html lang='zh-CN'><body><h1>注意力</h1></body></html>")
    assert tofu(page, "\ue001\ue002", "16px sans-serif") == ["\ue001", "\ue002"]
    assert tofu(page, "注意力", "16px sans-serif") == []
    page.close()


@pytest.mark.skipif(not ZH_PAGES, reason="no Chinese page")
def test_chinese_search_finds_a_chinese_word(browser, server):
    page = Visit(browser, f"{server}/zh/search.html?q=沙箱").page
    page.wait_for_selector("#search-results ul.search li a", timeout=60_000)
    hrefs = page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.getAttribute('href'))"
    )
    page.close()
    assert any("instructor_guide" in h for h in hrefs), hrefs


# The Chinese search (book/_ext/zh_edition.py): every glossary term, typed into the
# search page's box, finds a page whose body text (headings left out) contains it.
# Chinese review 2026-12-03, M1: 17 of 33 terms found nothing, 14 only a section title.
_SEARCH = """(query) => {
  const [q, terms, excluded, highlight, objects] = Search._parseQuery(query);
  return Search._performSearch(q, terms, excluded, highlight, objects).map((r) => r[0]);
}"""


def glossary_terms() -> list[str]:
    glossary = yaml.safe_load((ROOT / "book" / "zh" / "glossary.yml").read_text())
    return list(dict.fromkeys(term["zh"] for term in glossary["terms"]))


def _words(text: str) -> str:
    return " ".join(text.split())


def body_text(html_file: Path) -> str:
    """A built page's article text without its headings (what a section title match
    does not stand for)."""
    soup = BeautifulSoup(html_file.read_text(), "html.parser")
    main = soup.select_one("article") or soup.body
    for el in main.select("h1, h2, h3, h4, h5, h6, script, style, .headerlink"):
        el.decompose()
    return _words(main.get_text(" "))


def search_problems(page, terms: list[str], body_of) -> list[str]:
    """Each term typed into the open search page's box: the problem when none of the
    pages the search lists has it in its body text (``body_of(docname)``)."""
    box = page.locator('input[name="q"]:visible').first
    page.wait_for_function("() => Search.hasIndex()", timeout=60_000)
    problems = []
    for term in terms:
        box.fill(term)
        found = page.evaluate(_SEARCH, box.input_value())
        if not any(_words(term) in body_of(doc) for doc in found):
            problems.append(f"{term}: {found[:4] or 'no result'}")
    return problems


# the terms the review found nothing for (M1), each written in some page's body
REVIEW_TERMS = (
    "键 值 头 束搜索 贪心解码 层规范化 自注意力 残差连接 前馈网络 "
    "标签平滑 图像块 零样本 对比学习"
)


@pytest.mark.skipif(not ZH_PAGES, reason="no Chinese page")
def test_chinese_search_finds_every_glossary_term_in_body_text(browser, server, site):
    """Every glossary term that a Chinese page's body writes (the glossary also lists
    a few terms only to settle a choice, e.g. 注意力汇聚, which no page writes)."""
    bodies = {}

    def body_of(doc: str) -> str:
        if doc not in bodies:
            path = site / "zh" / f"{doc}.html"
            bodies[doc] = body_text(path) if path.exists() else ""
        return bodies[doc]

    written = " ".join(body_of(page.removeprefix("zh/")) for page in ZH_PAGES)
    terms = [t for t in glossary_terms() if _words(t) in written]
    assert set(REVIEW_TERMS.split()) <= set(terms), "the body text was not read"
    visit = Visit(browser, f"{server}/zh/search.html")
    try:
        problems = search_problems(visit.page, terms, body_of)
        # known wrong: a term no page writes is reported, whatever pages its
        # characters find
        wrong = search_problems(visit.page, ["不存在的术语"], body_of)
    finally:
        visit.page.close()
    assert not problems, problems
    assert [w.split(":")[0] for w in wrong] == ["不存在的术语"], wrong


# -- every check rejects a known-broken page ---------------------------------------------

BROKEN = """<html lang="en"><head><title>broken</title>
<link rel="stylesheet" href="https://cdn.example.org/font-awesome.css"></head><body>
<script>console.error("boom");</script>
<img id="_anim_imgX" src="data:image/png;base64,AAAA">
<input class="anim-slider" id="_anim_sliderX" type="range" min="0" max="3" value="0">
<div class="tc-interactive"><label>t <input type="range" min="0" max="2" value="0"
 data-control="0"> <span class="tc-value"></span></label>
<img class="tc-frame" alt="x" src="data:image/png;base64,AAAA"></div>
<div class="solution dropdown admonition"><p class="admonition-title">Solution</p>
<pre>print(1)</pre><button class="toggle-button">open</button></div>
<span class="math">\\(x^2\\)</span>
</body></html>"""


def test_checks_reject_a_broken_page(browser):
    visit = Visit(browser, html=BROKEN)
    page = visit.page
    assert visit.outside == ["https://cdn.example.org/font-awesome.css"]
    assert any("boom" in e for e in visit.errors)
    assert animation_problems(page) == [
        "animation 0: moving the slider did not change the frame"
    ]
    problems = interactive_problems(page)
    assert "view 0: control 0 (input) did not change the image" in problems
    assert "view 0: slider 0 shows no value" in problems
    assert solution_problems(page) == ["solution 0: visible before clicking"]
    assert math_problems(page, timeout=500) == ["MathJax did not render any formula"]
    page.close()


@pytest.mark.parametrize("name", [*CHAPTERS, *ZH_CHAPTERS], ids=short)
def test_every_animation_control_shows_an_icon(pages, name):
    page = pages.open(name).page  # scrolls it, and changes nothing else
    count = page.locator("div.anim-buttons button").count()
    problems = animation_control_problems(page)
    assert count, f"{short(name)} has no animation controls"
    assert not problems, f"{short(name)}: {problems}"


def test_animation_html_controls_show_icons(browser):
    """The same check on a page holding only ``animation_html``'s output, as Jupyter or
    Colab shows it (no site stylesheet, no web font)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    from transformer_course.viz import animation_html

    fig, ax = plt.subplots(figsize=(2, 2))
    anim = FuncAnimation(fig, lambda i: ax.set_title(f"frame {i}"), frames=3)
    html = f"<html lang='en'><body>{animation_html(anim).data}</body></html>"
    visit = Visit(browser, html=html)
    count = visit.page.locator("div.anim-buttons button").count()
    problems = animation_control_problems(visit.page)
    visit.page.close()
    assert count == 9 and not problems, problems
    assert not visit.outside and not visit.errors


GLYPHS = """<html lang="en"><body><div class="anim-buttons">
<button title="First frame">\u23ee</button>
<button title="Play"><svg width="14" height="14" viewBox="0 0 16 16"></svg></button>
<button title="Pause"><svg width="14" height="14" viewBox="0 0 16 16">
 <path fill="currentColor" d="M3 2h4v12H3z" style="visibility: hidden"/></svg></button>
<button title="Next frame"><i class="fa fa-step-forward"></i></button>
<button title="Last frame"><svg width="14" height="14" viewBox="0 0 16 16">
 <path fill="currentColor" d="M2 2v12l8-6z"/></svg></button>
</div></body></html>"""


def test_icon_check_rejects_glyphs_and_empty_icons(browser):
    visit = Visit(browser, html=GLYPHS)
    problems = animation_control_problems(visit.page)
    visit.page.close()
    assert len(problems) == 4, problems
    assert problems[0].startswith("control 0 (First frame): shows the text")
    assert (
        problems[1]
        == "control 1 (Play): no visible icon (svg, image or web-font glyph)"
    )
    assert problems[2] == "control 2 (Pause): its svg icon is blank"
    assert problems[3].startswith("control 3 (Next frame): no visible icon")


# -- the page a worker shares between a page's tests (browsing.Pages) --------------------


class _FakePage:
    """What Visit and Pages ask of a Playwright page, without a browser."""

    def __init__(self, url_log, *, fail=False):
        self.closed, self.fail, self.url_log = False, fail, url_log

    def on(self, event, handler):
        pass

    def route(self, pattern, handler):
        pass

    def goto(self, url, wait_until):
        self.url_log.append(url)
        if self.fail:
            raise TimeoutError(url)

    def is_closed(self):
        return self.closed

    def close(self):
        self.closed = True


class _FakeBrowser:
    def __init__(self):
        self.loads, self.pages, self.fail = [], [], False

    def new_page(self, viewport):
        self.pages.append(_FakePage(self.loads, fail=self.fail))
        return self.pages[-1]


def test_pages_loads_a_page_again_once_a_test_changed_it():
    browser = _FakeBrowser()
    pages = Pages(browser, "http://site")
    first = pages.open("book/01_qkv", fresh=True)
    assert pages.open("book/01_qkv") is first  # read-only checks share the load
    assert pages.open("book/01_qkv", changes="views") is first
    assert pages.open("book/01_qkv", changes="solutions") is first  # another part
    # known wrong: the views were changed already
    assert pages.open("book/01_qkv", changes="views") is not first
    second = pages.visit
    assert first.page.closed and not second.page.closed  # one page open at a time
    assert pages.open("book/01_qkv") is not second  # a read-only check after a change
    third = pages.visit
    assert pages.open("book/01_qkv", fresh=True) is not third  # its own load's records
    assert pages.open("zh/01_qkv") is not pages.open("book/01_qkv")  # another page
    assert browser.loads == ["http://site/book/01_qkv.html"] * 4 + [
        "http://site/zh/01_qkv.html",
        "http://site/book/01_qkv.html",
    ]
    assert sum(not p.closed for p in browser.pages) == 1
    browser.fail = True  # a page that fails to load is closed, and not handed on
    with pytest.raises(TimeoutError):
        pages.open("book/02_scaled")
    assert pages.visit is None and all(p.closed for p in browser.pages)
    browser.fail = False
    pages.open("book/02_scaled")
    pages.close()
    assert pages.visit is None and all(p.closed for p in browser.pages)
