"""Generate notebooks/<chapter>.ipynb (for Colab) from book/<chapter>.md (MyST), and
notebooks/zh/<chapter>.ipynb from the Chinese edition's book/zh/<chapter>.md.

    python tools/sync_notebooks.py          # write notebooks/
    python tools/sync_notebooks.py --check  # exit 1 if notebooks/ is out of date

What changes on the way:
- a first code cell that installs the course's library from the repository configured in
  _config.yml, skipped when the package is already importable;
- MyST-only syntax becomes plain Markdown that Jupyter and Colab render: exercises become
  headed sections, solutions collapsed <details> blocks, admonitions block quotes,
  cross-references the title they point at, citations "[Author et al., year]" and the
  chapter's bibliography a list of the works it cites, with their links (from
  book/references.bib);
- a paragraph that quotes numbers the chapter measures (myst_nb's {glue:text} roles)
  becomes a code cell, its code hidden in Colab, that shows the paragraph with the
  numbers the learner's own run measured (transformer_course.viz.glue.prose);
- where the book shows a library function's source, a code cell prints it;
- in a Chinese notebook the install cell also sets ``TRANSFORMER_COURSE_LANG=zh``
  before the library is imported (so the exercise self-checks answer in Chinese while
  the chapter's own code cells stay identical to the English ones), and the words the
  conversion adds ("Exercise", "Solution") are Chinese.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

import jupytext
import latexcodec  # noqa: F401  (registers the 'latex' codec)
import nbformat
import yaml
from pybtex.database import parse_file

ROOT = Path(__file__).resolve().parents[1]
BOOK, NOTEBOOKS = ROOT / "book", ROOT / "notebooks"
CHAPTER = re.compile(r"^\d\d_.+\.md$")
BIBTEX = BOOK / "references.bib"
CITE_ROLES = ("cite", "cite:p", "cite:t", "cite:ps", "cite:ts")


def repository() -> tuple[str, str]:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/"), config["repository"]["branch"]


# The words the conversion adds, per edition; convert() sets WORDS for its chapter.
EDITION_WORDS = {
    "en": {
        "exercise": "Exercise",
        "exercise_ref": "the exercise “{title}”",
        "solution": "Solution (click to open)",
        "sep": ": ",
        "prose": "Run to read this text with the numbers measured above",
        "pitfalls": "*The text and the self-check messages cite pitfalls by id, such as "
        "P16: the book's [Pitfall index]({url}) says what each one is and where it was "
        "reported.*",
    },
    "zh": {
        "exercise": "练习",
        # the Chinese prose already says 练习 before the reference: 练习 {ref}`ex-...`
        "exercise_ref": "“{title}”",
        "solution": "参考答案（点击展开）",
        "sep": "：",
        "prose": "运行此单元格，用上面实测的数字显示这段文字",
        "pitfalls": "*正文和自测信息用编号（例如 P16）指称常见陷阱：本书的"
        "[常见陷阱索引]({url})说明每一个是什么、在哪里被报告过。*",
    },
}
WORDS = EDITION_WORDS["en"]


def editions() -> list[tuple[Path, Path, str]]:
    """(book folder, notebook folder, language) of each edition."""
    return [(BOOK, NOTEBOOKS, "en"), (BOOK / "zh", NOTEBOOKS / "zh", "zh")]


def language_lines(language: str) -> str:
    """What a notebook's install cell sets before anything imports the library."""
    if language == "en":
        return ""
    return (
        "import os\n\n"
        "# the exercise self-checks speak this edition's language\n"
        f'os.environ["TRANSFORMER_COURSE_LANG"] = "{language}"\n'
    )


def install_cell(url: str, branch: str, language: str = "en") -> nbformat.NotebookNode:
    source = f"""# Set-up: installs the course library when it is missing (e.g. in Colab);
# does nothing where it is already installed. In Colab, pick a GPU under
# Runtime -> Change runtime type; every chapter uses it when present.
{language_lines(language)}import importlib.util
import subprocess
import sys

if importlib.util.find_spec("transformer_course") is None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q",
         "transformer_course @ git+{url}@{branch}"],
        check=True,
    )"""
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["colab-setup"]})


