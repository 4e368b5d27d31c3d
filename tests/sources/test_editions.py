"""The machinery that makes the English and the Chinese edition one site: the Chinese
build's configuration (tools/build_book.py --edition zh: the English one plus
book/zh/edition.yml, sharing the English execution cache), the links between
counterparts and the English fallback of untranslated {doc} targets
(book/_ext/editions.py), the Chinese Colab link (book/_ext/course_site.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from docutils import nodes
from sphinx.addnodes import pending_xref

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_book = load("build_book", ROOT / "tools" / "build_book.py")
editions = load("editions", ROOT / "book" / "_ext" / "editions.py")
course_site = load("course_site", ROOT / "book" / "_ext" / "course_site.py")

ENGLISH = yaml.safe_load((ROOT / "_config.yml").read_text())
CHINESE = yaml.safe_load((ROOT / "book" / "zh" / "edition.yml").read_text())


def test_chinese_build_shares_the_english_execution_cache():
    config = build_book.chinese_config(ENGLISH, CHINESE)
    # what myst-nb and book/_ext/library_cache.py use for the English build in _build/html
    english_cache = (ROOT / "_build" / "html").parent / ".jupyter_cache"
    assert Path(config["execute"]["cache"]) == english_cache
    assert "cache" not in ENGLISH["execute"], "the English build derives its own"


def test_chinese_config_is_the_english_one_in_chinese_with_absolute_paths():
    config = build_book.chinese_config(ENGLISH, CHINESE)
    sphinx = config["sphinx"]
    assert sphinx["config"]["language"] == "zh_CN"
    assert config["title"] == CHINESE["title"] != ENGLISH["title"]
    assert set(sphinx["local_extensions"]) == set(ENGLISH["sphinx"]["local_extensions"])
    assert "editions" in sphinx["local_extensions"]
    paths = [
        *sphinx["local_extensions"].values(),
        *config["bibtex_bibfiles"],
        config["html"]["favicon"],
    ]
    for path in paths:
        assert Path(path).is_absolute() and Path(path).exists(), path
    for key, value in ENGLISH["sphinx"]["config"].items():
        if key != "html_static_path":
            assert sphinx["config"][key] == value, key
    assert ENGLISH["sphinx"]["config"].get("language") is None  # not changed in place


def app(language: str | None, srcdir: Path) -> SimpleNamespace:
    return SimpleNamespace(
        config=SimpleNamespace(language=language), srcdir=str(srcdir)
    )


EN, ZH = app(None, ROOT), app("zh_CN", ROOT / "book" / "zh")


@pytest.mark.parametrize(
    ("build", "page", "expected"),
    [
        (EN, "book/intro", ("../zh/intro.html", "中文")),
        (EN, "book/01_qkv", ("../zh/01_qkv.html", "中文")),
        (EN, "genindex", None),
        (ZH, "intro", ("../book/intro.html", "English")),
        (ZH, "search", None),
    ],
)
def test_each_page_links_to_its_counterpart(build, page, expected):
    assert editions.counterpart(build, page) == expected


def test_an_untranslated_page_has_no_language_link(tmp_path):
    (tmp_path / "book" / "zh").mkdir(parents=True)
    (tmp_path / "book" / "11_new.md").write_text("# New\n")
    assert editions.counterpart(app(None, tmp_path), "book/11_new") is None
    (tmp_path / "book" / "zh" / "11_new.md").write_text("# 新\n")
    assert editions.counterpart(app(None, tmp_path), "book/11_new") == (
        "../zh/11_new.html",
        "中文",
    )


def doc_reference(target: str, explicit: bool = False) -> pending_xref:
    node = pending_xref(
        "", reftype="doc", refdomain="std", reftarget=target, refexplicit=explicit
    )
    node += nodes.inline(target, target)
    return node


def test_an_untranslated_doc_target_resolves_to_the_english_page():
    node = doc_reference("02_scaled_dot_product")
    reference = editions._english_fallback(ZH, None, node, node[0])
    assert reference["refuri"] == "../book/02_scaled_dot_product.html"
    title = editions.english_title(ROOT / "book" / "02_scaled_dot_product.md")
    assert reference.astext() == title + "（英文）"
    explicit = doc_reference("05_masks", explicit=True)
    assert editions._english_fallback(ZH, None, explicit, explicit[0]).astext() == (
        "05_masks"
    )


def test_english_fallback_leaves_other_references_alone():
    assert editions._english_fallback(EN, None, doc_reference("01_qkv"), None) is None
    missing = doc_reference("99_nowhere")
    assert editions._english_fallback(ZH, None, missing, missing[0]) is None
    label = doc_reference("sec-x")
    label["reftype"] = "ref"
    assert editions._english_fallback(ZH, None, label, label[0]) is None


def test_chinese_colab_link_opens_the_chinese_notebook():
    url = course_site.colab_url(
        "https://github.com/o/r", "main", "01_qkv", "notebooks/zh"
    )
    assert url.endswith("/o/r/blob/main/notebooks/zh/01_qkv.ipynb")
    assert course_site.colab_url("https://github.com/o/r", "main", "01_qkv").endswith(
        "/blob/main/notebooks/01_qkv.ipynb"
    )


def test_make_book_builds_both_editions():
    recipe = (ROOT / "Makefile").read_text().split("\nbook:")[1].split("\n\n")[0]
    assert "tools/build_book.py . -W" in recipe
    assert "tools/build_book.py --edition zh -W" in recipe
    assert sys.modules.get("jieba") or importlib.util.find_spec("jieba"), (
        "jieba (requirements.txt) is needed for the Chinese search"
    )


def test_the_chinese_build_adds_its_times_to_the_english_record(tmp_path):
    library_cache = load("library_cache", ROOT / "book" / "_ext" / "library_cache.py")
    cache = tmp_path / ".jupyter_cache" / "library-abc"
    record = tmp_path / ".jupyter_cache" / library_cache.TIMES_FILE
    record.parent.mkdir()
    record.write_text('{"book/06_transformer": 229.0}')
    chinese = SimpleNamespace(
        env=SimpleNamespace(
            nb_metadata={"intro": {"exec_data": {"runtime": 2.5, "mtime": 0}}}
        ),
        config=SimpleNamespace(nb_execution_cache_path=str(cache)),
    )
    library_cache._log_execution_times(chinese, None)
    times = yaml.safe_load(record.read_text())
    assert times == {"book/06_transformer": 229.0, "intro": 2.5}


def _open_cache_and_query(path: str) -> int:
    from jupyter_cache import get_cache

    return len(get_cache(path).list_cache_records())


def test_the_cache_database_exists_before_parallel_readers_open_it(tmp_path):
    """A fresh clone's parallel build (stop 33's CI failure): processes that open a new
    jupyter cache at once race to create its tables; the main process creates them first."""
    from concurrent.futures import ProcessPoolExecutor

    library_cache = load("library_cache", ROOT / "book" / "_ext" / "library_cache.py")
    cache = tmp_path / "library-abc"
    library_cache.create_cache_database(cache)
    import sqlite3

    with sqlite3.connect(cache / "global.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert {"settings", "nbcache", "nbproject"} <= tables, tables
    with ProcessPoolExecutor(8) as pool:
        counts = list(pool.map(_open_cache_and_query, [str(cache)] * 32))
    assert counts == [0] * 32


def test_a_chinese_page_includes_the_file_its_english_page_includes():
    english = ROOT / "book" / "01_qkv.md"
    line = next(
        line
        for line in english.read_text(encoding="utf-8").splitlines()
        if "{literalinclude}" in line
    )
    path = line.split()[-1]
    assert (english.parent / path).is_file()
    chinese = editions.include_paths_from_the_english_folder(
        line + "\n:pyobject: x\n", english.parent, ROOT / "book" / "zh"
    )
    new_path = chinese.split("\n")[0].split()[-1]
    assert new_path != path  # as written, it would be read from book/zh/
    assert not (ROOT / "book" / "zh" / path).exists()
    assert (ROOT / "book" / "zh" / new_path).resolve() == (
        english.parent / path
    ).resolve()
    assert chinese.endswith(":pyobject: x\n")
    url = (
        "```{literalinclude} /src/x.py"  # absolute (from the source folder): unchanged
    )
    assert (
        editions.include_paths_from_the_english_folder(url, english.parent, ROOT) == url
    )


def test_an_edited_stylesheet_reaches_an_already_built_site(tmp_path):
    """Sphinx 7.4 keeps an existing _static file: the stale copy is removed first."""
    static, out = tmp_path / "static", tmp_path / "html"
    static.mkdir()
    (out / "_static").mkdir(parents=True)
    (static / "course.css").write_text("a { color: #0d5bd1; }")
    (out / "_static" / "course.css").write_text("a { color: #176de8; }")  # old build
    (static / "same.css").write_text("b {}")
    (out / "_static" / "same.css").write_text("b {}")
    stale = course_site.stale_static_copies(static, out)
    assert stale == [(static / "course.css", out / "_static" / "course.css")]


def _start_order(tmp_path, chunks) -> list[str]:
    """The order in which Sphinx's own ParallelTasks (2 processes) starts ``chunks``."""
    import time

    from sphinx.util.parallel import ParallelTasks

    log = tmp_path / "started.txt"
    log.write_text("")

    def task(chunk):
        with open(log, "a") as f:
            f.write(chunk[0] + "\n")
        time.sleep(0.3)  # every chunk is added while the first two still run

    tasks = ParallelTasks(2)
    for chunk in chunks:
        tasks.add_task(task, chunk)
    tasks.join()
    return log.read_text().split()


