"""notebooks/*.ipynb are generated from book/*.md and must stay in sync; what the
generator writes (install cell, plain Markdown) is what Colab can use."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "sync_notebooks", ROOT / "tools" / "sync_notebooks.py"
)
sync = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sync)

CHAPTERS = sync.chapters()


def test_every_chapter_in_the_toc_has_a_notebook_and_vice_versa():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"file: book/(\d\d_\w+)", toc))
    assert listed, "no numbered chapter in _toc.yml"
    assert listed == {p.stem for p in CHAPTERS}, (
        "a chapter file is missing from _toc.yml"
    )
    assert listed == {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}


def test_notebooks_are_in_sync_with_the_book():
    assert sync.main(["--check"]) == 0, "run `make notebooks` and commit notebooks/"


def test_the_sync_check_detects_an_edited_chapter(tmp_path, monkeypatch):
    book, notebooks = tmp_path / "book", tmp_path / "notebooks"
    book.mkdir()
    shutil.copy(CHAPTERS[0], book / CHAPTERS[0].name)
    monkeypatch.setattr(sync, "BOOK", book)
    monkeypatch.setattr(sync, "NOTEBOOKS", notebooks)
    assert sync.main([]) == 0 and sync.main(["--check"]) == 0
    chapter = book / CHAPTERS[0].name
    chapter.write_text(chapter.read_text() + "\nOne more sentence.\n")
    assert sync.main(["--check"]) == 1


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_notebook_is_colab_ready(chapter):
    nb = nbformat.read(ROOT / "notebooks" / f"{chapter.stem}.ipynb", as_version=4)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert (
        'find_spec("transformer_course") is None' in first.source
    )  # skipped if installed
    assert f"git+{config['url']}@{config['branch']}" in first.source
    compile(first.source, "install-cell", "exec")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            assert not re.search(r"^(```|:::)\{", cell.source, re.MULTILINE), (
                cell.source[:200]
            )
            assert "{cite}" not in cell.source and "{solution}" not in cell.source
        assert not cell.get("outputs"), "notebooks are committed without outputs"


def test_solutions_are_collapsed_in_the_notebook():
    nb = nbformat.read(ROOT / "notebooks" / "01_qkv.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert text.count("<details>") >= 3 and "<summary>Solution" in text
    assert "#### Exercise: Soft lookup" in text


def test_bibtex_fields_become_unicode_text():
    # LaTeX accents decoded, braces dropped, Unicode kept (the "latex" codec alone
    # raised UnicodeDecodeError on O(n²) and stopped make book)
    assert (
        sync._plain(r"Does Not Need {O(n²)} M{\"u}ller") == "Does Not Need O(n²) Müller"
    )


def test_plain_markdown_conversion():
    md = (
        "```{note}\nBe careful.\n```\n"
        "See {cite}`vaswani2017attention` and {ref}`the mask <sec-mask>`."
    )
    out = sync.to_plain_markdown(md)
    assert "> **Note**" in out and "> Be careful." in out
    assert "[Vaswani et al., 2017]" in out and "the mask" in out and "{" not in out


def test_notebook_citations_read_as_author_year_with_a_reference_list():
    """Review 5.6: Colab shows no raw citation keys; each notebook ends with the
    works its chapter cites, with their links (LaTeX accents decoded)."""
    assert sync.citation("hochreiter1997long") == "Hochreiter and Schmidhuber, 1997"
    assert sync.citation("bahdanau2015neural") == "Bahdanau et al., 2015"
    assert "Jürgen Schmidhuber" in sync.reference("hochreiter1997long")
    with pytest.raises(KeyError):
        sync.citation("no_such_key2099")
    md = "{cite}`luong2015effective, vaswani2017attention` then {cite}`luong2015effective`"
    assert sync.cited_keys(md) == ["luong2015effective", "vaswani2017attention"]
    bib = sync.to_plain_markdown("```{bibliography}\n```", ["vaswani2017attention"])
    assert bib.startswith("- ") and "https://arxiv.org/abs/1706.03762" in bib
    nb = nbformat.read(ROOT / "notebooks" / "01_qkv.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "[Bahdanau et al., 2015]" in text and "bahdanau2015neural" not in text
    for key in sync.cited_keys((ROOT / "book" / "01_qkv.md").read_text()):
        assert sync.reference(key) in text, key


RUFF = ROOT / ".venv" / "bin" / "ruff"


def _undefined_names(paths: list[Path]) -> str:
    """ruff's undefined-name and redefinition rules over notebooks (a cell that uses a
    name no earlier cell imports fails the build only after minutes of execution)."""
    import subprocess

    ruff = str(RUFF) if RUFF.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    run = subprocess.run(
        [
            ruff,
            "check",
            "--no-cache",
            "--select",
            "F821,F811",
            "--output-format",
            "concise",
            "--config",
            "extend-exclude=[]",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    return run.stdout if run.returncode else ""


def test_no_chapter_uses_a_name_it_never_defines():
    found = _undefined_names(sorted((ROOT / "notebooks").glob("*.ipynb")))
    assert not found, f"undefined names in the chapters:\n{found}"


def test_the_undefined_name_check_finds_a_missing_import(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import math"),
        nbformat.v4.new_code_cell("start = time.perf_counter()"),
    ]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    assert "time" in _undefined_names([path])


def _unresolved_imports(paths: list[Path]) -> list[str]:
    """Every ``from transformer_course... import name`` in the notebooks' code cells
    that does not resolve (a name moved to another module fails the build only when
    the chapter executes)."""
    import ast
    import importlib.util

    bad = []
    for path in paths:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            code = "\n".join(
                line
                for line in cell.source.splitlines()
                if not line.lstrip().startswith(("%", "!"))
            )
            for node in ast.walk(ast.parse(code)):
                if not (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.module.startswith("transformer_course")
                ):
                    continue
                module = importlib.import_module(node.module)
                is_package = hasattr(module, "__path__")
                bad += [
                    f"{path.name}: from {node.module} import {a.name}"
                    for a in node.names
                    if not hasattr(module, a.name)
                    and not (
                        is_package
                        and importlib.util.find_spec(f"{node.module}.{a.name}")
                    )
                ]
    return bad


def test_every_library_import_of_the_chapters_resolves():
    bad = _unresolved_imports(sorted((ROOT / "notebooks").glob("*.ipynb")))
    assert not bad, "names the library no longer has:\n" + "\n".join(bad)


def test_the_import_check_finds_a_moved_name(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from transformer_course.pretrained import FIRST_WORD_ID_THAT_MOVED"
        )
    ]
    path = tmp_path / "moved.ipynb"
    nbformat.write(nb, path)
    assert _unresolved_imports([path]) == [
        "moved.ipynb: from transformer_course.pretrained import FIRST_WORD_ID_THAT_MOVED"
    ]


def test_a_glued_paragraph_becomes_a_cell_that_shows_the_measured_numbers(
    tmp_path, capsys
):
    """Regression (learner trial 2026-12-01, finding 3): every glued number read
    "[printed above]" in Colab, also where no cell printed it."""
    from transformer_course.viz import glue as glue_module

    md = tmp_path / "01_x.md"
    md.write_text(
        CHAPTERS[0].read_text().split("---", 2)[0]
        + "---"
        + CHAPTERS[0].read_text().split("---", 2)[1]
        + "---\n\nIt copies {glue:text}`share:.0f`% and {glue:text}`verdict` the "
        "target.\n\nNo number here.\n"
    )
    nb = sync.convert(md, "https://example.org/repo", "main")
    (cell,) = [c for c in nb.cells if "colab-prose" in c.metadata.get("tags", [])]
    assert cell.cell_type == "code" and cell.metadata["cellView"] == "form"
    assert all("[printed above]" not in c.source for c in nb.cells)
    glue_module.glue("share", 91.66)
    glue_module.glue("verdict", "meets")
    shown = []
    monkey = {"display": shown.append}
    code = cell.source.replace(
        "from transformer_course.viz.glue import prose",
        "from transformer_course.viz.glue import fill\n"
        "def prose(text):\n    display(fill(text))",
    )
    exec(code, monkey)  # noqa: S102
    assert shown == ["It copies 92% and meets the target.\n\nNo number here."]


def test_glue_keeps_the_chinese_words_beside_the_english_ones():
    from transformer_course.viz.glue import fill, glue

    glue("tc_test_verdict", "meets", zh="达到了")
    assert fill("It {glue:text}`tc_test_verdict` it.") == "It meets it."
    assert fill("它{glue:text}`tc_test_verdict_zh`。") == "它达到了。"
    glue("tc_test_number", 3.0)  # no Chinese words: nothing glued as _zh
    with pytest.raises(KeyError, match="tc_test_number_zh"):
        fill("{glue:text}`tc_test_number_zh`")


def test_fill_names_a_value_no_cell_has_glued():
    from transformer_course.viz.glue import fill

    with pytest.raises(KeyError, match="never_glued"):
        fill("{glue:text}`never_glued:.1f`")


def _glued_names(code: str) -> list[re.Pattern]:
    """The names a code cell glues, f-string fields read as wildcards; a call with
    ``zh=`` also glues ``<name>_zh`` (the Chinese words the Chinese edition quotes)."""
    import ast

    patterns = []
    for node in ast.walk(ast.parse(code)):
        if not (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "glue"
            and node.args
        ):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant):
            pattern = re.escape(first.value)
        elif isinstance(first, ast.JoinedStr):
            pattern = "".join(
                re.escape(v.value) if isinstance(v, ast.Constant) else ".+"
                for v in first.values
            )
        else:
            continue
        patterns.append(re.compile(pattern + "$"))
        if any(k.arg == "zh" for k in node.keywords):
            patterns.append(re.compile(pattern + "_zh$"))
    return patterns


def test_glued_names_reads_chinese_words_and_f_strings():
    code = 'glue("a", 1)\nglue(f"{n}_vs", "x", zh="y", display=False)\n'
    names = _glued_names(code)
    assert [p.pattern for p in names] == ["a$", ".+_vs$", ".+_vs_zh$"]
    assert not any(p.match("a_zh") for p in names)  # glued without zh=


ZH_CHAPTERS = sorted((ROOT / "book" / "zh").glob("[0-9][0-9]_*.md"))


@pytest.mark.parametrize(
    "chapter",
    CHAPTERS + ZH_CHAPTERS,
    ids=lambda p: p.relative_to(ROOT / "book").with_suffix("").as_posix(),
)
def test_every_glued_number_is_computed_before_the_text_that_quotes_it(chapter):
    """A notebook's prose cell fills in its numbers when it runs: each must have been
    glued by a code cell above it (and no raw label or placeholder is left)."""
    nb = sync.convert(chapter, "https://example.org/repo", "main")
    glued: list[re.Pattern] = []
    for cell in nb.cells:
        if "colab-prose" in cell.metadata.get("tags", []):
            for name in re.findall(r"\{glue:text\}`([\w-]+)", cell.source):
                assert any(p.match(name) for p in glued), (chapter.name, name)
        elif cell.cell_type == "code":
            glued += _glued_names(cell.source)
        else:
            assert "[printed above]" not in cell.source
            assert not re.search(r"\bex-[a-z]+-[a-z-]+\b", cell.source), cell.source


def test_a_reference_to_an_exercise_reads_as_its_title():
    """Regression (learner trial 2026-12-01, finding 3): "(exercise ex-vision-patch-size
    measures it)" showed the raw label."""
    text = (
        "```{exercise} Smaller patches\n:label: ex-vision-patch-size\nTry p = 2.\n```\n"
    )
    labels = sync.labels_of(text)
    out = sync.to_plain_markdown("(see {ref}`ex-vision-patch-size`)", labels=labels)
    assert out == "(see the exercise “Smaller patches”)"


