"""The Chinese edition (book/zh/) cannot drift from the English one: each Chinese page
has its English page's code cells byte for byte, the same directives, glue names and
cross-reference labels, is stamped with the sha256 of the English file it translates
(stale when that file changed since), and follows the glossary book/zh/glossary.yml.
Every English page is translated or listed in tools/translation.py NOT_TRANSLATED_YET.

Each check is also shown rejecting a known-wrong input: a translated code comment, a
dropped exercise, an edited English file, an untranslated page missing from the list,
a rejected term."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "translation", ROOT / "tools" / "translation.py"
)
translation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(translation)

ZH = ROOT / "book" / "zh"
PAGES = sorted(ZH.glob("*.md"))
TERMS = translation.glossary()


def english(page: Path) -> str:
    return translation.english_source(page).read_text(encoding="utf-8")


def chinese(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def test_there_are_chinese_pages():
    assert {p.stem for p in PAGES} >= {"intro", "pitfalls", "references"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_code_cells_are_the_english_ones_byte_for_byte(page):
    en, zh = (
        translation.code_cells(english(page)),
        translation.code_cells(chinese(page)),
    )
    assert len(zh) == len(en), f"{page.name}: {len(zh)} code cells, English {len(en)}"
    for i, (a, b) in enumerate(zip(en, zh, strict=True)):
        assert a == b, f"{page.name}: code cell {i} differs from the English page's"


def test_code_cell_check_rejects_a_translated_comment():
    text = english(ZH / "intro.md")
    cells = translation.code_cells(text)
    edited = text.replace("# (This page is a notebook too", "# （本页也是笔记本")
    assert translation.code_cells(edited) != cells
    retagged = text.replace(":tags: [remove-cell]", ":tags: [hide-input]")
    assert translation.code_cells(retagged) != cells


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_directives_outline_glue_and_labels_are_the_english_ones(page):
    en, zh = english(page), chinese(page)
    assert translation.directives(zh) == translation.directives(en)
    assert translation.heading_levels(zh) == translation.heading_levels(en)
    assert translation.glue_names(zh, chinese=True) == translation.glue_names(en)
    assert translation.labels(zh) == translation.labels(en)


EXERCISE = """
```{exercise} Batched lookup
:label: ex-qkv-batched
Write it. See {ref}`sec-qkv` and {glue:text}`acc:.1f`.
```

