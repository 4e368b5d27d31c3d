"""The live views (issue 45) in headless Chromium on the built site: bytes and times.

    python benchmarks/live_views.py                       # the built site (_build/html)
    python benchmarks/live_views.py --site DIR --pages index   # any folder of pages

For each page (default: the chapters with live views, English edition) the page is
served from ``--site`` on 127.0.0.1 and opened in Debian's chromium (Playwright, as the
site tests), and this is measured:

- the page's first load: bytes of every response until the network is idle, with
  live.js and live.css and with both blocked (their difference is what the live views
  add to a page that has not pressed a button; the goal: at most 300 KB);
- each model view: the bytes its button fetches (the onnxruntime-web WebAssembly, the
  ONNX files, vocab.json), the seconds from the press to the first answer, of which the
  download and session set-up (``data-live-load-seconds``);
- MiniLM: the attention of a 20-token sentence (seconds a forward, median of
  ``--repeat``; the goal: within 2 s);
- the translator: its first answer after loading (the goal: within 1 s), seconds per
  generated token (the decoder re-run on the growing prefix) and per answer.

Writes ``results-live.json`` and ``results-live.md`` (into ``--out``, default this
folder), and its results into the shared reports there: the key "live_views" of
``results.json`` and the section "## Live views (benchmarks/live_views.py)" of
``results.md``, with the goals as rows (``benchmarks/run.py`` keeps both when it
rewrites the report). Numbers depend on the machine and its load; nothing here is a test of speed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PAGES = ["book/01_qkv", "book/03_multi_head", "book/06_transformer"]
GOALS = {
    "first_load_kb": 300,
    "translator_first_s": 1.0,
    "minilm_20_tokens_s": 2.0,
    "smollm2_tokens_per_s": 5.0,
}
# 18 words, one token each: with [CLS] and [SEP], 20 tokens
SENTENCE_20 = (
    "the quick brown fox jumps over the lazy dog while the small cat sleeps "
    "on the warm mat"
)
NUMBERS = ["seven hundred and eighty-one", "forty-two thousand and six", "ninety-nine"]
READY = "el => el.dataset.liveState === 'ready' || el.dataset.liveState === 'error'"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(folder: Path) -> tuple[ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def first_load_bytes(browser, url: str, block_live: bool) -> int:
    """Bytes of every response of one page load (a fresh context: nothing cached)."""
    context = browser.new_context()
    page = context.new_page()
    sizes = []
    page.on("requestfinished", lambda r: sizes.append(r.sizes()["responseBodySize"]))
    if block_live:
        page.route("**/_static/live.*", lambda route: route.abort())
    page.goto(url, wait_until="networkidle")
    context.close()
    return sum(sizes)


def model_view(page, el, kind: str, repeat: int) -> dict:
    """Press the button; time the first answer, then the forwards / tokens."""
    start = time.perf_counter()
    el.locator("button.live-load").click()
    page.wait_for_function(READY, arg=el.element_handle(), timeout=600_000)
    answered = time.perf_counter() - start
    if el.get_attribute("data-live-state") != "ready":
        return {"kind": kind, "error": el.locator(".live-status").first.text_content()}
    first = json.loads(el.get_attribute("data-live-result"))
    row = {
        "kind": kind,
        "bytes": int(el.get_attribute("data-live-bytes")),
        "load_s": float(el.get_attribute("data-live-load-seconds")),
        "press_to_answer_s": answered,
        "first_answer_s": first["seconds"],
    }

    def run(text):
        return page.evaluate(
            "([el, t]) => courseLive.run(el, t)", [el.element_handle(), text]
        )

    if kind == "minilm":
        results = [run(SENTENCE_20) for _ in range(repeat)]
        row["tokens"] = len(results[0]["tokens"])
        row["forward_s"] = statistics.median(r["seconds"] for r in results)
    else:
        results = [run(text) for _ in range(repeat) for text in NUMBERS]
        steps = [s for r in results for s in r["step_seconds"]]
        row["per_token_s"] = statistics.median(steps)
        row["per_answer_s"] = statistics.median(r["seconds"] for r in results)
        row["example"] = {"text": results[0]["text"], "output": results[0]["output"]}
    return row


def measure(site: Path, pages: list[str], repeat: int) -> dict:
    from playwright.sync_api import sync_playwright

    httpd, server = serve(site)
    out = {"pages": {}}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            for name in pages:
                url = f"{server}/{name}.html"
                with_live = first_load_bytes(browser, url, block_live=False)
                without = first_load_bytes(browser, url, block_live=True)
                entry = {
                    "first_load_bytes": with_live,
                    "first_load_bytes_without_live": without,
                    "live_added_bytes": with_live - without,
                    "views": [],
                }
                context = browser.new_context()
                page = context.new_page()
                page.goto(url, wait_until="networkidle")
                views = page.locator(".live-view")
                for i in range(views.count()):
                    el = views.nth(i)
                    kind = el.get_attribute("data-live-kind")
                    if kind in ("minilm", "translator"):
                        entry["views"].append(model_view(page, el, kind, repeat))
                    else:
                        entry["views"].append({"kind": kind})
                context.close()
                out["pages"][name] = entry
            browser.close()
    finally:
        httpd.shutdown()
    return out


HEADING = "## Live views (benchmarks/live_views.py)"


def tables(results: dict) -> list[str]:
    """The pages' first loads and each view's bytes and times, as markdown tables."""
    lines = [
        "| page | first load (bytes) | without live.js/css | added by the live views |",
        "|---|---:|---:|---:|",
    ]
    for name, e in results["pages"].items():
        lines.append(
            f"| {name} | {e['first_load_bytes']:,} | "
            f"{e['first_load_bytes_without_live']:,} | {e['live_added_bytes']:,} |"
        )
    lines += [
        "",
        (
            "| page | view | bytes on the press | load (s) | press to answer (s) "
            "| first answer (s) | forward (s) | per token (s) |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in results["pages"].items():
        for v in e["views"]:
            if "bytes" not in v:
                note = v.get("error", "computed in JavaScript, nothing loaded")
                lines.append(f"| {name} | {v['kind']} | {note} | | | | | |")
                continue
            fwd = (
                f"{v['forward_s']:.3f} ({v['tokens']} tokens)"
                if "forward_s" in v
                else ""
            )
            tok = f"{v['per_token_s']:.4f}" if "per_token_s" in v else ""
            lines.append(
                f"| {name} | {v['kind']} | {v['bytes']:,} | {v['load_s']:.2f} | "
                f"{v['press_to_answer_s']:.2f} | {v['first_answer_s']:.3f} | {fwd} | "
                f"{tok} |"
            )
    return lines


def machine_line(results: dict) -> str:
    m = results["machine"]
    return (
        f"Machine: {m['platform']}, {m['cpus']} CPUs; headless chromium, one "
        f"WebAssembly thread. Run: `{results.get('command', 'benchmarks/live_views.py')}`"
        f" at {results['started']}"
        + (f", {results['seconds']:.0f} s." if "seconds" in results else ".")
    )


def goal_table(rows: list[dict]) -> list[str]:
    lines = ["| measure | now | goal | met? |", "|---|---|---|---|"]
    for r in rows:
        met = {True: "yes", False: "NO"}.get(r["met?"], r["met?"])
        lines.append(f"| {r['measure']} | {r['now']} | {r['goal']} | {met} |")
    return lines


def report(results: dict) -> str:
    """results-live.md: the whole report."""
    lines = [
        "# Live views in the browser (issue 45)",
        "",
        machine_line(results),
        "",
        *tables(results),
        "",
        "Goals:",
        "",
        *goal_table(goals(results)),
    ]
    return "\n".join(lines) + "\n"


def section(results: dict) -> list[str]:
    """The "## Live views" section of benchmarks/results.md (run.py keeps it)."""
    return [
        HEADING,
        "",
        (
            "Issue 45's budgets, measured on the built site: what the live views add "
            "to a page's first load, each model's download and set-up, and its time "
            "per forward / per generated token. " + machine_line(results)
        ),
        "",
        *tables(results),
        "",
        *goal_table(goals(results)),
        "",
    ]


def update_shared_results(folder: Path, results: dict) -> None:
    """Add or replace the "live_views" key of results.json and this script's section
    of results.md (before its "## Goals", else at the end), keeping everything else
    (benchmarks/run.py writes the rest and keeps both when it rewrites them)."""
    path = folder / "results.json"
    shared = json.loads(path.read_text()) if path.exists() else {}
    shared["live_views"] = results
    path.write_text(json.dumps(shared, indent=2))
    path = folder / "results.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = "\n".join(section(results))
    pattern = re.compile(
        "^" + re.escape(HEADING) + r".*?(?=^## |\Z)", re.DOTALL | re.MULTILINE
    )
    goals_at = re.search(r"^## Goals", text, re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: block + "\n", text)
    elif goals_at:
        text = text[: goals_at.start()] + block + "\n" + text[goals_at.start() :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def _row(measure, now, goal, met) -> dict:
    return {"measure": measure, "now": now, "goal": goal, "met?": met}


def goals(results: dict) -> list[dict]:
    """Issue 45's budgets as rows: measure, now, goal, met? (True / False, or a note
    where nothing was measured)."""
    out = []
    pages = results["pages"]
    if pages:
        name, worst = max(pages.items(), key=lambda kv: kv[1]["live_added_bytes"])
        added = worst["live_added_bytes"]
        out.append(
            _row(
                f"first load added by live.js/css, worst of {len(pages)} pages ({name})",
                f"{added / 1000:.1f} KB",
                f"<= {GOALS['first_load_kb']} KB",
                added <= GOALS["first_load_kb"] * 1000,
            )
        )
    views = [(n, v) for n, e in pages.items() for v in e["views"]]
    for kind, measure, key, limit in (
        (
            "translator",
            "translator: first answer after its model loaded",
            "first_answer_s",
            GOALS["translator_first_s"],
        ),
        (
            "minilm",
            "MiniLM: attention of a 20-token sentence (median forward)",
            "forward_s",
            GOALS["minilm_20_tokens_s"],
        ),
    ):
        found = [(n, v) for n, v in views if v.get("kind") == kind]
        for n, v in found:
            if key in v:
                what = f"{measure}, {n}"
                if kind == "minilm":
                    what += f" ({v['tokens']} tokens)"
                out.append(
                    _row(what, f"{v[key]:.3f} s", f"<= {limit} s", v[key] <= limit)
                )
            else:
                out.append(
                    _row(f"{measure}, {n}", v.get("error", "?"), f"<= {limit} s", False)
                )
        if not found:
            out.append(_row(measure, "no such view", f"<= {limit} s", False))
    smol = [v for _, v in views if "smol" in (v.get("kind") or "")]
    goal = f">= {GOALS['smollm2_tokens_per_s']} tokens/s"
    if not smol:
        out.append(_row("SmolLM2 in the browser, if built", "not built", goal, "n/a"))
    for v in smol:
        if "per_token_s" in v:
            rate = 1 / v["per_token_s"]
            ok = rate >= GOALS["smollm2_tokens_per_s"]
            out.append(_row("SmolLM2 in the browser", f"{rate:.1f} tokens/s", goal, ok))
        else:
            out.append(_row("SmolLM2 in the browser", v.get("error", "?"), goal, False))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--pages", nargs="+", default=PAGES)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args(argv)
    if not (args.site / f"{args.pages[0]}.html").exists():
        # make bench runs this beside the others: without a built site it measures nothing
        print(f"live_views: no {args.pages[0]}.html in {args.site} (make book first)")
        return 0
    start = time.perf_counter()
    results = {
        "command": "python benchmarks/live_views.py",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        **measure(args.site, args.pages, args.repeat),
    }
    results["seconds"] = time.perf_counter() - start
    results["goals"] = goals(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-live.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "results-live.md").write_text(report(results))
    update_shared_results(args.out, results)
    print(report(results))
    print(
        f"updated the live_views entry and section of {args.out}/results.json and .md"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
