"""The Chinese edition (book/zh/) against the English one (book/): stamp and status.

    python tools/translation.py stamp book/zh/intro.md   # record the English file's sha256
    python tools/translation.py status                   # stale, missing, not translated yet

A Chinese page records, in its front matter, the English file it was translated from and
that file's sha256::

    translation:
      source: book/intro.md
      sha256: 3f1c...

When the English file changes, the page is *stale* (tests/sources/test_translations.py
fails) until its translation is updated and stamped again. ``status`` exits 1 when a page
is stale or an English page is neither translated nor listed in ``NOT_TRANSLATED_YET``.

The functions below also extract what must be identical in both editions (code cells,
directives, glue names, cross-reference labels); the tests compare them.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK, ZH = ROOT / "book", ROOT / "book" / "zh"

# English pages with no Chinese page yet: the one list of the gap (README quotes it).
NOT_TRANSLATED_YET: tuple[str, ...] = ()

_FRONT = re.compile(r"\A---\n(?P<yaml>.*?\n)---\n", re.DOTALL)
_CODE_CELL = re.compile(
    r"^(?P<fence>`{3,})\{code-cell\}[^\n]*\n.*?^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_OPENING = re.compile(
    r"^\s*(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>.*)$"
)
_ROLE = re.compile(r"\{(?P<role>[\w:-]+)\}`(?P<text>[^`]*)`")
_TARGET = re.compile(r"^\((?P<label>[\w:.-]+)\)=[ \t]*$", re.MULTILINE)
REF_ROLES = ("ref", "numref", "doc", "eq", "term", "prf:ref")
KEEP_ARGUMENT = (
    "figure",
    "image",
    "literalinclude",
    "solution",
    "glue:figure",
    "glue:any",
)


def english_pages(toc: Path = ROOT / "_toc.yml") -> list[str]:
    """The English pages of the table of contents, as names ("intro", "01_qkv")."""
    text = toc.read_text(encoding="utf-8")
    names = [yaml.safe_load(text)["root"]] + re.findall(r"file:\s*(\S+)", text)
    return [Path(name).name for name in names]


def english_source(zh_page: Path) -> Path:
    """book/zh/X.md -> book/X.md."""
    return zh_page.parent.parent / zh_page.name


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def front_matter(text: str) -> dict:
    match = _FRONT.match(text)
    return (yaml.safe_load(match["yaml"]) or {}) if match else {}


def recorded(zh_page: Path) -> dict:
    """The page's ``translation`` field ({} when it has none)."""
    return front_matter(zh_page.read_text(encoding="utf-8")).get("translation") or {}


def stamp(zh_page: Path) -> str:
    """Record the sha256 of the English source in the page's front matter; returns it.

    Raises:
        FileNotFoundError: the English page ``book/<name>`` does not exist.
    """
    source = english_source(zh_page)
    if not source.exists():
        raise FileNotFoundError(f"zh_page: no English page {source} for {zh_page}")
    digest = sha256(source)
    block = (
        "translation:\n"
        f"  source: {source.relative_to(source.parent.parent).as_posix()}\n"
        f"  sha256: {digest}\n"
    )
    text = zh_page.read_text(encoding="utf-8")
    match = _FRONT.match(text)
    if match is None:
        text = f"---\n{block}---\n\n{text}"
    else:
        head = re.sub(
            r"^translation:\n(?:  .*\n)*", "", match["yaml"], flags=re.MULTILINE
        )
        text = f"---\n{head}{block}---\n" + text[match.end() :]
    zh_page.write_text(text, encoding="utf-8")
    return digest


def is_stale(zh_page: Path) -> bool:
    """True when the English source changed since the page was stamped (or never was)."""
    source = english_source(zh_page)
    return not source.exists() or recorded(zh_page).get("sha256") != sha256(source)


def code_cells(text: str) -> list[str]:
    """Every ``{code-cell}`` block, fence, options and tags included, in order."""
    return [m[0] for m in _CODE_CELL.finditer(text)]


def _without_code(text: str) -> str:
    return _CODE_CELL.sub("", text)