```{solution} ex-qkv-batched
:class: dropdown
Answer.
```
"""


def test_directive_outline_glue_and_label_checks_reject_a_changed_page():
    dropped = EXERCISE.replace(":label: ex-qkv-batched\n", "")
    assert translation.directives(dropped) != translation.directives(EXERCISE)
    unclassed = EXERCISE.replace(":class: dropdown", "")
    assert translation.directives(unclassed) != translation.directives(EXERCISE)
    admonition = EXERCISE.replace("{exercise}", "{note}")
    assert translation.directives(admonition) != translation.directives(EXERCISE)
    reglued = EXERCISE.replace("acc:.1f", "acc:.2f")
    assert translation.glue_names(reglued) != translation.glue_names(EXERCISE)
    chinese_words = EXERCISE.replace("`acc:.1f`", "`acc_zh:.1f`")
    assert translation.glue_names(chinese_words, chinese=True) == (
        translation.glue_names(EXERCISE)
    )
    assert translation.glue_names(chinese_words) != translation.glue_names(EXERCISE)
    relabelled = EXERCISE.replace("{ref}`sec-qkv`", "{ref}`sec-kqv`")
    assert translation.labels(relabelled) != translation.labels(EXERCISE)
    outline = "# Title\n\n## Part\n\n```python\n# a comment\n```\n"
    assert translation.heading_levels(outline) == [1, 2]
    assert translation.heading_levels(outline.replace("## Part", "### Part")) != [1, 2]
    retitled = EXERCISE.replace("Batched lookup", "批量查找")
    assert translation.directives(retitled) == translation.directives(EXERCISE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_translation_is_stamped_with_its_current_english_source(page):
    record = translation.recorded(page)
    assert record.get("source") == f"book/{page.name}", f"{page.name}: {record}"
    assert not translation.is_stale(page), (
        f"book/{page.name} changed since {page.relative_to(ROOT)} was translated: "
        f"update it, then `python tools/translation.py stamp book/zh/{page.name}`"
    )


def copy_of_the_editions(tmp_path: Path, pages: list[str]) -> Path:
    (tmp_path / "book" / "zh").mkdir(parents=True)
    for name in pages:
        for folder in ("book", "book/zh"):
            if (ROOT / folder / f"{name}.md").exists():
                shutil.copy(ROOT / folder / f"{name}.md", tmp_path / folder)
    return tmp_path


def test_an_edited_english_file_makes_its_translation_stale(tmp_path):
    root = copy_of_the_editions(tmp_path, ["pitfalls"])
    page = root / "book" / "zh" / "pitfalls.md"
    assert not translation.is_stale(page)
    source = root / "book" / "pitfalls.md"
    source.write_text(source.read_text() + "\nA new paragraph.\n")
    assert translation.is_stale(page)
    translation.stamp(page)
    assert not translation.is_stale(page)


def test_stamp_keeps_the_front_matter_and_replaces_the_old_record(tmp_path):
    root = copy_of_the_editions(tmp_path, ["intro"])
    page = root / "book" / "zh" / "intro.md"
    before = page.read_text()
    (root / "book" / "intro.md").write_text(english(ZH / "intro.md") + "\n")
    digest = translation.stamp(page)
    after = page.read_text()
    assert after.count("translation:") == 1 and digest in after
    assert translation.front_matter(after)["kernelspec"]["name"] == "python3"
    assert after.split("\n---\n", 1)[1] == before.split("\n---\n", 1)[1]
    bare = root / "book" / "zh" / "bare.md"
    bare.write_text("# 无\n")
    with pytest.raises(FileNotFoundError, match="zh_page"):
        translation.stamp(bare)


def test_every_english_page_is_translated_or_listed_as_not_yet():
    assert translation.status() == []


def test_status_reports_missing_stale_and_listed_but_translated_pages(tmp_path):
    root = copy_of_the_editions(tmp_path, ["intro", "pitfalls", "01_qkv"])
    (root / "_toc.yml").write_text(
        "root: book/intro\nchapters:\n  - file: book/pitfalls\n  - file: book/01_qkv\n"
        "  - file: book/05_masks\n"
    )
    (root / "book" / "zh" / "01_qkv.md").write_text("# 一\n")
    (root / "book" / "05_masks.md").write_text("# Masks\n")
    (root / "book" / "pitfalls.md").write_text("# Pitfalls, edited\n")
    (root / "book" / "zh" / "intro.md").unlink()
    problems = "\n".join(translation.status(root, not_yet=("01_qkv", "05_masks")))
    assert "intro: missing" in problems
    assert "pitfalls: stale" in problems
    assert "01_qkv: translated, remove it from NOT_TRANSLATED_YET" in problems
    assert "05_masks" not in problems  # listed as not translated yet


def test_chinese_toc_lists_exactly_the_chinese_pages():
    toc = yaml.safe_load((ZH / "_toc.yml").read_text())
    listed = {toc["root"], *re.findall(r"file:\s*(\S+)", (ZH / "_toc.yml").read_text())}
    assert listed == {p.stem for p in PAGES}


def test_not_translated_yet_names_english_pages_only():
    pages = set(translation.english_pages())
    assert set(translation.NOT_TRANSLATED_YET) <= pages


def test_glossary_is_well_formed():
    seen = set()
    for term in TERMS:
        assert set(term) <= {"en", "zh", "reject", "reject_pattern", "en_pattern"}, term
        assert term["en"] not in seen, f"{term['en']} is listed twice"
        seen.add(term["en"])
        assert term["zh"], term
        assert term["zh"] not in (term.get("reject") or []), term
    assert {"query", "key", "value", "token"} <= seen


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_glossary_terms_are_used_consistently(page):
    problems = translation.glossary_problems(english(page), chinese(page), TERMS)
    assert not problems, f"{page.name}: " + "; ".join(problems)


def test_glossary_check_rejects_a_wrong_variant_and_a_missing_term():
    en = "Each token attends to the keys; the batch axis; beam search."
    right = "每个词元关注各个键；批量轴；束搜索。"
    assert translation.glossary_problems(en, right, TERMS) == []
    wrong = right.replace("词元", "令牌")
    problems = translation.glossary_problems(en, wrong, TERMS)
    assert any("'token'" in p for p in problems) and any("令牌" in p for p in problems)
    missing = right.replace("束搜索", "集束搜索")
    assert any(
        "集束搜索" in p for p in translation.glossary_problems(en, missing, TERMS)
    )
    in_code = "Call `beam_search(tokens)`."
    assert translation.glossary_problems(in_code, "调用。", TERMS) == []
    exercise = "```{exercise} T\n:label: ex-beam\nUse beam search.\n```\n"
    problems = translation.glossary_problems(
        exercise, exercise.replace("Use beam search.", "用集束搜索。"), TERMS
    )
    assert any("集束搜索" in p for p in problems)  # an exercise's text is checked
    solution = "````{solution} ex-beam\n```python\nbeam = 1  # beam search\n```\n````\n"
    assert (
        translation.glossary_problems(solution, solution, TERMS) == []
    )  # its code not
    verb = "It patches `pickle.dump` so that tests pass."
    assert translation.glossary_problems(verb, "篡改。", TERMS) == []


# One term per concept (book/zh/glossary.yml): no rejected variant and no English term
# left in the prose of a Chinese page, of the Chinese self-check catalog, or of the
# Chinese notebooks' markdown; the glossary's header says what may stay English.
GLOSSARY = yaml.safe_load((ZH / "glossary.yml").read_text(encoding="utf-8"))
CODE_NAMES = tuple(GLOSSARY.get("catalog_code_names") or ())
NAMES = tuple(GLOSSARY.get("names") or ())
NOTEBOOKS = sorted((ROOT / "notebooks" / "zh").glob("*.ipynb"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_chinese_page_writes_one_term_per_concept(page):
    problems = translation.term_problems(
        translation.chinese_prose(chinese(page), NAMES), TERMS
    )
    assert not problems, f"{page.name}: " + "; ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_chinese_notebook_writes_one_term_per_concept(notebook):
    markdown = translation.notebook_markdown(notebook)
    problems = translation.term_problems(
        translation.chinese_prose(markdown, NAMES), TERMS
    )
    assert not problems, f"notebooks/zh/{notebook.name}: " + "; ".join(problems)


def test_the_chinese_self_checks_write_one_term_per_concept():
    messages = translation.catalog_messages()
    assert len(messages) > 500
    problems = [
        f"{msgid[:40]!r}: {problem}"
        for msgid, msgstr in messages
        for problem in translation.term_problems(
            translation.message_prose(msgstr), TERMS, allow=CODE_NAMES
        )
    ]
    assert not problems, "exercises.po: " + "; ".join(problems)


def test_catalog_code_names_are_argument_names_of_the_exercises():
    source = "\n".join(
        p.read_text(encoding="utf-8")
        for p in (ROOT / "src" / "transformer_course" / "exercises").glob("*.py")
    )
    for name in CODE_NAMES:
        assert re.search(rf"\b{name}\s*[=:,)]", source), name


def test_the_term_check_rejects_a_planted_variant_and_english_left_in_prose():
    right = (
        "每个查询保留一个累积最大值和一个累积和；评估时关闭暂退法（dropout）。"
        "最好的头把注意力集中在注意力汇点上，平均汇聚之后，"
        "“previous token”（前一个词元）一栏最亮。\n\n"
        "代码里写作 `dropout_p`，数学里是 $\\text{dropout}$。\n\n"
        "    def f(mask, dropout=0.0):\n        return mask\n"
    )
    assert translation.term_problems(translation.chinese_prose(right), TERMS) == []
    for wrong, reported in [
        ("累积最大值", "运行最大值"),
        ("累积和", "运行和"),
        ("注意力汇点", "注意力汇聚点"),
        ("平均汇聚", "平均池化"),
        ("暂退法（dropout）", "dropout"),
        ("暂退法（dropout）", "暂退法（dropout，即随机丢弃）"),
        ("“previous token”（前一个词元）", "“previous token”"),
    ]:
        planted = right.replace(wrong, reported, 1)
        problems = translation.term_problems(translation.chinese_prose(planted), TERMS)
        assert problems, f"planted {reported!r} passed"
    # an ordinary word that contains a variant is not one: 运行和修改 = run and change
    ordinary = "想亲手运行和修改代码。"
    assert translation.term_problems(translation.chinese_prose(ordinary), TERMS) == []
    # the book's English title is a name, not the term "attention"
    title = "注明出自 “Attention, Illustrated”。"
    assert translation.term_problems(translation.chinese_prose(title), TERMS)
    assert not translation.term_problems(translation.chinese_prose(title, NAMES), TERMS)


def test_the_catalog_check_keeps_code_and_rejects_english_prose():
    code = "函数签名是 my_softmax(scores, mask=None, dim=-1)，在 {mask} 处填充。"
    assert translation.term_problems(translation.message_prose(code), TERMS) == []
    prose = "评估时要关闭 dropout 再比较。"
    assert translation.term_problems(translation.message_prose(prose), TERMS)
    variant = "运行最大值应当先更新。"
    assert translation.term_problems(translation.message_prose(variant), TERMS)
    name = "写出两个都含 warmup 的分支。"
    assert translation.term_problems(translation.message_prose(name), TERMS)
    assert not translation.term_problems(
        translation.message_prose(name), TERMS, allow=("warmup",)
    )
