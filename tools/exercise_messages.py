"""The message catalog of the exercise self-checks: find every template, keep the
Chinese catalog in step with the code.

A learner-visible message of ``transformer_course.exercises`` is an English template
(its ``{placeholders}`` filled in after translating) written as a string literal in one
of these places, which is where this tool looks (``ast``, without running the code):

- the first two arguments of ``fail(message, hint, ...)``, the first of
  ``passed(what, ...)`` and of ``_print_hint(hint)``;
- the argument of ``gettext(...)`` (translate now) and ``N_(...)`` (a template kept in
  a constant or a table, translated where it is shown);
- a ``hint=`` or ``nan_hint=`` keyword (``check_close``'s hints).

An f-string in one of these places is an error: it would be formatted before it is
translated, so no catalog entry could match it.

    python tools/exercise_messages.py update   # add new templates, drop stale ones
    python tools/exercise_messages.py check    # exit 1 if anything is untranslated
"""

from __future__ import annotations

import ast
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "transformer_course" / "exercises"
CATALOG = PACKAGE / "locale" / "zh" / "LC_MESSAGES" / "exercises.po"

CALLS = {
    "fail": (0, 1),
    "passed": (0,),
    "_print_hint": (0,),
    "gettext": (0,),
    "N_": (0,),
}
KEYWORDS = {"hint", "nan_hint"}
# a fixed header date, so that `update` rewrites the file only when a message changes
_DATE = datetime(2026, 12, 1, tzinfo=timezone.utc)


def templates_in(source: str, filename: str = "<source>"):
    """``(templates, problems)`` of one module's source: ``templates`` lists
    ``(template, line)`` in source order, ``problems`` an f-string in a message place
    as "file:line: ..."."""
    templates, problems = [], []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        places = [node.args[i] for i in CALLS.get(name, ()) if i < len(node.args)]
        places += [k.value for k in node.keywords if k.arg in KEYWORDS]
        for arg in places:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                templates.append((arg.value, arg.lineno))
            elif isinstance(arg, ast.JoinedStr):
                problems.append(
                    f"{filename}:{arg.lineno}: an f-string where a message template "
                    "belongs: write the template and pass the values as fields"
                )
    templates.sort(key=lambda t: t[1])
    return templates, problems


def extract(package: Path = PACKAGE) -> tuple[dict[str, list[str]], list[str]]:
    """Every template of the package's modules -> the files using it (in order of
    first use), and the problems found (see ``templates_in``)."""
    found: dict[str, list[str]] = {}
    problems: list[str] = []
    for path in sorted(package.glob("*.py")):
        rel = path.relative_to(package).as_posix()
        templates, bad = templates_in(path.read_text(encoding="utf-8"), rel)
        problems += bad
        for template, _line in templates:
            files = found.setdefault(template, [])
            if rel not in files:
                files.append(rel)
    return found, problems


def read_catalog(path: Path = CATALOG) -> dict[str, str]:
    """The catalog, msgid -> msgstr (an empty msgstr: not translated yet)."""
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        return {m.id: m.string for m in read_po(f) if m.id}


def update(path: Path = CATALOG) -> tuple[int, int]:
    """Rewrite the catalog with the package's templates: translations kept, new
    templates added with an empty msgstr, stale entries dropped. Returns (added,
    dropped)."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    found, problems = extract()
    if problems:
        raise SystemExit("\n".join(problems))
    old = read_catalog(path) if path.exists() else {}
    catalog = Catalog(
        locale="zh_Hans_CN",
        header_comment=(
            "# Chinese messages and hints of the transformer_course exercise self-checks\n"
            "# (msgid: the English template). Terms follow book/zh/glossary.yml.\n"
            "# Update: python tools/exercise_messages.py update"
        ),
        project="transformer_course exercises",
        version="0.1.0",
        copyright_holder="the course's authors",
        msgid_bugs_address="",
        last_translator="the course's authors",
        creation_date=_DATE,
        revision_date=_DATE,
        language_team="zh <https://github.com/>",
        fuzzy=False,
    )
    for template, files in found.items():
        locations = [(f"src/transformer_course/exercises/{f}", None) for f in files]
        catalog.add(template, old.get(template, ""), locations=locations)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=88, include_lineno=False, omit_header=False)
    return len(set(found) - set(old)), len(set(old) - set(found))


def main(argv: list[str]) -> int:
    if argv[1:] == ["update"]:
        added, dropped = update()
        print(f"{CATALOG.relative_to(ROOT)}: {added} added, {dropped} dropped")
        return 0
    if argv[1:] == ["check"]:
        found, problems = extract()
        catalog = read_catalog()
        missing = [t for t in found if not catalog.get(t)]
        stale = [t for t in catalog if t not in found]
        for label, items in (("untranslated", missing), ("stale", stale)):
            for t in items:
                print(f"{label}: {t!r}")
        print(*problems, sep="\n")
        return 1 if missing or stale or problems else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