def test_library_source_the_book_shows_is_printed_by_a_code_cell(capsys):
    """Regression (learner trial 2026-12-01, finding 9): the notebooks said
    "inspect.getsource prints it" where the book shows library source, with no cell
    that did."""
    chapter = next(p for p in CHAPTERS if p.stem == "07_optimizations")
    nb = sync.convert(chapter, "https://example.org/repo", "main")
    (cell,) = [c for c in nb.cells if "source of tiled_forward" in c.source]
    assert cell.cell_type == "code"
    exec(cell.source, {})  # noqa: S102
    assert "def tiled_forward(" in capsys.readouterr().out
    assert not any("inspect.getsource` prints it" in c.source for c in nb.cells)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapters_glue_through_the_library(chapter):
    """Regression (Colab simulation, 2026-12-01): a chapter with its own ``try: from
    myst_nb import glue`` fallback glues nothing in Colab, so the prose cells that quote
    its numbers raise there; ``viz.glue.glue`` works in both."""
    text = chapter.read_text()
    assert "from myst_nb import glue" not in text, chapter.name
    assert "from transformer_course.viz.glue import glue" in text or "glue(" not in text


def test_chinese_notebooks_set_the_language_before_the_library_is_imported(
    tmp_path, monkeypatch
):
    book, notebooks = tmp_path / "book", tmp_path / "notebooks"
    (book / "zh").mkdir(parents=True)
    chapter = CHAPTERS[0]
    shutil.copy(chapter, book / chapter.name)
    shutil.copy(chapter, book / "zh" / chapter.name)  # a stand-in translation
    monkeypatch.setattr(sync, "BOOK", book)
    monkeypatch.setattr(sync, "NOTEBOOKS", notebooks)
    assert sync.main([]) == 0 and sync.main(["--check"]) == 0
    zh = nbformat.read(notebooks / "zh" / f"{chapter.stem}.ipynb", as_version=4)
    en = nbformat.read(notebooks / f"{chapter.stem}.ipynb", as_version=4)
    setup = zh.cells[0].source
    assert 'os.environ["TRANSFORMER_COURSE_LANG"] = "zh"' in setup
    assert setup.index("TRANSFORMER_COURSE_LANG") < setup.index("transformer_course")
    assert "TRANSFORMER_COURSE_LANG" not in en.cells[0].source
    compile(setup, "install-cell", "exec")

    def code(nb):  # the prose cells' titles are each edition's (issue 41)
        return [
            c.source.split("\n", 1)[-1]
            if "colab-prose" in c.metadata.get("tags", [])
            else c.source
            for c in nb.cells[1:]
            if c.cell_type == "code"
        ]

    assert code(zh) == code(en)
    markdown = "\n".join(c.source for c in zh.cells if c.cell_type == "markdown")
    assert "#### 练习：" in markdown and "<summary>参考答案" in markdown
    (notebooks / "zh" / "99_gone.ipynb").write_text("{}")
    assert sync.main(["--check"]) == 1  # a Chinese notebook with no chapter