def test_sphinx_starts_the_pages_longest_first(tmp_path, monkeypatch):
    times = {"a": 5.0, "b": 50.0, "c": 20.0, "d": 1.0, "e": 30.0, "f": 10.0}
    (tmp_path / "times.json").write_text(json.dumps(times))
    monkeypatch.setattr(build_book, "TIMES", tmp_path / "times.json")
    longest = ["b", "e", "c", "f", "a", "d"]
    assert build_book.longest_first(list(times)) == longest
    chunks = build_book.one_page_per_chunk(list(times), 2)
    # two processes start pages two at a time; within a pair, the order is the order in
    # which the two before them happened to finish (a busy machine swaps them)
    assert _in_pairs(_start_order(tmp_path, chunks)) == _in_pairs(longest)
    # known wrong: handed over longest first, Sphinx starts the rest shortest first
    naive = [[page] for page in longest]
    assert _in_pairs(_start_order(tmp_path, naive)) == _in_pairs("bedafc")


def _in_pairs(order) -> list[set[str]]:
    return [set(order[i : i + 2]) for i in range(0, len(order), 2)]


# -- the Chinese edition's search and its pages in Chinese (book/_ext/zh_edition.py) -----

zh_edition = load("zh_edition", ROOT / "book" / "_ext" / "zh_edition.py")


