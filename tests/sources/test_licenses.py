"""The licenses agree and NOTICE.md lists every third-party part.

- The code's license is one: ``pyproject.toml``'s ``license``, the text of ``LICENSE``
  (whose copyright holder is ``_config.yml``'s author), NOTICE.md, CITATION.cff and README
  name the same MIT License; the text's, CC BY-SA 4.0, is ``LICENSE-text`` and is named by
  NOTICE.md, CITATION.cff, README and the site's footer in both editions.
- NOTICE.md has a row for every dependency in ``package.json`` and ``pyproject.toml``
  (the library's and the book build's), every package the library imports, every
  ``name==version`` that the Makefile, a chapter or the library installs or downloads,
  and every npm package the Makefile copies into the site; a row's license is the one
  the package declares (``package-lock.json``; the installed distribution's
  ``License-Expression``).

Each check is a function returning its problems, shown rejecting a known-wrong input.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
CC_BY_SA = "https://creativecommons.org/licenses/by-sa/4.0/"
MIT_FIRST_LINE = "MIT License"
MIT_GRANT = (
    "Permission is hereby granted, free of charge, to any person obtaining a copy"
)
CC_LEGAL_CODE = 'Attribution-ShareAlike 4.0 International Public License ("Public'

# a row of one of NOTICE.md's tables: | `name` | kind | where | `license` | source |
ROW = re.compile(
    r"^\|\s*`(?P<name>[^`]+)`\s*\|(?P<kind>[^|]+)\|(?P<where>[^|]+)\|"
    r"\s*`(?P<license>[^`]+)`\s*\|(?P<source>[^|]+)\|\s*$"
)
PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\d[\w.]*)$")


def normalized(name: str) -> str:
    """A package's name as registries compare it (PEP 503), without a ``==version``."""
    return re.sub(r"[-_.]+", "-", name.split("==")[0].strip()).lower()


def notice_rows(text: str) -> dict[str, dict[str, str]]:
    """{normalized name: the row's cells} of every table row of NOTICE.md."""
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line.strip())
        if match:
            cells = {k: v.strip() for k, v in match.groupdict().items()}
            rows[normalized(cells["name"])] = cells
    return rows


# -- what must have a row ----------------------------------------------------------


def npm_dependencies(package_json: str) -> list[str]:
    data = json.loads(package_json)
    return [*data.get("dependencies", {}), *data.get("devDependencies", {})]


def declared_dependencies(pyproject: str) -> list[str]:
    """The library's dependencies and the book build's (the ``book`` extra)."""
    project = tomllib.loads(pyproject)["project"]
    specs = [*project.get("dependencies", [])]
    specs += project.get("optional-dependencies", {}).get("book", [])
    return [re.match(r"[A-Za-z0-9_.-]+", spec).group(0) for spec in specs]


def pinned_installs(makefile: str, python: dict[str, str], chapters: dict[str, str]):
    """Every ``name==version`` that is installed or downloaded: on a ``pip`` line of the
    Makefile, as a string of the library's code, or as a quoted string of a chapter."""
    found = {}
    for line in makefile.splitlines():
        if "pip" in line:
            for word in line.split():
                if PINNED.match(word):
                    found[word] = "Makefile"
    for path, source in python.items():
        for node in ast.walk(ast.parse(source)):
            literal = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if literal and PINNED.match(node.value):
                found[node.value] = path
    for path, text in chapters.items():
        for quoted in re.findall(r"[\"']([^\"'\s]+)[\"']", text):
            if PINNED.match(quoted):
                found[quoted] = path
    return found


def vendored(makefile: str) -> list[str]:
    """The npm packages whose files the Makefile copies into the site."""
    return re.findall(r"\bcp\s+node_modules/((?:@[^/\s]+/)?[^/\s]+)/", makefile)