def test_every_chinese_chapter_has_its_notebook():
    zh = {p.stem for p in sync.chapters(ROOT / "book" / "zh")}
    assert zh == {p.stem for p in (ROOT / "notebooks" / "zh").glob("*.ipynb")}


@pytest.mark.parametrize(
    "notebook",
    sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")),
    ids=lambda p: p.stem,
)
def test_notebook_points_to_the_pitfall_index(notebook):
    """A Colab learner meeting "(pitfall P16)" can look it up (learner trial L8): the
    notebook links the index page of the repository, a file that exists."""
    cells = nbformat.read(notebook, as_version=4).cells
    links = [
        m
        for c in cells
        if c.cell_type == "markdown"
        for m in re.findall(r"\]\((https://[^)]+/pitfalls\.md)\)", c.source)
    ]
    assert len(links) == 1, links
    path = links[0].split("/blob/", 1)[1].split("/", 1)[1]  # after the branch
    assert (ROOT / path).exists(), path


def prose_titles_not_in(language: str, notebook: nbformat.NotebookNode) -> list[str]:
    """The Colab titles of ``notebook``'s prose cells that are not ``language``'s."""
    title = f"# @title {sync.EDITION_WORDS[language]['prose']} "
    return [
        cell.source.splitlines()[0]
        for cell in notebook.cells
        if "colab-prose" in cell.metadata.get("tags", [])
        and not cell.source.startswith(title)
    ]


def test_the_chinese_notebooks_title_their_prose_cells_in_chinese():
    """Chinese review 2026-12-03, M5: the 39 prose cells of notebooks/zh were titled in
    English, the text a Colab reader sees before running them."""
    zh = [
        nbformat.read(p, as_version=4)
        for p in sorted((ROOT / "notebooks" / "zh").glob("*.ipynb"))
    ]
    cells = [
        c for nb in zh for c in nb.cells if "colab-prose" in c.metadata.get("tags", [])
    ]
    assert cells, "no prose cell in notebooks/zh"
    assert all(prose_titles_not_in("zh", nb) == [] for nb in zh)
    assert re.search(r"[\u4e00-\u9fff]", sync.EDITION_WORDS["zh"]["prose"])
    # known wrong: an English notebook's titles are not the Chinese ones
    english = nbformat.read(
        ROOT / "notebooks" / CHAPTERS[0].with_suffix(".ipynb").name, as_version=4
    )
    assert prose_titles_not_in("zh", english), "the check passes an English title"
