"""Measure how the built chapters read: open every chapter page of a built site in
Debian's chromium at 1280 px (Playwright) and print, per chapter, its height in screens
of 1000 px, the share of that height taken by visible code cells (a collapsed cell
counts as its toggle) and by figures + diagrams + animations + live views (a
``div.live-view`` as a whole: the heatmaps and numbers the reader drives), the number of diagrams
(``<figure class="tc-diagram">``, written by ``transformer_course.viz.diagrams``) and of
animations (``div.animation`` from ``to_jshtml``), the code cells and outputs that
scroll sideways, the display equations wider than the column they sit in (MathJax's
rendered width against the width of the block that holds ``div.math``: such an equation
scrolls or is cut off, whatever the style sheet does with it; one inside a closed
solution counts too, its width in ex converted to px, against the article's width), and
the smallest figure
text in px (the ``data-min-text-px`` the viz functions attach to diagrams and
``img.tc-figure``). It waits for MathJax to finish typesetting before it measures.

    python tools/measure_pages.py [_build/html] [--json]

``measure(page)`` (one loaded Playwright page) and ``measure_site(site, browser)`` are
importable, for a browser test.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update"]  # fmt: skip
WIDTH, SCREEN = 1280, 1000  # window width; one "screen" of page height

# Runs in the page; returns the raw measurements (px) of the article.
_MEASURE_JS = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;  // equations typeset: their widths are final
  }
  // inside a closed <details> nothing shows, whatever its boxes say
  const boxed = (el) => el.getClientRects().length > 0;
  const shown = (el) => boxed(el) && !el.closest("details:not([open])");
  const height = (el) => boxed(el) ? el.getBoundingClientRect().height : 0;
  const sum = (els) => els.reduce((a, el) => a + height(el), 0);
  const all = (sel) => Array.from(document.querySelectorAll(sel));
  const outside = (el, sel) => !el.parentElement || !el.parentElement.closest(sel);
  const code = all(".cell_input").filter(shown);
  const toggles = all("details.hide > summary, details.above-input > summary")
    .filter((s) => !s.parentElement.open);
  const diagrams = all(".tc-diagram").filter(shown);
  const animations = all("div.animation").filter(shown);
  // a live view (live.js: heatmaps and numbers the reader drives) is a figure as a whole
  const live = all(".live-view").filter(shown);
  const pictures = ".tc-diagram, div.animation, .live-view";
  const images = all(".cell_output img, .cell_output > .output svg")
    .filter((el) => shown(el) && outside(el, pictures));
  const wide = all(".cell_input pre, .cell_output pre, .cell_output .output")
    .filter((el) => shown(el) && el.scrollWidth > el.clientWidth + 1)
    .map((el) => el.closest(".cell_input") ? "code" : "output");
  const sizes = all("[data-min-text-px]").map((el) => parseFloat(el.dataset.minTextPx));
  // every display equation, shown or inside a closed solution, against the content
  // width of the block around its div.math (of the article, when it is not shown)
  const inner = (box) => {
    const style = getComputedStyle(box);
    return box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  };
  const article = document.querySelector("article.bd-article, article, main") || document.body;
  const column = (el) => inner(shown(el) ? el.closest("div.math").parentElement : article);
  const width = (el) => {  // the rendered width, or the svg's own width in ex as px
    const svg = el.querySelector(":scope > svg");
    if (!svg) return el.scrollWidth;
    if (shown(el)) return svg.getBoundingClientRect().width;
    const probe = document.createElement("div");
    probe.style.width = svg.getAttribute("width");
    el.appendChild(probe);
    const px = parseFloat(getComputedStyle(probe).width);
    probe.remove();
    return px;
  };
  const mathWidths = all("div.math mjx-container[display='true']")
    .map((el) => [width(el), column(el)]);
  return {
    height: document.documentElement.scrollHeight,
    code: sum(code) + sum(toggles),
    figures: sum(diagrams) + sum(animations) + sum(images) + sum(live),
    diagrams: diagrams.length,
    animations: animations.length,
    wide_code: wide.filter((w) => w === "code").length,
    wide_outputs: wide.filter((w) => w === "output").length,
    min_text_px: sizes.length ? Math.min(...sizes) : null,
    wide_math_px: mathWidths.filter(([w, c]) => w > c + 1).map(([w, c]) => Math.round(w)),
    math: mathWidths.length,
  };
}
"""