_FENCE = re.compile(
    r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>[^\n]*)\n"
    r"(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_ADMONITIONS = {
    "note",
    "tip",
    "important",
    "warning",
    "caution",
    "attention",
    "hint",
    "admonition",
    "seealso",
    "danger",
    "error",
}


@functools.cache
def _bibliography() -> dict:
    return parse_file(str(BIBTEX)).entries


def _plain(text: str) -> str:
    """BibTeX field text as Unicode: LaTeX accents decoded, braces dropped; the
    field may hold Unicode itself (O(n²))."""
    return re.sub(r"[{}]", "", text.encode("utf-8").decode("latex+utf-8"))


def _surnames(key: str) -> list[str]:
    persons = _bibliography()[key].persons
    people = persons.get("author") or persons.get("editor") or []
    return [_plain(" ".join(p.last_names)) for p in people]


def citation(key: str) -> str:
    """The in-text citation, e.g. "Bahdanau et al., 2015", of a references.bib key.

    Raises:
        KeyError: the key is not in references.bib (the book build fails on it too).
    """
    names, year = _surnames(key), _bibliography()[key].fields.get("year", "n.d.")
    if len(names) > 2:
        who = f"{names[0]} et al."
    elif names:
        who = " and ".join(names)
    else:
        who = _plain(_bibliography()[key].fields.get("title", key))
    return f"{who}, {year}"


def reference(key: str) -> str:
    """One bibliography line in Markdown: authors (year). *Title*. Venue. Link."""
    entry = _bibliography()[key]
    fields = {name: _plain(value) for name, value in entry.fields.items()}
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    authors = ", ".join(
        _plain(
            " ".join(p.first_names + p.middle_names + p.prelast_names + p.last_names)
        )
        for p in people
    )
    venue = next(
        (
            fields[f]
            for f in ("booktitle", "journal", "publisher", "howpublished")
            if f in fields
        ),
        "",
    )
    parts = [f"{authors} ({fields.get('year', 'n.d.')}). *{fields.get('title', key)}*."]
    if venue:
        parts.append(f"{venue}.")
    if "url" in fields:
        parts.append(f"<{fields['url']}>")
    return "- " + " ".join(parts)


def cited_keys(text: str) -> list[str]:
    """The citation keys of MyST text, in order of first use, each once."""
    keys = []
    for match in _ROLE.finditer(text):
        if match["role"] in CITE_ROLES:
            keys += [k.strip() for k in match["text"].split(",") if k.strip()]
    return list(dict.fromkeys(keys))


def _strip_options(body: str) -> tuple[dict[str, str], str]:
    options, lines = {}, body.split("\n")
    while lines and lines[0].startswith(":"):
        key, _, value = lines.pop(0)[1:].partition(":")
        options[key.strip()] = value.strip()
    return options, "\n".join(lines).strip("\n")


def _directive(
    match: re.Match, cited: list[str] = (), labels: dict | None = None, glue=False
) -> str:
    name, arg = match["name"], match["arg"].strip()
    options, body = _strip_options(match["body"])
    body = to_plain_markdown(body, cited, labels, glue=glue)
    if name == "exercise":
        title = WORDS["exercise"] + (WORDS["sep"] + arg if arg else "")
        return f"#### {title}\n\n{body}"
    if name == "solution":
        summary = WORDS["solution"]
        return f"<details>\n<summary>{summary}</summary>\n\n{body}\n\n</details>"
    if name in _ADMONITIONS:
        title = arg or name.capitalize()
        quoted = "\n".join("> " + line if line else ">" for line in body.split("\n"))
        return f"> **{title}**\n>\n{quoted}"
    if name == "math":
        return f"$$\n{body}\n$$"
    if name in ("figure", "image"):
        return f"![{options.get('alt', arg)}]({arg})\n\n{body}"
    if name == "literalinclude":  # convert() makes it a code cell; elsewhere a pointer
        what = options.get("pyobject", "the code")
        path = arg.removeprefix("../")
        return f"*The book shows the library's source of `{what}` (`{path}`) here.*"
    if name == "bibliography":
        if not cited:
            return "See the book's references page for the full bibliography."
        return "\n".join(reference(key) for key in cited)
    return body


