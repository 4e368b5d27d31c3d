"""Sphinx extension: the Chinese edition's search, and its pages in Chinese.

The extension is loaded by both builds; everything but the search language registration
acts only in the Chinese one (Sphinx's ``language`` is ``zh_CN``, see ``editions.py``).

1. **Search that finds the book's terms.** Sphinx's Chinese search (``SearchChinese``)
   cuts the text with jieba's ``cut_for_search`` and drops every one-character word, so
   键, 值 and 头 were never indexed, and jieba cut 束搜索 and 层规范化 into pieces. Here
   a user dictionary is written from ``book/zh/glossary.yml`` (every Chinese term) and the
   pages' titles, loaded into jieba through ``html_search_options["dict"]``; besides
   jieba's words, every dictionary word that occurs in a text is indexed as it is (so a
   term is found wherever it is written, whatever jieba makes of its neighbours), and the
   glossary's one-character terms are kept. In the browser the query is cut the same way
   (``SPLITTER``): a run of Chinese characters that is not a word of the index is cut,
   longest match first, into words of the index, so 注意力权重矩阵 searches for 注意力权重
   and 矩阵.
2. **Self-check outputs in Chinese.** The Chinese build takes every output from the
   English build's execution cache, so a self-check printed "not attempted yet: ..." or
   "passed: ..." in English. Each message is an English template of the catalog
   ``src/transformer_course/exercises/locale/zh/LC_MESSAGES/exercises.po``; the printed
   English is that template filled in, so the Chinese build matches each printed line
   against the templates and writes the catalog's Chinese with the same fields (a field
   that is itself a template, e.g. the "what" of "passed: {what}", is translated the same
   way). ``translate_output`` gives the line a Chinese notebook (``set_language("zh")``)
   prints: tests/sources/test_editions.py compares the two over every check.
3. **The page furniture in Chinese**: the search box's text, myst-nb's "Show code cell
   source" toggles and the animation player's buttons (``PLAYER``, the titles
   ``matplotlib``'s ``to_jshtml`` writes); an image or inline SVG whose text stays English
   (the figures' alt text is made from their English titles and labels, like the figure
   labels themselves) is marked ``lang="en"``, so a screen reader reads it with an English
   voice.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import string
from pathlib import Path

import yaml
from docutils import nodes
from sphinx.search.zh import SearchChinese

ZH = "zh_CN"
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "book" / "zh" / "glossary.yml"


def _package_dir() -> Path:
    """The folder of the ``transformer_course`` package the build's Python finds (without
    importing it), else this checkout's ``src/``: a copy of ``book/_ext`` elsewhere (the
    build-error test's one-chapter book) still finds the library's tables."""
    spec = importlib.util.find_spec("transformer_course")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return ROOT / "src" / "transformer_course"


PACKAGE_DIR = _package_dir()
CATALOG = PACKAGE_DIR / "exercises" / "locale" / "zh" / "LC_MESSAGES" / "exercises.po"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_chinese(app) -> bool:
    return (app.config.language or "").replace("-", "_") == ZH


# -- 1. search ---------------------------------------------------------------------------


def glossary_terms(glossary: Path = GLOSSARY) -> list[str]:
    """Every Chinese term of the glossary, as written ("KV 缓存" included)."""
    data = yaml.safe_load(glossary.read_text(encoding="utf-8"))
    return list(dict.fromkeys(term["zh"] for term in data["terms"]))


def page_titles(book: Path) -> list[str]:
    """The first heading (``# ...``, outside code) of every page of ``book``."""
    titles = []
    for page in sorted(book.glob("*.md")):
        fenced = False
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and line.startswith("# "):
                titles.append(line[2:].strip())
                break
    return titles


def dictionary_words(terms: list[str], titles: list[str]) -> list[str]:
    """The words of the search dictionary: each run of Chinese characters of two or
    more in a glossary term or a title (a term such as "KV 缓存" is found by its two
    parts, as the browser cuts the query at the space), longest first."""
    words = {run for text in [*terms, *titles] for run in HAN.findall(text)}
    return sorted((w for w in words if len(w) > 1), key=lambda w: (-len(w), w))


def one_character_terms(terms: list[str]) -> list[str]:
    """The glossary's terms of one Chinese character (键, 值, 头)."""
    return [t for t in terms if len(t) == 1 and HAN.fullmatch(t)]


def write_dictionary(path: Path, words: list[str], single: list[str]) -> Path:
    """jieba's user dictionary: one word a line (jieba suggests its frequency); the
    one-character terms follow a ``# single:`` line that jieba skips as no word."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join([*words, "# single: " + " ".join(single)]) + "\n"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def read_dictionary(path: Path) -> tuple[list[str], set[str]]:
    words, single = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# single:"):
            single.update(line.removeprefix("# single:").split())
        elif line.strip():
            words.append(line.split()[0])
    return words, single


# The browser's query splitter (Sphinx's language_data.js defines it before
# searchtools.js, which keeps it): Sphinx's own split at non-letters, then each run of
# Chinese characters that the index does not hold cut into words it holds, longest
# first (8 characters at most); characters of no indexed word are left out. It runs
# when the index is loaded (Search.query); before, it splits as Sphinx does.
SPLITTER = r"""
var splitQuery = (query) => {
  const parts = query
    .split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu)
    .filter((term) => term);
  const index = typeof Search === "undefined" ? null : Search._index;
  if (!index) return parts;
  const known = (w) =>
    Object.hasOwn(index.terms, w) || Object.hasOwn(index.titleterms, w);
  const words = [];
  for (const part of parts) {
    for (const run of part.match(/\p{Script=Han}+|\P{Script=Han}+/gu)) {
      if (!/\p{Script=Han}/u.test(run) || known(run)) {
        words.push(run);
        continue;
      }
      const found = [];
      let i = 0;
      while (i < run.length) {
        let j = Math.min(run.length, i + 8);
        while (j > i + 1 && !known(run.slice(i, j))) j -= 1;
        if (known(run.slice(i, j))) found.push(run.slice(i, j));
        i = j;
      }
      words.push(...(found.length ? found : [run]));
    }
  }
  return words;
};
"""


class SearchChineseTerms(SearchChinese):
    """Sphinx's Chinese search, finding every dictionary word where it is written and
    keeping the one-character terms (see the module's docstring)."""

    js_splitter_code = SPLITTER

    def init(self, options: dict[str, str]) -> None:
        super().init(options)  # loads options["dict"] into jieba
        path = options.get("dict")
        words, single = read_dictionary(Path(path)) if path else ([], set())
        self.dictionary, self.single = words, single

    def split(self, input: str) -> list[str]:
        found = super().split(input)
        for run in HAN.findall(input):
            found.extend(w for w in self.dictionary if w in run)
            found.extend(ch for ch in self.single if ch in run)
        return found

    def word_filter(self, stemmed_word: str) -> bool:
        return len(stemmed_word) > 1 or stemmed_word in self.single


def _search_dictionary(app, config) -> None:
    if (config.language or "").replace("-", "_") != ZH:
        return
    book = Path(app.srcdir)
    path = write_dictionary(
        Path(app.doctreedir).parent / "search-dictionary.txt",
        dictionary_words(glossary_terms(), page_titles(book)),
        one_character_terms(glossary_terms()),
    )
    config.html_search_options = {
        **(config.html_search_options or {}),
        "dict": str(path),
    }
    config.html_theme_options = {
        **(config.html_theme_options or {}),
        "search_bar_text": SEARCH_BAR_TEXT,
    }


# -- 2. self-check outputs ---------------------------------------------------------------

_FIELD = r"[^\n]+?"  # a field is filled in on one line
# the lines a self-check prints first (exercises/_common.py, _crash.py)
_STARTS = ("passed: ", "not attempted yet: ", "✗ ", "Hint: ", "  (raised inside ")


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, str]:
    """msgid (the English template) -> msgstr, the translated entries."""
    from babel.messages.pofile import read_po

    with CATALOG.open("rb") as f:
        po = read_po(f, locale="zh_Hans_CN")
    return {m.id: m.string for m in po if m.id and m.string}