def imported_distributions(
    python: dict[str, str], distributions=None
) -> dict[str, str]:
    """{distribution: the first file importing it} for every third-party module the
    library imports (``distributions``: module -> distribution names, as
    ``importlib.metadata.packages_distributions()``; a module it does not know stands
    for a distribution of its own name)."""
    if distributions is None:
        distributions = importlib.metadata.packages_distributions()
    found = {}
    for path, source in sorted(python.items()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "transformer_course":
                    continue
                for dist in distributions.get(top, [top]):
                    found.setdefault(dist, path)
    return found


def required_parts(root: Path, distributions=None) -> dict[str, str]:
    """{normalized name: why it needs a row} for the repository at ``root``."""
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    python = {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted((root / "src").rglob("*.py"))
    }
    chapters = {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted((root / "book").glob("*.md"))
    }
    required = {}
    for name in npm_dependencies((root / "package.json").read_text(encoding="utf-8")):
        required[normalized(name)] = "package.json"
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    for name in declared_dependencies(pyproject):
        required[normalized(name)] = "pyproject.toml"
    for name in vendored(makefile):
        required[normalized(name)] = "copied into the site by the Makefile"
    for pin, where in pinned_installs(makefile, python, chapters).items():
        required.setdefault(
            normalized(pin), f"{pin}, installed or downloaded in {where}"
        )
    for dist, where in imported_distributions(python, distributions).items():
        required.setdefault(normalized(dist), f"imported in {where}")
    return required


def missing_rows(required: dict[str, str], rows: dict[str, dict]) -> list[str]:
    return [f"{name} ({why})" for name, why in required.items() if name not in rows]


def declared_license_problems(rows: dict[str, dict], package_lock: str, metadata=None):
    """Rows whose license is not the one the package declares: an npm row against
    ``package-lock.json``; a Python package's row against its installed distribution's
    ``License-Expression`` where it has one (``metadata``: name -> that expression)."""
    lock = json.loads(package_lock).get("packages", {})
    problems = []
    for name, row in rows.items():
        kind = row["kind"].lower()
        if "npm" in kind:
            declared = lock.get(f"node_modules/{row['name']}", {}).get("license")
            if declared is None:
                problems.append(
                    f"{row['name']}: an npm row that package-lock.json lacks"
                )
                continue
        elif metadata is not None:
            declared = metadata.get(name)
        else:
            try:
                declared = importlib.metadata.metadata(name).get("License-Expression")
            except importlib.metadata.PackageNotFoundError:
                declared = None
        if declared and declared != row["license"]:
            problems.append(
                f"{row['name']}: NOTICE.md says {row['license']}, the package {declared}"
            )
        if not re.search(r"https?://|/", row["source"]):
            problems.append(f"{row['name']}: no source (an address or a path)")
    return problems


# -- the course's own licenses ----------------------------------------------------


def license_problems(files: dict[str, str]) -> list[str]:
    """Where the course's two licenses disagree. ``files``: the text of pyproject.toml,
    LICENSE, LICENSE-text, NOTICE.md, CITATION.cff, README.md, _config.yml and
    book/zh/edition.yml, by those names."""
    problems = []
    declared = tomllib.loads(files["pyproject.toml"])["project"].get("license")
    if declared != "MIT":
        problems.append(f"pyproject.toml declares license {declared!r}, not 'MIT'")
    mit = files["LICENSE"]
    if mit.splitlines()[0].strip() != MIT_FIRST_LINE or MIT_GRANT not in mit:
        problems.append("LICENSE is not the MIT License's text")
    config = yaml.safe_load(files["_config.yml"])
    holder = re.search(r"^Copyright \(c\) \d{4} (.+)$", mit, re.MULTILINE)
    if holder is None or holder.group(1).strip() != config["author"]:
        problems.append(f"LICENSE's copyright holder is not {config['author']!r}")
    if CC_LEGAL_CODE not in files["LICENSE-text"]:
        problems.append("LICENSE-text does not hold CC BY-SA 4.0's legal code")
    for name in ("NOTICE.md", "README.md"):
        for words in ("MIT License", "CC BY-SA 4.0", "LICENSE-text"):
            if words not in files[name]:
                problems.append(f"{name} does not name {words}")
    citation = yaml.safe_load(files["CITATION.cff"])
    for key in ("cff-version", "message", "title", "authors"):
        if key not in citation:
            problems.append(f"CITATION.cff lacks {key} (required by CFF 1.2.0)")
    if citation.get("cff-version") != "1.2.0":
        problems.append("CITATION.cff is not CFF 1.2.0")
    if citation.get("license") != [declared, "CC-BY-SA-4.0"]:
        problems.append(f"CITATION.cff's license is {citation.get('license')}")
    version = tomllib.loads(files["pyproject.toml"])["project"]["version"]
    if str(citation.get("version")) != version:
        problems.append(f"CITATION.cff's version is not pyproject.toml's {version}")
    if citation.get("repository-code") != config["repository"]["url"]:
        problems.append(
            "CITATION.cff's repository-code is not _config.yml's repository"
        )
    chinese = yaml.safe_load(files["book/zh/edition.yml"])
    for name, edition in (("_config.yml", config), ("book/zh/edition.yml", chinese)):
        footer = (edition.get("html") or {}).get("extra_footer", "")
        if CC_BY_SA not in footer or "MIT" not in footer:
            problems.append(f"{name}: the footer does not state both licenses")
    return problems


FILES = [
    "pyproject.toml",
    "LICENSE",
    "LICENSE-text",
    "NOTICE.md",
    "CITATION.cff",
    "README.md",
    "_config.yml",
    "book/zh/edition.yml",
]


def read(root: Path = ROOT) -> dict[str, str]:
    return {name: (root / name).read_text(encoding="utf-8") for name in FILES}


def test_the_licenses_agree():
    assert license_problems(read()) == []


def test_the_license_check_rejects_a_disagreement():
    files = read()
    apache = dict(files, LICENSE="Apache License\nVersion 2.0, January 2004\n")
    assert "LICENSE is not the MIT License's text" in license_problems(apache)
    gpl = dict(files, **{"pyproject.toml": files["pyproject.toml"].replace(
        'license = "MIT"', 'license = "GPL-3.0-only"')})  # fmt: skip
    problems = license_problems(gpl)
    assert "pyproject.toml declares license 'GPL-3.0-only', not 'MIT'" in problems
    assert any(p.startswith("CITATION.cff's license") for p in problems)
    english_only = files["book/zh/edition.yml"].split("\nhtml:")[0]
    no_footer = dict(files, **{"book/zh/edition.yml": english_only})
    assert license_problems(no_footer) == [
        "book/zh/edition.yml: the footer does not state both licenses"
    ]


def test_notice_lists_every_third_party_part():
    rows = notice_rows((ROOT / "NOTICE.md").read_text(encoding="utf-8"))
    assert len(rows) >= 20, "NOTICE.md's tables were not read"
    assert missing_rows(required_parts(ROOT), rows) == []


def test_the_notice_check_finds_a_new_dependency_without_a_row(tmp_path):
    for name in ("Makefile", "package.json", "pyproject.toml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "book").mkdir()
    package = json.loads((ROOT / "package.json").read_text())
    package["dependencies"]["left-pad"] = "1.3.0"
    (tmp_path / "package.json").write_text(json.dumps(package))
    (tmp_path / "src" / "loader.py").write_text(
        'import yaml\nWHEEL = "llm-tinyllama==0.1"\n'
    )
    (tmp_path / "book" / "11_new.md").write_text(
        '```{code-cell} ipython3\npip(["install", "gt-new-model==1.0"])\n```\n'
    )
    rows = notice_rows((ROOT / "NOTICE.md").read_text(encoding="utf-8"))
    missing = missing_rows(required_parts(tmp_path, {"yaml": ["PyYAML"]}), rows)
    assert missing == [
        "left-pad (package.json)",
        "llm-tinyllama (llm-tinyllama==0.1, installed or downloaded in src/loader.py)",
        "gt-new-model (gt-new-model==1.0, installed or downloaded in book/11_new.md)",
        "pyyaml (imported in src/loader.py)",
    ]


def test_each_row_names_the_license_its_package_declares():
    rows = notice_rows((ROOT / "NOTICE.md").read_text(encoding="utf-8"))
    lock = (ROOT / "package-lock.json").read_text(encoding="utf-8")
    assert declared_license_problems(rows, lock) == []


def test_the_license_of_a_row_is_checked_against_the_package():
    rows = notice_rows((ROOT / "NOTICE.md").read_text(encoding="utf-8"))
    lock = (ROOT / "package-lock.json").read_text(encoding="utf-8")
    wrong = {
        "mathjax": dict(rows["mathjax"], license="MIT"),
        "num2words": dict(rows["num2words"], license="MIT"),
        "left-pad": dict(rows["mathjax"], name="left-pad"),
    }
    assert declared_license_problems(wrong, lock, {"num2words": "LGPL-2.1"}) == [
        "mathjax: NOTICE.md says MIT, the package Apache-2.0",
        "num2words: NOTICE.md says MIT, the package LGPL-2.1",
        "left-pad: an npm row that package-lock.json lacks",
    ]
