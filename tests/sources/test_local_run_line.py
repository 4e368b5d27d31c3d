"""The launch line of every chapter page (book/_ext/course_site.py) says how to run the
chapter without Colab (issue 41, item 6: Colab is blocked in mainland China): a link
that downloads the chapter's notebook from the site itself, and one install command that
installs the requirement the notebook's own install cell names (tools/sync_notebooks.py),
so that cell then does nothing. tests/slow/test_local_run.py runs the command.

Each check also rejects a known-wrong input: a page of the other edition's folder, a
command with another repository, a download link that does not resolve."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


course_site = load("course_site", ROOT / "book" / "_ext" / "course_site.py")
sync_notebooks = load("sync_notebooks", ROOT / "tools" / "sync_notebooks.py")
REPOSITORY = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
URL, BRANCH = REPOSITORY["url"], REPOSITORY["branch"]


def relative_uri(source: str, target: str) -> str:
    """Sphinx's StandaloneHTMLBuilder.get_relative_uri for html pages."""
    up = "../" * source.count("/")
    return f"{up}{target}.html"


def fake_app(chinese: bool):
    srcdir = ROOT / "_build" / "zh" if chinese else ROOT
    return SimpleNamespace(
        config=SimpleNamespace(
            language="zh_CN" if chinese else "en",
            html_theme_options={"repository_url": URL, "repository_branch": BRANCH},
            root_doc="intro" if chinese else "book/intro",
        ),
        srcdir=str(srcdir),
        builder=SimpleNamespace(get_relative_uri=relative_uri),
    )


def launch_lines(chinese: bool, pagename: str) -> str:
    context = {"body": "<h1>x</h1>"}
    course_site._add_link(fake_app(chinese), pagename, "page.html", context, object())
    return context["body"]


def test_the_install_command_installs_what_the_install_cell_names():
    command = course_site.local_install_command(URL, BRANCH)
    requirement = re.search(r'"(transformer_course @ [^"]+)"', command)[1]
    for language in ("en", "zh"):
        cell = sync_notebooks.install_cell(*sync_notebooks.repository(), language)
        assert f'"{requirement}"' in cell.source
        assert 'find_spec("transformer_course") is None' in cell.source
    assert command.startswith("pip install jupyterlab ")
    other = course_site.local_install_command("https://github.com/o/r", BRANCH)
    assert other != command and "git+https://github.com/o/r@" in other


@pytest.mark.parametrize(
    ("chinese", "pagename", "folder", "words"),
    [
        (True, "01_qkv", "notebooks/zh", "下载本章的笔记本"),
        (False, "book/01_qkv", "notebooks", "download the chapter's notebook"),
    ],
)
def test_every_chapter_page_says_how_to_run_it_locally(
    chinese, pagename, folder, words
):
    body = launch_lines(chinese, pagename)
    chapter = pagename.split("/")[-1]
    assert f"{folder}/{chapter}.ipynb" in body  # the Colab line, as before
    local = re.search(r'<p class="local-run">(.*?)</p>', body)[1]
    assert words in local
    command = course_site.local_install_command(URL, BRANCH)
    assert command.replace('"', "&quot;") in local
    download = re.search(r'href="([^"]+)" download>', local)[1]
    # the page's folder on the site + the link = the copy that _copy_notebooks makes
    site_page = Path("/site") / f"{pagename}.html"
    served = (site_page.parent / download).resolve()
    assert served == Path("/site") / course_site.NOTEBOOK_COPIES / f"{chapter}.ipynb"
    assert (ROOT / folder / f"{chapter}.ipynb").exists()
    intro = re.search(r'href="([^"]+)">(?:前言|preface)', local)[1]
    assert (site_page.parent / intro).resolve().stem == "intro"


def test_the_chinese_line_uses_colabs_chinese_labels():
    body = launch_lines(True, "01_qkv")
    assert "代码执行程序（Runtime）" in body and "更改运行时类型" in body
    assert "</a>（运行笔记本" in body  # no space before a full-width parenthesis


def test_no_launch_line_without_a_notebook():
    assert launch_lines(True, "99_nowhere") == "<h1>x</h1>"
    assert launch_lines(False, "intro") == "<h1>x</h1>"  # not a chapter of book/


def test_the_build_serves_the_editions_notebooks(tmp_path):
    for chinese, folder in ((True, "notebooks/zh"), (False, "notebooks")):
        app = fake_app(chinese)
        app.outdir = str(tmp_path / folder)
        app.builder.format = "html"
        course_site._copy_notebooks(app, None)
        served = sorted(p.name for p in (tmp_path / folder / "_notebooks").iterdir())
        assert served == sorted(p.name for p in (ROOT / folder).glob("*.ipynb"))
        copy = tmp_path / folder / "_notebooks" / "01_qkv.ipynb"
        assert copy.read_bytes() == (ROOT / folder / "01_qkv.ipynb").read_bytes()
    failed = fake_app(True)
    failed.outdir = str(tmp_path / "failed")
    course_site._copy_notebooks(failed, RuntimeError("build failed"))
    assert not (tmp_path / "failed").exists()


def test_the_chinese_preface_gives_the_same_command():
    """The preface quotes the command the launch lines generate from _config.yml (a
    changed repository URL fails here until the preface says it too)."""
    preface = (ROOT / "book" / "zh" / "intro.md").read_text(encoding="utf-8")
    section = preface.split("## 如何运行一章", 1)[1].split("\n## ", 1)[0]
    assert course_site.local_install_command(URL, BRANCH) in section
    assert "下载本章的笔记本" in section and "jupyter lab" in section
    assert "Graphviz" in section
    moved = preface.replace("attention-illustrated@main", "elsewhere@main")
    assert course_site.local_install_command(URL, BRANCH) not in moved