def _has_words(template: str) -> bool:
    """Whether a template's own text (its placeholders left out) has a letter."""
    return any(
        ch.isalpha() for text, *_ in string.Formatter().parse(template) for ch in text
    )


def _pattern(template: str) -> re.Pattern:
    out, seen = [], set()
    for literal, field, _spec, _conversion in string.Formatter().parse(template):
        out.append(re.escape(literal))
        if field is None:
            continue
        name = field or f"_{len(seen)}"
        out.append(f"(?P={name})" if name in seen else f"(?P<{name}>{_FIELD})")
        seen.add(name)
    return re.compile("".join(out), re.DOTALL)


@functools.lru_cache(maxsize=1)
def _templates() -> list[tuple[re.Pattern, str]]:
    """(pattern of the English, Chinese template) of each templated entry, those with
    more literal text first (the more specific match wins)."""
    entries = [(k, v) for k, v in catalog().items() if "{" in k]

    def literal(template: str) -> int:
        return sum(len(t) for t, *_ in string.Formatter().parse(template))

    entries.sort(key=lambda kv: -literal(kv[0]))
    return [(_pattern(k), v, _has_words(k)) for k, v in entries]


def _fill(template: str, fields: dict[str, str]) -> str:
    out = []
    for literal, field, _spec, _conversion in string.Formatter().parse(template):
        out.append(literal)
        if field is not None:
            out.append(fields[field])
    return "".join(out)