def directives(text: str) -> list[tuple[str, str, str, str]]:
    """(kind, :label:, :class:, argument when it is a path) of every directive other
    than code cells, in order. Titles are prose and may differ."""
    found, lines = [], _without_code(text).split("\n")
    for i, line in enumerate(lines):
        match = _OPENING.match(line)
        if match is None:
            continue
        options = {}
        for option in lines[i + 1 :]:
            key = re.match(r"^\s*:([\w-]+):\s*(.*)$", option)
            if key is None:
                break
            options[key[1]] = key[2].strip()
        name = match["name"]
        argument = match["arg"].strip() if name in KEEP_ARGUMENT else ""
        found.append(
            (name, options.get("label", ""), options.get("class", ""), argument)
        )
    return found


def heading_levels(text: str) -> list[int]:
    """The level of every heading outside code, in order: the page's outline."""
    text = _without_code_and_fences(_FRONT.sub("", text))
    return [len(m) for m in re.findall(r"^(#{1,6})\s", text, flags=re.MULTILINE)]


ZH_SUFFIX = "_zh"  # viz.glue: the Chinese words of a value glued as X are glued as X_zh


def glue_names(text: str, chinese: bool = False) -> Counter:
    """The glued values the prose quotes (role text, format included), with counts.
    On a Chinese page (``chinese``), ``X_zh`` (the Chinese words the code glued beside
    the English ones, ``glue(X, ..., zh=...)``) counts as the English page's ``X``."""

    def name(text: str) -> str:
        key, colon, spec = text.partition(":")
        if chinese and key.endswith(ZH_SUFFIX):
            key = key.removesuffix(ZH_SUFFIX)
        return key + colon + spec

    return Counter(
        name(m["text"]) for m in _ROLE.finditer(text) if m["role"].startswith("glue")
    )


def labels(text: str) -> dict[str, Counter]:
    """Cross-reference targets ``(label)=`` and references (ref, numref, doc, eq, cite)."""
    refs = Counter()
    for m in _ROLE.finditer(_without_code(text)):
        if m["role"] in REF_ROLES or m["role"].startswith("cite"):
            target = re.search(r"<([^>]+)>\s*$", m["text"])
            refs[f"{m['role']}:{target[1] if target else m['text']}"] += 1
    return {"targets": Counter(_TARGET.findall(text)), "references": refs}


GLOSSARY = ZH / "glossary.yml"


