"""Every citation in the chapters resolves: each key used with {cite}`a,b` (any cite
role: cite, cite:p, cite:t, ...) in book/*.md has an entry in book/references.bib, and
no key is defined twice. (Internal links and cross-references are checked by the
nitpicky book build, `jupyter-book build -W -n`.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIB = ROOT / "book" / "references.bib"
PAGES = sorted((ROOT / "book").glob("*.md"))
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]*)`")
ENTRY = re.compile(r"^\s*@\w+\s*\{\s*([^,\s]+)\s*,", re.MULTILINE)


def cited_keys(text: str) -> set[str]:
    return {
        key.strip()
        for group in CITE.findall(text)
        for key in group.split(",")
        if key.strip()
    }


def bib_keys(text: str) -> list[str]:
    return [k for k in ENTRY.findall(text) if k.lower() not in ("comment", "string")]


def test_bibliography_keys_are_unique():
    keys = bib_keys(BIB.read_text())
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    assert keys and not duplicates, f"defined twice in {BIB.name}: {duplicates}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_cited_key_is_in_the_bibliography(page):
    missing = sorted(cited_keys(page.read_text()) - set(bib_keys(BIB.read_text())))
    assert not missing, f"{page.name} cites keys missing from {BIB.name}: {missing}"


def test_the_check_finds_a_missing_key():
    text = (
        "As shown {cite}`vaswani2017attention, nobody1999nothing` and {cite:t}`x2020y`."
    )
    assert cited_keys(text) == {"vaswani2017attention", "nobody1999nothing", "x2020y"}
    assert bib_keys("@article{a2020b,\n title={T}}\n@comment{c}") == ["a2020b"]