def translate_message(text: str, depth: int = 0) -> str | None:
    """The Chinese of one English message (a catalog entry, filled in), or None when
    ``text`` is no message of the catalog. The fields are translated too when they are
    messages themselves (composed phrases), else kept as printed."""
    exact = catalog().get(text)
    if exact is not None and "{" not in text:
        return exact
    if depth > 3 or "\n" in text and "not attempted yet" not in text:
        return None
    for pattern, chinese, words in _templates():
        match = pattern.fullmatch(text)
        if match is None:
            continue
        inner = {
            name: translate_message(value, depth + 1)
            for name, value in match.groupdict().items()
        }
        if not words and not any(inner.values()):
            continue  # "{name}: {message}" is a message only around a message
        fields = {
            name: inner[name] or value for name, value in match.groupdict().items()
        }
        try:
            return _fill(chinese, fields)
        except KeyError:  # the translation names a field the English lacks
            continue
    return None


def translate_output(text: str) -> str:
    """``text`` (a cell's printed output) with each self-check line in Chinese, as a
    Chinese notebook prints it; every other line as it is."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        done = None
        if line.startswith(_STARTS):
            for k in (2, 1):  # "not attempted yet" spans two lines
                chunk = "\n".join(lines[i : i + k])
                if k > len(lines) - i:
                    continue
                mark = "✗ " if chunk.startswith("✗ ") else ""
                chinese = translate_message(chunk.removeprefix(mark))
                if chinese is not None:
                    done, i = mark + chinese, i + k
                    break
        if done is None:
            done, i = line, i + 1
        out.append(done)
    return "\n".join(out)


def _translate_outputs(app, doctree, docname) -> None:
    if not is_chinese(app):
        return
    for block in list(doctree.findall(nodes.literal_block)):
        classes = block.get("classes", [])
        if "output" not in classes or "stream" not in classes:
            continue
        english = block.astext()
        chinese = translate_output(english)
        if chinese != english:
            block.children = [nodes.Text(chinese)]
            block.rawsource = chinese


# -- 3. the page furniture ---------------------------------------------------------------

SEARCH_BAR_TEXT = "搜索本书……"
# myst-nb's toggles of hidden cells (nb_code_prompt_show/hide, "{type}" filled in)
TOGGLES = {
    "Show code cell source": "显示代码",
    "Hide code cell source": "隐藏代码",
    "Show code cell content": "显示单元格",
    "Hide code cell content": "隐藏单元格",
    "Show code cell output": "显示输出",
    "Hide code cell output": "隐藏输出",
    "Show code cell outputs": "显示输出",
    "Hide code cell outputs": "隐藏输出",
}
# matplotlib's to_jshtml player (viz.animations._player.animation_html): the buttons'
# titles and names, the loop modes' labels and the slider's name, the library's table
# (a module without imports, read from its file)
_labels = _load(
    "player_labels",
    PACKAGE_DIR / "viz" / "animations" / "_labels.py",
)
PLAYER = _labels.PLAYER_ZH
# The theme's strings that neither Sphinx's nor the themes' Chinese catalogs translate
# (seen on the built pages): added as a fallback catalog of Sphinx's own domain, which
# every template's _() and Sphinx's HTML writer read.
THEME = {
    "Toggle primary sidebar": "切换主侧边栏",
    "Toggle secondary sidebar": "切换次侧边栏",
    "Main": "主导航",
    "Color mode": "配色模式",
    "Link to this heading": "指向此标题的链接",
    "Link to this definition": "指向此定义的链接",
    "Link to this code": "指向此代码的链接",
    "Link to this image": "指向此图片的链接",
    "Link to this table": "指向此表格的链接",
    "Search this book...": SEARCH_BAR_TEXT,
}


# sphinx-exercise's titles: "练习 1.1  (标题)" (two spaces, ASCII parentheses) and
# "解答 练习 1.1 (标题)" become "练习 1.1（标题）" and "参考答案：练习 1.1（标题）", the
# word the Chinese notebooks use (tools/sync_notebooks.py EDITION_WORDS)
_EXERCISE_TITLE = re.compile(
    r'(<span class="caption-number">练习 [\d.]+) </span>(?: \((.*?)\))?</p>', re.DOTALL
)
_SOLUTION_TITLE = re.compile(
    r'<p class="admonition-title">解答<a ([^>]*)> (练习 [\d.]+)(?: \((.*?)\))?</a></p>',
    re.DOTALL,
)


def _titled(title: str | None) -> str:
    return f"（{title}）" if title else ""


_ENGLISH_ALT = re.compile(r'<img(?![^>]*\blang=)([^>]*\balt="([^"]*)")', re.IGNORECASE)
_SVG_TITLE = re.compile(r"<title>([^<]*)</title>")


def _toggles(app, doctree, docname) -> None:
    if not is_chinese(app):
        return
    from myst_nb.sphinx_ import HideCodeCellNode

    for node in doctree.findall(HideCodeCellNode):
        for key in ("prompt_show", "prompt_hide"):
            node[key] = TOGGLES.get(node[key], node[key])


def chinese_furniture(body: str) -> str:
    """A Chinese page's HTML ``body`` with the player's labels in Chinese, the
    exercises' and solutions' titles in Chinese typography, and each image or SVG title
    whose text has no Chinese marked ``lang="en"``."""
    if "_anim_" in body:
        body = _labels.player_in_chinese(body)

    body = _EXERCISE_TITLE.sub(lambda m: f"{m[1]}</span>{_titled(m[2])}</p>", body)
    body = _SOLUTION_TITLE.sub(
        lambda m: (
            f'<p class="admonition-title">参考答案：<a {m[1]}>{m[2]}'
            f"{_titled(m[3])}</a></p>"
        ),
        body,
    )

    def alt(match: re.Match) -> str:
        if HAN.search(match[2]) or not match[2].strip():
            return match[0]
        return f'<img lang="en"{match[1]}'

    body = _ENGLISH_ALT.sub(alt, body)
    return _SVG_TITLE.sub(
        lambda m: m[0] if HAN.search(m[1]) else f'<title lang="en">{m[1]}</title>',
        body,
    )


def _page(app, pagename, templatename, context, doctree) -> None:
    if is_chinese(app) and context.get("body"):
        context["body"] = chinese_furniture(context["body"])


def write_catalog(folder: Path, messages: dict[str, str]) -> Path:
    """``messages`` as the compiled catalog ``folder/zh_CN/LC_MESSAGES/sphinx.mo``."""
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    catalog = Catalog(locale="zh_Hans_CN", domain="sphinx")
    for english, chinese in messages.items():
        catalog.add(english, chinese)
    target = folder / ZH / "LC_MESSAGES" / "sphinx.mo"
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as f:
        write_mo(f, catalog)
    return folder


def setup(app):
    if is_chinese(app):  # Sphinx reads the language before it loads extensions
        folder = write_catalog(Path(app.doctreedir).parent / "locale", THEME)
        app.add_message_catalog("sphinx", str(folder))
    app.add_search_language(SearchChineseTerms)
    app.connect("config-inited", _search_dictionary)
    app.connect("doctree-resolved", _translate_outputs)
    app.connect("doctree-resolved", _toggles)
    app.connect("html-page-context", _page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