def glossary(path: Path = GLOSSARY) -> list[dict]:
    """The terms of book/zh/glossary.yml: dicts with en, zh, reject, en_pattern."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))["terms"]


_FENCE_LINE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
_CODE_DIRECTIVES = ("{code-cell}", "{literalinclude}", "{bibliography}")


def _without_code_and_fences(text: str) -> str:
    """``text`` without code (code cells, fenced code blocks, also inside exercises and
    solutions), and without the fence and ``:option:`` lines of directives, keeping the
    prose inside directives (exercise statements, hints, admonitions)."""
    kept, stack, options = [], [], False
    for line in text.split("\n"):
        match = _FENCE_LINE.match(line)
        in_code = bool(stack) and stack[-1][1]
        if match:
            fence, info = match["fence"], match["info"].strip()
            top = stack[-1][0] if stack else None
            closes = (
                top is not None
                and not info
                and fence[0] == top[0]
                and len(fence) >= len(top)
            )
            if closes:
                stack.pop()
                options = False
                continue
            if not in_code:
                is_code = fence[0] != ":" and (
                    not info.startswith("{") or info.startswith(_CODE_DIRECTIVES)
                )
                stack.append((fence, is_code))
                options = not is_code
                continue
        if in_code:
            continue
        if options and re.match(r"^[ \t]*:[\w-]+:", line):
            continue
        options = False
        kept.append(line)
    return "\n".join(kept)


def prose(text: str) -> str:
    """A page's text without front matter, code (cells, blocks, inline: "CODE"), math,
    roles and link targets: what a glossary term is looked for in. The text inside
    exercises, solutions and admonitions counts; their fence and option lines do not."""
    text = _FRONT.sub("", text)
    text = _without_code_and_fences(text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", text, flags=re.DOTALL)
    text = _ROLE.sub(" ", text)
    # inline code, also across a line break inside its paragraph
    text = re.sub(r"`(?:[^`\n]|\n(?!\s*\n))+`", " CODE ", text)
    text = re.sub(r"\]\([^)]*\)|https?://\S+", " ", text)
    return text


def english_pattern(term: dict) -> re.Pattern:
    """The English term as a whole word, any case, plural and hyphen/space variants."""
    if term.get("en_pattern"):
        return re.compile(term["en_pattern"], re.IGNORECASE)
    words = [re.escape(w) for w in re.split(r"[\s-]+", term["en"])]
    last = words[-1]
    words[-1] = last[:-1] + "(?:y|ies)" if last.endswith("y") else last + "(?:e?s)?"
    return re.compile(r"\b" + r"[\s-]+".join(words) + r"\b", re.IGNORECASE)


def glossary_problems(english: str, chinese: str, terms: list[dict]) -> list[str]:
    """Where the English text uses a term but the Chinese text lacks its Chinese term,
    and every rejected variant the Chinese text uses."""
    en, zh = prose(english), prose(chinese)
    problems = []
    for term in terms:
        if english_pattern(term).search(en) and term["zh"] not in zh:
            problems.append(f"{term['en']!r} is used in English but not {term['zh']!r}")
        for variant in term.get("reject") or []:
            if variant in zh:
                problems.append(f"{variant!r}: write {term['zh']!r} ({term['en']})")
    return problems


_INDENTED_CODE = re.compile(r"(?:(?<=\n\n)|\A)(?: {4}[^\n]*\n?|[ \t]*\n(?= {4}))+")
# A full-width parenthetical with no Chinese character in it, the gloss of the
# Chinese term before it: 暂退法（dropout）, 交错（interleaved）布局.
_GLOSS = re.compile(r"（[^（）\u3400-\u9fff]*）")
# An English label quoted from printed output or a figure, glossed right after:
# “previous token”（前一个词元）.
_QUOTED_LABEL = re.compile(r"[“\"][^“”\"\n]*[”\"](?=（)")
# A bibliography line of a generated notebook: authors (year). *English title*. ...
_BIB_LINE = re.compile(r"^- .*\((?:\d{4}|n\.d\.)\)\. \*.*$", re.MULTILINE)
# A repository named as owner/name (Dao-AILab/flash-attention #410): a name, not prose.
_REPOSITORY = re.compile(r"(?<![\w/])[\w.-]+/[\w.-]+(?= ?(?:#|PR |issue))", re.ASCII)
# In a self-check message (plain text, no code markup): a placeholder, or a run of
# ASCII that contains code punctuation (``mask=None``, ``softmax(keys @ query)``).
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
_CODE_RUN = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_CODE_PUNCTUATION = re.compile(r"[=()\[\]~@_<>!*/+.|#]|\d")


def chinese_prose(text: str, names: tuple[str, ...] = ()) -> str:
    """The prose of a Chinese page (``prose``: no code, math, roles, links) without
    what may stay English in it: indented code blocks, glosses (a
    full-width parenthetical without a Chinese character, ``暂退法（dropout）``), quoted
    output labels glossed right after (``“previous token”（前一个词元）``), repository
    names (``owner/name``), ``names`` (the glossary's: the book's English title) and a
    notebook's bibliography lines."""
    text = _BIB_LINE.sub(" ", prose(text))
    for name in names:
        text = text.replace(name, " ")
    text = _REPOSITORY.sub(" ", text)
    text = _INDENTED_CODE.sub("\n", text)
    text = _QUOTED_LABEL.sub(" ", text)
    return _GLOSS.sub(" ", text)


def message_prose(message: str) -> str:
    """A Chinese self-check message without its placeholders and code: the catalog's
    messages are plain text, so a run of ASCII with code punctuation in it is code."""
    text = _PLACEHOLDER.sub(" ", message)
    text = _CODE_RUN.sub(
        lambda m: " " if _CODE_PUNCTUATION.search(m[0]) else m[0], text
    )
    return _GLOSS.sub(" ", text)