def _printed(check, *args, lang: str, **kwargs) -> str:
    import contextlib
    import io

    from transformer_course.exercises import set_language

    set_language(lang)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            check(*args, **kwargs)
    finally:
        set_language(None)
    return out.getvalue()


def _self_check_runs():
    """(label, check, args, kwargs): every check on an untouched stub, on a function
    that returns None and on one that raises; chapter 5's property check on each
    backend and on the four broken attentions the chapter shows."""
    import transformer_course.exercises as ex
    from transformer_course.attention import ATTENTION_BACKENDS
    from transformer_course.exercises import pitfalls

    def stub(*args, **kwargs):
        raise NotImplementedError

    def returns_none(*args, **kwargs):
        return None

    def raises(*args, **kwargs):
        raise ValueError("shapes (2, 3) and (4, 5): no")

    runs = []
    for name in ex.__all__:
        if name.startswith("check_") and name not in ("check_close", "check_shape"):
            for fn in (stub, returns_none, raises):
                runs.append((f"{name}({fn.__name__})", getattr(ex, name), (fn,), {}))
    broken = ["mask_after_softmax", "inverted_mask", "no_guard", "large_negative"]
    functions = {**ATTENTION_BACKENDS}
    functions.update({b: getattr(pitfalls, f"attention_{b}") for b in broken})
    for name, fn in functions.items():
        runs.append((name, ex.check_attention_properties, (fn,), {"name": name}))
    return runs


def test_a_self_check_output_reads_on_a_chinese_page_as_a_chinese_notebook_prints_it():
    """Chinese review 2026-12-03, M2: the Chinese build reuses the English outputs; the
    build translates each printed self-check line through the catalog. What it writes
    is, line for line, what ``set_language("zh")`` prints."""
    wrong = []
    for label, check, args, kwargs in _self_check_runs():
        english = _printed(check, *args, lang="en", **kwargs)
        chinese = _printed(check, *args, lang="zh", **kwargs)
        assert english != chinese, label
        if zh_edition.translate_output(english) != chinese:
            wrong.append((label, english, zh_edition.translate_output(english)))
    assert not wrong, wrong[:3]


def test_output_translation_leaves_other_lines_alone_and_misses_no_self_check_line():
    printed = (
        "mask_after_softmax: softmax before the mask\n"
        "passed: causal masks right, square and bottom-right aligned\n"
        "name: value\n"
        "✗ none raised TypeError: isfinite(): argument 'input' must be Tensor\n"
        "not attempted yet: soft_lookup raises NotImplementedError;\n"
        "write its body and run this cell again."
    )
    lines = zh_edition.translate_output(printed).split("\n")
    assert lines[0] == "mask_after_softmax: softmax before the mask"
    assert lines[1].startswith("通过：") and lines[2] == "name: value"
    assert lines[3].startswith("✗ none 抛出了 TypeError：isfinite(): argument")
    assert lines[4].startswith("尚未作答：soft_lookup") and len(lines) == 5
    # known wrong: a line that is no message of the catalog stays as it is
    assert zh_edition.translate_message("passed, but not a message") is None


