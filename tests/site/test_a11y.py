"""Accessibility of the built site: axe-core (npm, pinned in package.json) runs in
Debian's chromium on every page of the toc and no serious or critical violation may
remain; every figure image has alt text or a caption.

axe-core is injected from node_modules/axe-core/axe.min.js (installed by `npm ci` in
`make book`), so the check is offline like the site itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browsing import PAGES, ZH_PAGES, short
from bs4 import BeautifulSoup

pytestmark = [pytest.mark.site, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING = {"serious", "critical"}


def axe_violations(page) -> list[dict]:
    """Run axe-core on the open page; return its violations (every impact)."""
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `npm ci` (make book does)")
    # the page's final layout: fonts loaded, MathJax done, and the theme's and
    # course.js's passes over scrollable blocks (debounced 300 ms) run
    page.evaluate(
        "async () => { await document.fonts.ready;"
        " const s = window.MathJax && window.MathJax.startup;"
        " if (s && s.promise) await s.promise;"
        " await new Promise(r => setTimeout(r, 500)); }"
    )
    page.add_script_tag(content=AXE.read_text())
    result = page.evaluate(
        "async () => await axe.run(document, {resultTypes: ['violations']})"
    )
    return result["violations"]


def describe(violations: list[dict]) -> str:
    lines = []
    for v in violations:
        targets = [
            " ".join(n["target"]) if isinstance(n["target"], list) else n["target"]
            for n in v["nodes"][:3]
        ]
        lines.append(
            f"[{v['impact']}] {v['id']}: {v['help']} ({len(v['nodes'])} nodes, "
            f"e.g. {json.dumps(targets)[:300]})"
        )
    return "\n".join(lines)


@pytest.mark.parametrize(
    "name", [*PAGES, "search", "genindex", *ZH_PAGES, "zh/search"], ids=short
)
def test_no_serious_or_critical_axe_violation(pages, name):
    violations = axe_violations(pages.open(name).page)  # adds axe-core to the page
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    assert not blocking, f"{name}: axe-core found\n{describe(blocking)}"


def test_axe_rejects_a_page_with_known_violations(browser, server):
    """The check can fail: an image without alt text and an unlabelled slider (the
    kinds of output a chapter makes) are serious/critical violations."""
    page = browser.new_page()
    page.set_content(
        "<html lang='en'><head><title>t</title></head><body><main><h1>t</h1>"
        "<img src='data:image/png;base64,iVBORw0KGgo='>"
        "<input type='range' min='0' max='3'></main></body></html>"
    )
    ids = {v["id"] for v in axe_violations(page) if v["impact"] in BLOCKING}
    page.close()
    assert {"image-alt", "label"} <= ids


FILE_NAME = re.compile(r"^\S+\.(png|jpe?g|gif|svg|webp)$", re.IGNORECASE)


def missing_alt(html: str) -> list[str]:
    """Figure images (cell outputs, figures, animations, interactive views) with neither
    alt text nor a caption (a <figcaption> of an enclosing figure). An alt that is only
    the image's file name, which Sphinx writes when none is given, does not count."""
    soup = BeautifulSoup(html, "html.parser")
    bad = []
    for img in soup.select("div.cell_output img, figure img, div.tc-interactive img"):
        alt = (img.get("alt") or "").strip()
        figure = img.find_parent("figure")
        caption = figure.find("figcaption") if figure else None
        if (alt and not FILE_NAME.match(alt)) or (
            caption and caption.get_text(strip=True)
        ):
            continue
        bad.append(str(img)[:160])
    return bad


@pytest.mark.parametrize("name", [*PAGES, *ZH_PAGES], ids=short)
def test_every_figure_has_alt_text_or_a_caption(site, name):
    path = site / f"{name}.html"
    assert path.exists(), f"{path} was not built"
    bad = missing_alt(path.read_text())
    assert not bad, f"{name}: {len(bad)} figure(s) without alt text, e.g. {bad[:3]}"


def test_alt_text_check_rejects_a_bare_image():
    html = (
        "<div class='cell_output'><img src='x.png' alt=''>"
        "<img src='../_images/ab12.png' alt='../_images/ab12.png'>"
        "<img src='z.png' alt='Heatmap of attention weights'></div>"
        "<figure><img src='y.png'><figcaption>Weights</figcaption></figure>"
    )
    bad = missing_alt(html)
    assert len(bad) == 2
    assert "x.png" in bad[0] and "ab12.png" in bad[1]
