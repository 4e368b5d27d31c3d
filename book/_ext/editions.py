"""Sphinx extension: the English and the Chinese edition link to each other.

The English book is built from the repository root (pages ``book/<name>``, served at
``/book/<name>.html``); the Chinese one from ``book/zh/`` (pages ``<name>``, served at
``/zh/<name>.html``, see ``tools/build_book.py --edition zh``). Which edition a build is
comes from Sphinx's ``language`` (``zh_CN`` for the Chinese one).

1. Each page whose counterpart exists gets a link to it at the top ("中文" on an English
   page, "English" on a Chinese one).
2. In the Chinese edition, a ``{doc}`` reference to a page that is not translated yet
   resolves to the English page, its title followed by "（英文）", so a translated page
   keeps the English page's cross-references unchanged and the build does not warn.
3. In the Chinese edition, the relative path of an ``{literalinclude}`` or ``{include}``
   (the same text as on the English page, e.g. ``../src/transformer_course/attention.py``)
   is read from the English page's folder, ``book/``, not from ``book/zh/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docutils import nodes

ZH = "zh_CN"
ENGLISH_MARK = "（英文）"


def is_chinese(app) -> bool:
    return (app.config.language or "").replace("-", "_") == ZH


def english_book(app) -> Path:
    """The folder of the English pages (``book/``) seen from either build."""
    return Path(app.srcdir).parent if is_chinese(app) else Path(app.srcdir) / "book"


def counterpart(app, pagename: str) -> tuple[str, str] | None:
    """(relative address, link text) of the page's other-language counterpart, or None
    when it has none. English page ``book/X`` <-> Chinese page ``X``."""
    book = english_book(app)
    if is_chinese(app):
        if (book / f"{pagename}.md").exists():
            return f"../book/{pagename}.html", "English"
        return None
    if not pagename.startswith("book/") or pagename.count("/") != 1:
        return None
    name = pagename.removeprefix("book/")
    if (book / "zh" / f"{name}.md").exists():
        return f"../zh/{name}.html", "中文"
    return None


def _add_language_link(app, pagename, templatename, context, doctree):
    if doctree is None:
        return
    other = counterpart(app, pagename)
    if other is None:
        return
    href, text = other
    lang = "en" if text == "English" else "zh-CN"
    link = (
        f'<p class="edition-link"><a class="reference internal" href="{href}" '
        f'hreflang="{lang}" lang="{lang}">{text}</a></p>\n'
    )
    context["body"] = link + context.get("body", "")


def english_title(source: Path) -> str:
    """The first heading of an English page's source, or its file name."""
    match = re.search(r"^#\s+(.+)$", source.read_text(encoding="utf-8"), re.MULTILINE)
    return match.group(1).strip() if match else source.stem


def _english_fallback(app, env, node, contnode):
    if not is_chinese(app) or node.get("reftype") != "doc":
        return None
    target = node["reftarget"].removesuffix(".md").lstrip("/")
    if "/" in target:
        return None
    source = english_book(app) / f"{target}.md"
    if not source.exists():
        return None
    text = (
        contnode.astext()
        if node.get("refexplicit")
        else english_title(source) + ENGLISH_MARK
    )
    reference = nodes.reference("", "", internal=False, refuri=f"../book/{target}.html")
    reference += nodes.inline(text, text)
    return reference


_INCLUDE = re.compile(
    r"^(?P<open>\s*(?:`{3,}|:{3,})\{(?:literalinclude|include)\}[ \t]+)(?P<path>\S+)",
    re.MULTILINE,
)


def include_paths_from_the_english_folder(
    text: str, english: Path, srcdir: Path
) -> str:
    """``text`` with each relative include path rewritten so that, read from ``srcdir``
    (``book/zh/``), it names the file the English page (in ``english``) includes."""

    def rewrite(match: re.Match) -> str:
        path = match["path"]
        if path.startswith("/") or "://" in path:
            return match[0]
        target = (english / path).resolve()
        return match["open"] + os.path.relpath(target, srcdir.resolve())

    return _INCLUDE.sub(rewrite, text)


def _includes_from_the_english_folder(app, docname, source):
    if is_chinese(app):
        source[0] = include_paths_from_the_english_folder(
            source[0], english_book(app), Path(app.srcdir)
        )


def setup(app):
    app.connect("source-read", _includes_from_the_english_folder)
    app.connect("html-page-context", _add_language_link)
    app.connect("missing-reference", _english_fallback)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
