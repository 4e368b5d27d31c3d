"""The built site (_build/html): every chapter page exists, links to its notebook in
Colab, embeds its animations and interactive views, has no empty output and loads
nothing from another host."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml
from bs4 import BeautifulSoup

pytestmark = pytest.mark.site

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted(re.findall(r"file: book/(\d\d_\w+)", (ROOT / "_toc.yml").read_text()))
PAGES = ["intro", "references", *CHAPTERS]
# The Chinese chapters ("zh/01_qkv", in _build/html/zh/) pass the chapter tests too.
ZH_CHAPTERS = [
    f"zh/{name}"
    for name in sorted(
        re.findall(r"file: (\d\d_\w+)", (ROOT / "book" / "zh" / "_toc.yml").read_text())
    )
]
BOTH = [*CHAPTERS, *ZH_CHAPTERS]


def page_path(site: Path, name: str) -> Path:
    """The built page of "01_qkv" (English, book/) or "zh/01_qkv" (Chinese, zh/)."""
    return (
        site / f"{name}.html"
        if name.startswith("zh/")
        else site / "book" / f"{name}.html"
    )


@functools.cache
def _parsed(path: Path, mtime_ns: int) -> BeautifulSoup:
    """A built page parsed once per worker (and again only when it changes on disk):
    every test reads a page's tree, none changes it, and parsing a 1-1.5 MB chapter
    page was most of this file's time (each page's tests parsed it 6 to 9 times)."""
    return BeautifulSoup(path.read_text(), "html.parser")


def parsed(path: Path) -> BeautifulSoup:
    return _parsed(path, path.stat().st_mtime_ns)


def page(site: Path, name: str) -> BeautifulSoup:
    path = page_path(site, name)
    assert path.exists(), f"{path} was not built"
    return parsed(path)


def outputs(soup: BeautifulSoup):
    return soup.select("div.cell_output")


@pytest.mark.parametrize("name", PAGES)
def test_page_is_built_with_a_title(site, name):
    soup = page(site, name)
    assert soup.find("h1"), f"{name} has no title"


@pytest.mark.parametrize("name", BOTH)
def test_colab_link_points_at_the_generated_notebook(site, name):
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    owner_repo = repo["url"].removeprefix("https://github.com/")
    expected = (
        f"https://colab.research.google.com/github/{owner_repo}/blob/"
        f"{repo['branch']}/notebooks/{name}.ipynb"
    )  # a Chinese page opens notebooks/zh/<chapter>.ipynb
    hrefs = [a["href"] for a in page(site, name).find_all("a", href=True)]
    assert expected in hrefs
    assert (ROOT / "notebooks" / f"{name}.ipynb").exists()


@pytest.mark.parametrize("name", PAGES)
def test_no_launch_link_points_at_markdown(site, name):
    for a in page(site, name).find_all("a", href=True):
        if "colab" in a["href"] or "binder" in a["href"]:
            assert not a["href"].endswith(".md"), a["href"]


@pytest.mark.parametrize("name", BOTH)
def test_no_empty_output_area(site, name):
    for out in outputs(page(site, name)):
        has_media = out.find(["img", "svg", "iframe", "video"]) is not None
        assert out.get_text(strip=True) or has_media, f"empty output in {name}: {out}"[
            :300
        ]


TEX = re.compile(r"\$[^$\n]{1,80}\$|\\\(.{1,80}?\\\)")  # $...$ or \(...\) as text
NOT_PROSE = {"pre", "code", "script", "style", "textarea"}


@pytest.mark.parametrize("name", [*PAGES, *ZH_CHAPTERS, "zh/references"])
def test_no_tex_left_as_text(site, name):
    """Math that MathJax never sees (it reads the elements MyST marks as math) shows
    its dollars to the reader: a bibliography title with $O(n^2)$ did."""
    left = []
    for text in page(site, name).find_all(string=TEX):
        around = [p for p in text.parents if p.name]
        if any(
            p.name in NOT_PROSE or {"math", "cell_output"} & set(p.get("class") or [])
            for p in around
        ):
            continue  # code, printed output, or math MathJax typesets
        left.append(text.strip()[:100])
    assert not left, f"{name}: TeX left as plain text: {left}"


@pytest.mark.parametrize("name", BOTH)
def test_no_unrendered_widgets(site, name):
    html = page_path(site, name).read_text()
    assert "application/vnd.jupyter.widget-view+json" not in html, (
        "a live ipywidget reached the static site; use viz.interactive.interactive"
    )


@pytest.mark.parametrize("name", BOTH)
def test_each_animation_is_one_html_output_without_stray_image(site, name):
    soup = page(site, name)
    animated = [c for c in soup.select("div.cell") if c.select_one("input.anim-slider")]
    if name.endswith("01_qkv"):
        assert animated, "chapter 1 must embed its animation"
    for cell in animated:
        outs = cell.select("div.cell_output > div.output")
        assert len(outs) == 1, f"{name}: an animation cell has {len(outs)} outputs"
        stray = [
            img
            for img in cell.select("div.cell_output img")
            if "_images/" in img.get("src", "")
        ]
        assert not stray, f"{name}: a stray still frame beside the animation"
        assert "font-awesome" not in str(cell) and "bootstrapcdn" not in str(cell)


def test_chapter_1_has_its_interactive_view_and_figure(site):
    soup = page(site, "01_qkv")
    view = soup.select_one("div.tc-interactive")
    assert view is not None and view.select("[data-control]")
    assert view.select_one("img.tc-frame")["alt"]
    assert soup.select("div.cell_output img"), "no figure"


@pytest.mark.parametrize("name", PAGES)
def test_nothing_is_loaded_from_another_host(site, name):
    soup = page(site, name)
    for tag, attr in (
        ("script", "src"),
        ("link", "href"),
        ("img", "src"),
        ("iframe", "src"),
    ):
        for el in soup.find_all(tag):
            url = el.get(attr)
            if not url or (
                tag == "link"
                and "stylesheet" not in el.get("rel", [])
                and "preload" not in el.get("rel", [])
            ):
                continue
            assert not re.match(r"^(https?:)?//", url), f"{name}: <{tag}> loads {url}"


def test_mathjax_is_served_by_the_site(site):
    soup = page(site, "01_qkv")
    srcs = [s.get("src", "") for s in soup.find_all("script")]
    assert any("vendor/mathjax/tex-svg.js" in s for s in srcs)
    assert (
        site / "_static" / "vendor" / "mathjax" / "tex-svg.js"
    ).stat().st_size > 1_000_000


def test_solutions_start_hidden(site):
    soup = page(site, "01_qkv")
    solutions = soup.select("div.solution")
    assert len(solutions) >= 3
    for sol in solutions:
        assert "dropdown" in sol.get("class", []), "solutions must start collapsed"


def test_citations_resolve(site):
    soup = page(site, "01_qkv")
    cites = soup.select("a[href*='#id']") + soup.select("span.citation")
    text = soup.get_text()
    assert "Vaswani" in text and "Bahdanau" in text
    assert cites or soup.select("div.citation"), "no resolved citation"


# -- the Chinese edition (book/zh/, built into _build/html/zh/) -------------------------

ZH_PAGES = [
    p.stem
    for p in sorted((ROOT / "book" / "zh").glob("*.md"))
    if p.stem in (ROOT / "book" / "zh" / "_toc.yml").read_text()
]


def zh_page(site: Path, name: str) -> BeautifulSoup:
    path = site / "zh" / f"{name}.html"
    assert path.exists(), f"{path} was not built (tools/build_book.py --edition zh)"
    return parsed(path)


def broken_links(html_file: Path, soup: BeautifulSoup) -> list[str]:
    """Links of a page to this site that point at no file."""
    bad = []
    for a in soup.find_all("a", href=True):
        href = a["href"].split("#")[0].split("?")[0]
        if not href or re.match(r"^([a-z]+:|//)", href):
            continue
        if not (html_file.parent / href).resolve().exists():
            bad.append(a["href"])
    return bad


@pytest.mark.parametrize("name", ZH_PAGES)
def test_chinese_page_is_built_in_chinese(site, name):
    soup = zh_page(site, name)
    assert soup.html.get("lang") == "zh-CN"
    assert re.search(r"[\u4e00-\u9fff]", soup.find("h1").get_text()), name


@pytest.mark.parametrize("name", ZH_PAGES)
def test_each_edition_links_to_the_other(site, name):
    to_english = [a["href"] for a in zh_page(site, name).select("p.edition-link a")]
    assert to_english == [f"../book/{name}.html"]
    english = parsed(site / "book" / f"{name}.html")
    to_chinese = [a["href"] for a in english.select("p.edition-link a")]
    assert to_chinese == [f"../zh/{name}.html"]


@pytest.mark.parametrize("name", ZH_PAGES)
def test_every_link_of_a_chinese_page_resolves(site, name):
    path = site / "zh" / f"{name}.html"
    assert not broken_links(path, zh_page(site, name))


def test_link_check_rejects_a_missing_page(tmp_path):
    page = tmp_path / "zh" / "intro.html"
    page.parent.mkdir()
    page.write_text("")
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "intro.html").write_text("")
    soup = BeautifulSoup(
        '<a href="../book/intro.html#x">ok</a><a href="../book/gone.html">no</a>'
        '<a href="https://example.org">out</a><a href="#top">here</a>',
        "html.parser",
    )
    assert broken_links(page, soup) == ["../book/gone.html"]


@pytest.mark.parametrize("name", ZH_PAGES)
def test_nothing_is_loaded_from_another_host_in_chinese(site, name):
    soup = zh_page(site, name)
    for el in soup.find_all(["script", "img", "iframe"], src=True):
        assert not re.match(r"^(https?:)?//", el["src"]), f"{name}: loads {el['src']}"
    for el in soup.find_all("link", href=True):
        rel = el.get("rel", [])
        if "stylesheet" in rel or "preload" in rel:
            assert not re.match(r"^(https?:)?//", el["href"]), el["href"]


# -- the Chinese pages in Chinese (Chinese review 2026-12-03, M2-M4; issue 41) ----------


def _zh_edition():
    import importlib.util

    path = ROOT / "book" / "_ext" / "zh_edition.py"
    spec = importlib.util.spec_from_file_location("zh_edition", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zh_edition = _zh_edition()
# the theme's and myst-nb's English, which a Chinese page must not show
THEME_ENGLISH = [
    "Search this book",
    "Show code cell",
    "Hide code cell",
    "Toggle primary sidebar",
    "Toggle secondary sidebar",
    "Link to this heading",
    "Color mode",
]
_HAN = re.compile(r"[\u4e00-\u9fff]")


def english_on_a_chinese_page(soup: BeautifulSoup) -> list[str]:
    """What a Chinese page shows in English that the edition translates: a self-check
    line the catalog has in Chinese (in an output), a theme or myst-nb string (text or
    title, aria-label, placeholder), an animation player's label; and an image whose
    English alt text is not marked lang="en"."""
    problems = []
    for block in soup.select("div.cell_output pre"):
        text = block.get_text()
        chinese = zh_edition.translate_output(text)
        if chinese != text:
            english = [
                a for a, b in zip(text.split("\n"), chinese.split("\n")) if a != b
            ]
            problems += [
                f"self-check line in English: {line[:80]!r}" for line in english
            ]
    for el in soup.find_all(True):
        if el.name in ("script", "style"):
            continue
        shown = [el.get(a, "") for a in ("title", "aria-label", "placeholder")]
        own = "".join(t for t in el.find_all(string=True, recursive=False))
        for text in [*shown, own]:
            for english in THEME_ENGLISH:
                if english in text:
                    problems.append(f"theme string in English: {english!r} ({el.name})")
        player = [t for t in [*shown, own.strip()] if t in zh_edition.PLAYER]
        if player and (
            el.find_parent("div", class_="tc-animation")
            or "anim" in " ".join(el.get("class", []) + [el.get("id", "")])
        ):
            problems += [f"animation label in English: {text!r}" for text in player]
        alt = el.get("alt") if el.name == "img" else None
        if alt and not _HAN.search(alt) and el.get("lang") != "en":
            problems.append(f"English alt text not marked lang=en: {alt[:60]!r}")
    return problems


@pytest.mark.parametrize("name", ZH_PAGES)
def test_a_chinese_page_shows_no_english_the_edition_translates(site, name):
    problems = english_on_a_chinese_page(zh_page(site, name))
    assert not problems, f"zh/{name}: {sorted(set(problems))[:12]}"


def test_the_english_check_rejects_an_english_page():
    """Known wrong: what the Chinese build rendered before issue 41 (an English
    self-check output, the theme's search text and toggle, an English player)."""
    soup = BeautifulSoup(
        '<input placeholder="Search this book..."><p class="collapsed">Show code cell '
        'source</p><div class="cell_output"><pre>not attempted yet: soft_lookup raises '
        "NotImplementedError;\nwrite its body and run this cell again.\npassed: "
        "causal masks right, square and bottom-right aligned\nan ordinary line</pre>"
        '</div><div class="tc-animation"><button title="Play" aria-label="Play">'
        '</button><label for="_anim_radio1_x">Once</label><img id="_anim_imgx" '
        'alt="Animation. Figure: attention"></div>',
        "html.parser",
    )
    problems = english_on_a_chinese_page(soup)
    assert len([p for p in problems if p.startswith("self-check")]) == 3, problems
    assert any("Search this book" in p for p in problems)
    assert any("Show code cell" in p for p in problems)
    assert any("'Play'" in p for p in problems) and any("'Once'" in p for p in problems)
    assert any(p.startswith("English alt text") for p in problems)
    fixed = BeautifulSoup(zh_edition.chinese_furniture(str(soup)), "html.parser")
    assert not [p for p in english_on_a_chinese_page(fixed) if "animation" in p]