_ROLE = re.compile(r"\{(?P<role>[\w:-]+)\}`(?P<text>[^`]*)`")


GLUED_ELSEWHERE = "(a number measured in the chapter)"


def _role(match: re.Match, labels: dict | None = None, glue: bool = False) -> str:
    role, text = match["role"], match["text"]
    if role in CITE_ROLES:
        keys = [key.strip() for key in text.split(",") if key.strip()]
        return "[" + "; ".join(citation(key) for key in keys) + "]"
    if role == "math":
        return f"${text}$"
    if role.startswith("glue"):  # kept for prose(), which fills in the value
        return match[0] if glue else GLUED_ELSEWHERE
    title = re.match(r"^(.*?)\s*<[^>]+>$", text)
    if title:
        return title.group(1)
    return (labels or {}).get(text, text)


_LABELLED = re.compile(
    r"^(?:`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>[^\n]*)\n:label:[ \t]*(?P<label>\S+)",
    re.MULTILINE,
)
_TARGET = re.compile(
    r"^\((?P<label>[\w:-]+)\)=\s*\n#+\s*(?P<title>[^\n]+)", re.MULTILINE
)


def labels_of(text: str) -> dict[str, str]:
    """What a reference to each label of a chapter reads as in a notebook: an
    exercise's "the exercise "Smaller patches"", a section's heading, a directive's
    title."""
    labels = {m["label"]: f"“{m['title'].strip()}”" for m in _TARGET.finditer(text)}
    for m in _LABELLED.finditer(text):
        title = m["arg"].strip() or m["name"]
        labels[m["label"]] = (
            WORDS["exercise_ref"].format(title=title)
            if m["name"] == "exercise"
            else f"“{title}”"
        )
    return labels


def to_plain_markdown(
    text: str, cited: list[str] = (), labels: dict | None = None, *, glue: bool = False
) -> str:
    """MyST -> Markdown that Jupyter renders; `cited` lists the keys the
    bibliography directive (if any) expands to, `labels` what a reference to each
    label reads as (``labels_of``). Glued numbers become a phrase, or with
    ``glue=True`` stay as roles for ``prose`` to fill in."""
    text = _FENCE.sub(
        functools.partial(_directive, cited=cited, labels=labels, glue=glue), text
    )
    text = _ROLE.sub(functools.partial(_role, labels=labels, glue=glue), text)
    return re.sub(r"^\([\w:-]+\)=\s*\n", "", text, flags=re.MULTILINE)  # MyST targets


def prose_cell(markdown: str, language: str = "en") -> nbformat.NotebookNode:
    """A paragraph that quotes measured numbers, as a code cell (its code hidden in
    Colab, under a title in the edition's ``language``) that shows the paragraph with
    the numbers this kernel measured."""
    if '"""' in markdown or markdown.endswith("\\"):
        raise ValueError(f"cannot quote this paragraph in a string: {markdown[:80]!r}")
    source = (
        f"# @title {EDITION_WORDS[language]['prose']} "
        '{ display-mode: "form" }\n'
        "from transformer_course.viz.glue import prose\n\n"
        f'prose(r"""{markdown}""")'
    )
    return nbformat.v4.new_code_cell(
        source, metadata={"cellView": "form", "tags": ["colab-prose"]}
    )