def measure(page) -> dict:
    """Measurements of one loaded page: ``screens`` (height / 1000 px), ``code_share``
    and ``figure_share`` (fractions of the height), ``diagrams``, ``animations``,
    ``wide_code`` and ``wide_outputs`` (elements that scroll sideways), ``math`` (display
    equations), ``wide_math`` (those wider than their column) with ``wide_math_px``
    (their widths, px) and ``min_text_px`` (None when no figure states it)."""
    raw = page.evaluate(_MEASURE_JS)
    h = max(raw["height"], 1)
    return {
        "screens": raw["height"] / SCREEN,
        "code_share": raw["code"] / h,
        "figure_share": raw["figures"] / h,
        **{k: raw[k] for k in ("diagrams", "animations", "wide_code", "wide_outputs")},
        "math": raw["math"],
        "wide_math": len(raw["wide_math_px"]),
        "wide_math_px": raw["wide_math_px"],
        "min_text_px": raw["min_text_px"],
    }


# The bar every chapter page meets (issue 25, "Done when"; tests/site/test_measure_pages.py).
BAR = {
    "code_share": ("<=", 0.20),  # visible code, a collapsed cell counting as its toggle
    "figure_share": (">=", 0.20),  # figures, diagrams and animations
    "diagrams": (">=", 1),  # drawn from a module (viz.diagram) or a schematic
    "animations": (">=", 2),
    "wide_code": ("<=", 0),  # code cells that scroll sideways
    "wide_outputs": ("<=", 0),
    "wide_math": ("<=", 0),  # display equations wider than the column
    "min_text_px": (">=", 10.0),  # the smallest figure text on the page
}


def bar_problems(m: dict) -> list[str]:
    """What of ``BAR`` the measurements ``m`` (from ``measure``) miss, in words; a page
    whose figures state no text size misses the text bar (it cannot be checked)."""
    problems = []
    for key, (op, limit) in BAR.items():
        value = m.get(key)
        ok = value is not None and (value <= limit if op == "<=" else value >= limit)
        if not ok:
            shown = (
                f"{value:.0%}" if key.endswith("share") and value is not None else value
            )
            if key == "wide_math":
                shown = f"{value} ({', '.join(f'{w} px' for w in m.get('wide_math_px', []))})"
            problems.append(f"{key} {shown}, expected {op} {limit}")
    return problems


def chapter_pages(site: Path) -> list[Path]:
    """The chapter pages of a built site: ``book/NN_*.html``."""
    return sorted((site / "book").glob("[0-9][0-9]_*.html"))


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def measure_site(site: Path, browser) -> dict[str, dict]:
    """``measure`` of every chapter page of ``site``, served locally, in ``browser``
    (a Playwright Browser) at 1280 px. Returns {page name: measurements}."""
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    results = {}
    try:
        for path in chapter_pages(site):
            page = browser.new_page(viewport={"width": WIDTH, "height": SCREEN})
            page.goto(f"{url}/{path.relative_to(site).as_posix()}", wait_until="load")
            results[path.stem] = measure(page)
            page.close()
    finally:
        httpd.shutdown()
    return results


def table(results: dict[str, dict]) -> str:
    """The measurements as a Markdown table."""
    head = ("| chapter | screens | code | figures | diagrams | animations | "
            "wide code | wide outputs | wide equations | smallest text px |")  # fmt: skip
    rows = [head, "|" + "---|" * 10]
    for name, m in results.items():
        px = "?" if m["min_text_px"] is None else f"{m['min_text_px']:.1f}"
        rows.append(
            f"| {name} | {m['screens']:.1f} | {m['code_share']:.0%} | "
            f"{m['figure_share']:.0%} | {m['diagrams']} | {m['animations']} | "
            f"{m['wide_code']} | {m['wide_outputs']} | {m['wide_math']} | {px} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default="_build/html", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args(argv)
    if not chapter_pages(args.site):
        print(
            f"{args.site}: no chapter pages (book/NN_*.html); run make book",
            file=sys.stderr,
        )
        return 2
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        results = measure_site(args.site, browser)
        browser.close()
    print(json.dumps(results, indent=1) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
