"""The test folders say what a test needs (tests/conftest.py marks each test with its
folder): library tests one file per library module, named for it; the learners'
self-checks one file per chapter. A file named for a chapter or for a module that no
longer exists (a drawer of unrelated tests) is rejected here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "transformer_course"
TIERS = ("lib", "exercises", "sources", "slow", "site")
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.md"))


def library_modules() -> set[str]:
    """Modules and sub-packages of the library, without private ones; "package" for
    the rules every module follows (what importing it loads)."""
    names = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    names |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    return names | {"package"}


def lib_file_problem(name: str, modules: set[str]) -> str | None:
    match = re.fullmatch(r"test_(\w+)\.py", name)
    if match is None or match.group(1) not in modules:
        return (
            f"tests/lib/{name}: expected test_<module>.py for a module of the library"
        )
    return None


def exercise_file_problem(name: str, chapters: list[str]) -> str | None:
    """None when ``name`` is test_checks_chNN.py for a chapter NN, or for the exercise
    module exercises/chNN.py of a chapter still to be written (its checks are tested
    before its page exists, as chapter 11's)."""
    if name == "test_messages.py":  # the rules every chapter's messages follow
        return None
    match = re.fullmatch(r"test_checks_ch(\d\d)\.py", name)
    known = match is not None and (
        any(c.startswith(match.group(1) + "_") for c in chapters)
        or (PACKAGE / "exercises" / f"ch{match.group(1)}.py").is_file()
    )
    if not known:
        return f"tests/exercises/{name}: expected test_checks_chNN.py for a chapter NN"
    return None


def test_every_test_file_is_in_a_tier_folder():
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, f"tests/ holds test files outside the tier folders: {stray}"
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name in TIERS)
    assert folders == sorted(TIERS)


def test_library_tests_are_named_for_a_module():
    modules = library_modules()
    problems = [
        lib_file_problem(p.name, modules) for p in sorted((TESTS / "lib").glob("*.py"))
    ]
    assert not [p for p in problems if p], problems


def test_exercise_tests_are_named_for_a_chapter():
    problems = [
        exercise_file_problem(p.name, CHAPTERS)
        for p in sorted((TESTS / "exercises").glob("*.py"))
    ]
    assert not [p for p in problems if p], problems


@pytest.mark.parametrize(
    "name", ["test_efficient.py", "test_generate.py", "test_ch2.py", "helpers.py"]
)
def test_a_file_not_named_for_a_module_is_rejected(name):
    assert lib_file_problem(name, library_modules()) is not None


@pytest.mark.parametrize("name", ["test_checks_efficient.py", "test_checks_ch99.py"])
def test_an_exercise_file_not_named_for_a_chapter_is_rejected(name):
    assert exercise_file_problem(name, CHAPTERS) is not None


# Under xdist the Colab simulation is one work unit and the grading tests another, each
# run on one worker test after test (tests/conftest.py GROUPS, GroupScheduling), and the
# browser tests of one page of the site one unit a page. An ``xdist_group`` mark would
# not group anything (pytest-xdist 3.8 under pytest 9), so none may stand in for it.
_GROUP_MARK = re.compile(r"xdist_group\(")


def test_the_grouped_modules_are_one_work_unit_each_and_nothing_else_is():
    import conftest  # tests/conftest.py (the rootdir's conftest, on pytest's path)

    assert sorted(conftest.GROUPS.values()) == ["colab", "grading"]
    for module, group in conftest.GROUPS.items():
        assert (ROOT / module).is_file(), module
        assert conftest.work_unit(f"{module}::test_x[01_qkv]") == group
    for nodeid in (
        "tests/site/test_site.py::test_links[01_qkv]",  # reads files: no page to share
        "tests/slow/test_scripts.py::test_x",
        "tests/slow/test_scripts.py::test_x[01_qkv]",
        "tests/slow/test_colab.py.bak::test_x",  # a name that only starts like one
        "tests/site/test_browser.py.bak::test_x[01_qkv]",
        "tests/site/test_browser.py::test_checks_reject_a_broken_page",  # no page
        "tests/site/test_browser.py::TestX::test_x[01_qkv]",  # a class's test
        "tests/site/test_browser.py::test_x[01_qkv[1]]",
        "tests/site/test_browser.py::test_x[zh/01_qkv]",  # not browsing.short's id
        "tests/site/test_browser.py::test_x[]",
    ):
        assert conftest.work_unit(nodeid) == nodeid  # known wrong: not grouped


def test_a_pages_browser_tests_are_one_work_unit():
    import conftest

    for module in conftest.PAGE_MODULES:
        assert (ROOT / module).is_file(), module
    units = {
        conftest.work_unit(f"{module}::{test}[{page}]")
        for module in conftest.PAGE_MODULES
        for test in conftest.PAGE_TEST_ORDER
        for page in ("01_qkv", "zh-01_qkv")
    }
    assert units == {"site:01_qkv", "site:zh-01_qkv"}
    assert conftest.work_unit("tests/site/test_a11y.py::test_x[zh-search]") == (
        "site:zh-search"
    )