def term_problems(zh_prose: str, terms: list[dict], allow: tuple = ()) -> list[str]:
    """In Chinese prose (``chinese_prose`` or ``message_prose``): every rejected
    variant of a glossary term (``reject``: text, ``reject_pattern``: a regex), and
    every English term left where the glossary has the Chinese one (``english_pattern``;
    terms whose ``zh`` is ASCII stay English). ``allow``: English words that are code
    names in this text."""
    problems = []
    for term in terms:
        for variant in term.get("reject") or []:
            for _ in range(zh_prose.count(variant)):
                problems.append(f"{variant!r}: write {term['zh']!r} ({term['en']})")
        if term.get("reject_pattern"):
            for m in re.finditer(term["reject_pattern"], zh_prose):
                problems.append(f"{m[0]!r}: write {term['zh']!r} ({term['en']})")
        if term["zh"].isascii():
            continue
        english = english_pattern(term)  # beside a CJK character too: ASCII \b
        english = re.compile(english.pattern, english.flags & ~re.UNICODE | re.ASCII)
        for m in english.finditer(zh_prose):
            if m[0].lower() in allow:
                continue
            around = zh_prose[max(0, m.start() - 12) : m.end() + 12].replace("\n", " ")
            problems.append(
                f"English {m[0]!r} in Chinese prose ({around.strip()!r}): write "
                f"{term['zh']!r}, or gloss it once as {term['zh']}（{term['en']}）"
            )
    return problems


def notebook_markdown(path: Path) -> str:
    """The markdown cells of a generated notebook, one after the other."""
    import json

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n\n".join(
        "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
    )


CATALOG = ROOT / "src/transformer_course/exercises/locale/zh/LC_MESSAGES/exercises.po"


def catalog_messages(path: Path = CATALOG) -> list[tuple[str, str]]:
    """(msgid, msgstr) of every message of the Chinese self-check catalog."""
    from babel.messages.pofile import read_po

    with path.open("rb") as file:
        catalog = read_po(file)
    return [(m.id, m.string) for m in catalog if m.id and isinstance(m.id, str)]


def status(root: Path = ROOT, not_yet: tuple[str, ...] | None = None) -> list[str]:
    """One line per problem: a stale translation, an English page neither translated
    nor listed in ``not_yet`` (default NOT_TRANSLATED_YET), a listed page that is
    translated after all."""
    book, zh = root / "book", root / "book" / "zh"
    not_yet = NOT_TRANSLATED_YET if not_yet is None else not_yet
    problems = []
    for name in english_pages(root / "_toc.yml"):
        page = zh / f"{name}.md"
        if page.exists() and name in not_yet:
            problems.append(f"{name}: translated, remove it from NOT_TRANSLATED_YET")
        elif page.exists() and is_stale(page):
            problems.append(
                f"{name}: stale, book/{name}.md changed since the translation was "
                f"stamped: update book/zh/{name}.md, then "
                f"`python tools/translation.py stamp book/zh/{name}.md`"
            )
        elif not page.exists() and name not in not_yet:
            problems.append(
                f"{name}: missing, translate book/{name}.md or list it in "
                "NOT_TRANSLATED_YET (tools/translation.py)"
            )
    for page in sorted(zh.glob("*.md")):
        if not (book / page.name).exists():
            problems.append(f"{page.stem}: a Chinese page with no English page")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    stamping = commands.add_parser("stamp", help="record the English file's sha256")
    stamping.add_argument("pages", nargs="+", type=Path)
    commands.add_parser("status", help="list stale or missing translations")
    args = parser.parse_args(argv)
    if args.command == "stamp":
        for page in args.pages:
            print(f"{page}: {stamp(page)}")
        return 0
    problems = status()
    translated = sorted(p.stem for p in ZH.glob("*.md"))
    print(f"translated: {', '.join(translated) or 'none'}")
    print(f"not translated yet: {', '.join(NOT_TRANSLATED_YET) or 'none'}")
    print("\n".join(problems) if problems else "every translation is up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