def source_cell(match: re.Match) -> nbformat.NotebookNode:
    """The code cell a notebook has where the book shows library source (a
    ``literalinclude`` of a ``pyobject``): it prints that source."""
    options, _ = _strip_options(match["body"])
    what = options["pyobject"]
    module = (
        match["arg"]
        .strip()
        .removeprefix("../src/")
        .removesuffix(".py")
        .replace("/", ".")
    )
    return nbformat.v4.new_code_cell(
        f"# the library's source of {what}, which the book shows here\n"
        "import inspect\n\n"
        f"import {module}\n\n"
        f"print(inspect.getsource({module}.{what}))"
    )


def _split_sources(cells: list) -> list:
    """Markdown cells cut where they include library source, with a code cell that
    prints it in between."""
    out = []
    for cell in cells:
        if cell.cell_type != "markdown":
            out.append(cell)
            continue
        text, start = cell.source, 0
        for match in _FENCE.finditer(text):
            if match["name"] != "literalinclude" or "pyobject:" not in match["body"]:
                continue
            if text[start : match.start()].strip():
                out.append(nbformat.v4.new_markdown_cell(text[start : match.start()]))
            out.append(source_cell(match))
            start = match.end()
        if start == 0:
            out.append(cell)
        elif text[start:].strip():
            out.append(nbformat.v4.new_markdown_cell(text[start:].lstrip("\n")))
    return out


def convert(
    md_path: Path, url: str, branch: str, language: str = "en"
) -> nbformat.NotebookNode:
    global WORDS
    WORDS = EDITION_WORDS[language]
    nb = jupytext.read(md_path)
    cited = cited_keys(md_path.read_text())
    labels = labels_of(md_path.read_text())
    nb.cells = _split_sources(nb.cells)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            glued = _ROLE.search(cell.source) and "{glue" in cell.source
            cell.source = to_plain_markdown(cell.source, cited, labels, glue=glued)
            if glued:
                nb.cells[i] = cell = prose_cell(cell.source, language)
        cell.pop("id", None)
    nb.cells.insert(0, install_cell(url, branch, language))
    # the pitfall ids (P1 ...) cited by the text and the checks, looked up from Colab
    index = f"{url}/blob/{branch}/book/{'' if language == 'en' else language + '/'}"
    pointer = WORDS["pitfalls"].format(url=index + "pitfalls.md")
    nb.cells.insert(2, nbformat.v4.new_markdown_cell(pointer))
    nb.metadata.pop("jupytext", None)
    nb.metadata.pop("translation", None)
    nb.metadata["colab"] = {"provenance": [], "toc_visible": True}
    nb.metadata["accelerator"] = "GPU"
    nb.nbformat, nb.nbformat_minor = 4, 5
    for i, cell in enumerate(nb.cells):  # stable ids keep the sync check deterministic
        cell["id"] = f"{md_path.stem[:2]}-{i:03d}"
    return nb


def chapters(book: Path | None = None) -> list[Path]:
    return sorted(p for p in (book or BOOK).glob("*.md") if CHAPTER.match(p.name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if out of date")
    args = parser.parse_args(argv)
    url, branch = repository()
    stale, extra, expected = [], [], set()
    for book, notebooks, language in editions():
        found = chapters(book)
        if found:
            notebooks.mkdir(parents=True, exist_ok=True)
        for md in found:
            out = notebooks / f"{md.stem}.ipynb"
            expected.add(out)
            text = nbformat.writes(convert(md, url, branch, language)) + "\n"
            if out.exists() and out.read_text() == text:
                continue
            stale.append(out.relative_to(NOTEBOOKS.parent).as_posix())
            if not args.check:
                out.write_text(text)
        extra += sorted(p for p in notebooks.glob("*.ipynb") if p not in expected)
    if args.check and (stale or extra):
        print(
            "notebooks/ is out of date with book/: "
            + ", ".join(stale + [f"{e.name} (no chapter)" for e in extra])
            + "\nRun `make notebooks` and commit the result.",
            file=sys.stderr,
        )
        return 1
    if not args.check:
        for path in extra:
            path.unlink()
        print(f"notebooks/: {len(expected)} chapter(s), {len(stale)} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