def test_every_test_in_the_page_order_exists():
    """A test renamed in its module but not in PAGE_TEST_ORDER would run after the tests
    that change the page, and on a page loaded again: still right, but slower."""
    import conftest

    sources = "".join((ROOT / m).read_text() for m in conftest.PAGE_MODULES)
    missing = [
        name for name in conftest.PAGE_TEST_ORDER if f"def {name}(" not in sources
    ]
    assert not missing, missing
    assert len(set(conftest.PAGE_TEST_ORDER)) == len(conftest.PAGE_TEST_ORDER)


def test_unit_order_runs_a_pages_tests_together_the_first_check_first():
    import conftest

    browser, a11y = "tests/site/test_browser.py", "tests/site/test_a11y.py"
    nodeids = [
        "tests/lib/test_x.py::test_a",
        f"{a11y}::test_no_serious_or_critical_axe_violation[01_qkv]",
        f"{a11y}::test_no_serious_or_critical_axe_violation[02_x]",
        f"{a11y}::test_something_else",
        f"{browser}::test_every_solution_starts_hidden_and_opens_on_click[01_qkv]",
        f"{browser}::test_page_loads_cleanly_and_stays_on_this_host[02_x]",
        f"{browser}::test_new_check[01_qkv]",  # not in PAGE_TEST_ORDER: last
        f"{browser}::test_page_loads_cleanly_and_stays_on_this_host[01_qkv]",
        f"{browser}::test_every_animation_plays[01_qkv]",
        "tests/lib/test_x.py::test_b",
    ]
    ordered = [nodeids[i] for i in conftest.unit_order(nodeids)]
    assert sorted(ordered) == sorted(nodeids)
    assert [n.split("::")[1] for n in ordered] == [
        "test_a",
        "test_page_loads_cleanly_and_stays_on_this_host[01_qkv]",
        "test_no_serious_or_critical_axe_violation[01_qkv]",
        "test_every_animation_plays[01_qkv]",
        "test_every_solution_starts_hidden_and_opens_on_click[01_qkv]",
        "test_new_check[01_qkv]",
        "test_page_loads_cleanly_and_stays_on_this_host[02_x]",
        "test_no_serious_or_critical_axe_violation[02_x]",
        "test_something_else",
        "test_b",
    ]
    assert conftest.unit_order([]) == []


def test_the_grouped_units_are_handed_out_first_whatever_their_size():
    from collections import OrderedDict

    import conftest

    def queue(sizes):
        return OrderedDict((u, dict.fromkeys(range(n), False)) for u, n in sizes)

    # xdist's order (largest first): a page's unit larger than the Colab one
    workqueue = queue([("grading", 45), ("site:01_qkv", 20), ("colab", 16), ("t", 1)])
    conftest.first_units(workqueue)
    assert list(workqueue) == ["grading", "colab", "site:01_qkv", "t"]
    workqueue = queue([("site:01_qkv", 60), ("t", 1), ("colab", 50), ("grading", 5)])
    conftest.first_units(workqueue)
    assert list(workqueue) == ["colab", "grading", "site:01_qkv", "t"]
    workqueue = queue([("site:01_qkv", 9), ("t", 1)])  # neither: nothing moves
    conftest.first_units(workqueue)
    assert list(workqueue) == ["site:01_qkv", "t"]


def test_no_test_relies_on_an_xdist_group_mark():
    marked = sorted(
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("*.py")
        if path != Path(__file__).resolve()
        and _GROUP_MARK.search(path.read_text(encoding="utf-8"))
    )
    assert marked == [], f"xdist_group marks group nothing under pytest 9: {marked}"
    assert _GROUP_MARK.search('pytestmark = pytest.mark.xdist_group("colab")')


def test_time_by_file_adds_every_phase_of_a_files_tests():
    from types import SimpleNamespace as Report

    import conftest

    reports = [
        Report(nodeid="tests/a.py::t1", when="setup", duration=2.0),
        Report(nodeid="tests/a.py::t1", when="call", duration=3.0),
        Report(nodeid="tests/a.py::t2", when="call", duration=1.0),
        Report(nodeid="tests/b.py::t[x]", when="call", duration=10.0),
        Report(nodeid="tests/b.py::t[x]", when="teardown", duration=0.5),
        Report(nodeid="tests/c.py", when="collect", duration=99.0),  # not a test phase
    ]
    assert conftest.time_by_file(reports) == [
        ("tests/b.py", 10.5, 1),
        ("tests/a.py", 6.0, 2),
    ]
    assert conftest.time_by_file([]) == []


def modules_missing_from(readme: str, package: Path = PACKAGE) -> list[str]:
    """Library modules (and viz's) that README's module table does not name in
    backquotes: the table says what each module holds, so a new one goes in it."""
    files = [*package.glob("*.py"), *(package / "viz").glob("*.py")]
    names = sorted({p.stem for p in files if p.stem != "__init__"})
    return [name for name in names if f"`{name}`" not in readme]


def test_readme_names_every_library_module():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert modules_missing_from(readme) == []
    # a table without viz's modules, and one without `kv_cache`, are caught
    assert "plots" in modules_missing_from(readme.replace("`plots`", "plots"))
    assert modules_missing_from(readme.replace("`kv_cache`", "kv_cache")) == [
        "kv_cache"
    ]