def test_the_chinese_search_indexes_every_glossary_term_where_it_is_written(tmp_path):
    """Chinese review 2026-12-03, M1: Sphinx's SearchChinese dropped 键, 值, 头 and cut
    束搜索 and 层规范化 into pieces; the edition's search language indexes them."""
    from sphinx.search.zh import SearchChinese

    terms = zh_edition.glossary_terms()
    words = zh_edition.dictionary_words(
        terms, zh_edition.page_titles(ROOT / "book" / "zh")
    )
    single = zh_edition.one_character_terms(terms)
    assert {"键", "值", "头"} <= set(single)
    assert {"束搜索", "层规范化", "多头注意力", "缓存"} <= set(words)
    path = zh_edition.write_dictionary(tmp_path / "dict.txt", words, single)
    search = zh_edition.SearchChineseTerms({"dict": str(path)})
    text = (
        "用束搜索解码，层规范化之后，查询与键的点积给出每个值的权重，每个头各算一次。"
    )

    def indexed(language) -> set[str]:
        split = language.split(text)
        return {w for w in split if language.word_filter(language.stem(w))}

    wanted = {"束搜索", "层规范化", "键", "值", "头", "查询"}
    assert wanted <= indexed(search), wanted - indexed(search)
    # known wrong: Sphinx's own drops the one-character terms (and, before jieba has
    # the dictionary, which this process may have loaded already, cuts 束搜索)
    stock = SearchChinese({})
    assert {"键", "值", "头"} <= wanted - indexed(stock), indexed(stock)


def test_every_glossary_term_of_the_body_text_is_a_word_of_the_index(tmp_path):
    """Each glossary term a Chinese page writes is indexed from that page's text (its
    Chinese runs: "KV 缓存" as 缓存), whatever jieba makes of its neighbours."""
    import re as regex

    terms = zh_edition.glossary_terms()
    words = zh_edition.dictionary_words(terms, [])
    single = zh_edition.one_character_terms(terms)
    path = zh_edition.write_dictionary(tmp_path / "dict.txt", words, single)
    search = zh_edition.SearchChineseTerms({"dict": str(path)})
    missing = []
    for page in sorted((ROOT / "book" / "zh").glob("*.md")):
        prose = regex.sub(
            r"```.*?```", "", page.read_text(encoding="utf-8"), flags=regex.DOTALL
        )
        indexed = set(search.split(prose))
        for term in terms:
            for run in zh_edition.HAN.findall(term):
                if run in prose and run not in indexed:
                    missing.append((page.name, run))
    assert not missing, missing[:10]


def test_the_chinese_page_furniture_is_chinese():
    html = (
        '<div class="tc-animation"><img id="_anim_imgx" alt="Animation. Figure: w">'
        '<button title="Play" aria-label="Play"></button>'
        '<label for="_anim_radio2_x">Loop</label></div>'
        '<img src="a.png" alt="注意力权重的热图"><svg><title>Encoder</title></svg>'
    )
    out = zh_edition.chinese_furniture(html)
    assert 'title="播放" aria-label="播放"' in out and ">循环</label>" in out
    assert '<img lang="en" id="_anim_imgx"' in out
    assert '<img src="a.png" alt="注意力权重的热图">' in out  # Chinese alt: as it is
    assert '<title lang="en">Encoder</title>' in out
    assert zh_edition.chinese_furniture("<p>Play</p>") == "<p>Play</p>"  # no player


def test_the_chinese_theme_catalog_translates_the_theme_strings(tmp_path):
    import gettext

    folder = zh_edition.write_catalog(tmp_path, zh_edition.THEME)
    translation = gettext.translation("sphinx", str(folder), languages=["zh_CN"])
    assert translation.gettext("Toggle primary sidebar") == "切换主侧边栏"
    assert translation.gettext("Not in the catalog") == "Not in the catalog"
    for name in (
        "toggle-primary-sidebar",
        "toggle-secondary-sidebar",
        "sbt-sidebar-nav",
    ):
        template = (ROOT / "book" / "_ext" / "templates" / f"{name}.html").read_text()
        assert "{{ _('" in template, name


def test_the_chinese_exercise_titles_are_set_in_chinese_typography():
    """Chinese review 2026-12-03, M6: "练习 1.1  (标题)" with two spaces and ASCII
    parentheses, and "解答 练习 1.1 (…)" where the notebooks write 参考答案."""
    html = (
        '<p class="admonition-title"><span class="caption-number">练习 1.1 </span> '
        "(有缺失条目的软查找)</p>"
        '<p class="admonition-title">解答<a class="reference internal" href="#ex-a"> '
        "练习 1.1 (有缺失条目的软查找)</a></p>"
    )
    out = zh_edition.chinese_furniture(html)
    assert (
        '<span class="caption-number">练习 1.1</span>（有缺失条目的软查找）</p>' in out
    )
    assert ">参考答案：<a " in out and ">练习 1.1（有缺失条目的软查找）</a>" in out
    assert " (" not in out and "解答" not in out
