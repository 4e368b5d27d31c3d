"""Grade submitted notebooks (``make grade``): otter's run and the isolated re-check, both
in the sandbox (``course_grading.sandbox``); a question scores when both pass it.

For every submission (SUBMISSIONS/<student>.ipynb, SUBMISSIONS/<student>/*.ipynb, or the
zip that the notebook's ``grader.export()`` writes, either way) in its own temporary folder
with a fresh copy of the autograder zip: `otter run` under a time limit, then the re-check.
Writes grades.csv, otter_grades.csv, feedback/<student>.md (for the student, to send as
it is), flags.md (for the instructor only), results.json and warnings.txt into the results
folder; every file that is not graded gets a row with the reason.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from course_grading.feedback import feedback, flags, flags_report
from course_grading.recheck import capped
from course_grading.sandbox import Sandbox, SandboxUnavailable, choose

ROOT = Path(__file__).resolve().parents[2]


def _notebook_bytes(path: Path) -> tuple[bytes | None, str]:
    """(the notebook's bytes, "") or (None, why it is not graded)."""
    if path.suffix == ".ipynb":
        data = path.read_bytes()
    elif path.suffix == ".zip":
        try:
            with zipfile.ZipFile(path) as z:
                names = [
                    n
                    for n in z.namelist()
                    if n.endswith(".ipynb") and not n.startswith("__MACOSX")
                ]
                if len(names) != 1:
                    return None, f"the zip holds {len(names)} notebooks, expected 1"
                data = z.read(names[0])
        except zipfile.BadZipFile:
            return None, "not a readable zip file"
    else:
        return None, "neither a notebook (.ipynb) nor the zip of grader.export()"
    why = notebook_problem(data)
    return (None, why) if why else (data, "")


def notebook_problem(data: bytes) -> str:
    """Why ``data`` is not a notebook that can be graded ("" when it is): empty, not
    UTF-8, not JSON (with the line), or JSON without a list of cells."""
    if not data.strip():
        return f"not a valid notebook: the file is empty ({len(data)} bytes)"
    try:
        nb = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return "not a valid notebook: the file is not UTF-8 text"
    except json.JSONDecodeError as err:
        return (
            f"not a valid notebook: invalid JSON at line {err.lineno}, column "
            f"{err.colno} ({err.msg}); the file may be cut short"
        )
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return "not a valid notebook: JSON without a list of cells"
    return ""


def _assignment_name(data: bytes) -> str | None:
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return (nb.get("metadata", {}).get("otter", {}) or {}).get("assignment_name")


def with_assignment(data: bytes, name: str) -> bytes:
    """The notebook with otter's metadata naming ``name`` when it names none: otter's
    runner refuses a notebook whose assignment name differs from the autograder's,
    ``None`` included (a chapter's Colab notebook, or the cells copied into a fresh
    one: instructor trial 2026-12-03, finding 3)."""
    if _assignment_name(data) is not None:
        return data
    nb = json.loads(data.decode("utf-8"))
    meta = nb.setdefault("metadata", {})
    otter = meta.get("otter") if isinstance(meta.get("otter"), dict) else {}
    meta["otter"] = {**otter, "assignment_name": name}
    return json.dumps(nb).encode("utf-8")


def find_submissions(folder: Path) -> tuple[list[tuple[str, Path, bytes]], list[tuple]]:
    """([(student, file, notebook bytes)], [(student, file, reason skipped)]):
    SUBMISSIONS/<student>.ipynb|.zip or SUBMISSIONS/<student>/<one notebook or zip>;
    SUBMISSIONS may also be one notebook or zip (a single regrade). A student who
    handed in more than one file (alice.ipynb, alice.zip, alice/) gets one row for
    each, named by the file: "alice (alice.zip)" (``duplicates`` flags them)."""
    found, skipped = [], []
    entries = [folder] if folder.is_file() else sorted(folder.iterdir())
    for p in entries:
        if p.name.startswith("."):
            continue
        files = (
            [p]
            if p.is_file()
            else sorted(f for f in p.iterdir() if f.suffix in (".ipynb", ".zip"))
        )
        if p.is_dir() and len(files) != 1:
            skipped.append(
                (
                    p.name,
                    p,
                    (f"the folder holds {len(files)} notebooks or zips, expected 1"),
                )
            )
            continue
        data, why = _notebook_bytes(files[0])
        student = p.stem if p.is_file() else p.name
        if data is None:
            skipped.append((student, files[0], why))
        else:
            found.append((student, files[0], data))
    names = [s for s, _, _ in found] + [s for s, _, _ in skipped]
    base = folder if folder.is_dir() else folder.parent

    def named(student: str, path: Path) -> str:
        if names.count(student) < 2:
            return student
        return f"{student} ({path.relative_to(base)})"

    return (
        [(named(s, p), p, d) for s, p, d in found],
        [(named(s, p), p, w) for s, p, w in skipped],
    )


def duplicates(students: list[str]) -> dict[str, list[str]]:
    """{student: [the rows named after their files]} for a student with several."""
    out: dict[str, list[str]] = {}
    for s in students:
        if s.endswith(")") and " (" in s:
            out.setdefault(s.split(" (", 1)[0], []).append(s)
    return {k: v for k, v in out.items() if len(v) > 1}


def feedback_name(student: str) -> str:
    """The feedback file's name for a row: the student, made safe as a file name."""
    safe = "".join(c if c.isalnum() or c in "-_.() " else "_" for c in student)
    return safe.strip(". ") or "student"


def _run_limited(
    cmd: list[str], cwd: Path, timeout: float, env: dict | None = None
) -> tuple[int | None, str]:
    """Run in a new process group; kill the whole group at the time limit (rc None)."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        try:
            os.killpg(
                proc.pid, signal.SIGKILL
            )  # also any process the notebook left behind
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        log.seek(0)
        return rc, log.read().decode("utf-8", "replace")


_NOISE = ("Kernel is running over TCP without encryption",)


def _otter_reason(log: str) -> str:
    """ ": <the last error line of otter's log>" (e.g. otter's refusal of a notebook
    for another assignment), or "" when there is none."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", ln)]
    return f": {capped(errors[-1], 300)}" if errors else ""


def grade_one(
    student: str,
    file: str,
    notebook: bytes,
    zip_bytes: bytes,
    zip_name: str,
    spec: dict,
    sandbox: Sandbox,
    timeout: float,
    call_timeout: float,
) -> dict:
    """Grade one submission in a fresh temporary folder; returns scores and feedback."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        work = Path(tmp)
        run = work / "otter"  # the only folder otter's run of the notebook can write
        run.mkdir()
        (run / "submission.ipynb").write_bytes(notebook)
        (run / zip_name).write_bytes(zip_bytes)
        start = time.perf_counter()
        cmd = [
            sys.executable,
            "-m",
            "otter",
            "run",
            "--no-logo",
            "-a",
            zip_name,
            "-o",
            "out",
            "submission.ipynb",
        ]
        (run / "out").mkdir()
        rc, log = _run_limited(
            sandbox.command(cmd, run), run, timeout, sandbox.env(run)
        )
        log = "\n".join(
            ln for ln in log.splitlines() if not any(n in ln for n in _NOISE)
        )
        otter_s = time.perf_counter() - start
        otter_scores, otter_tests, status = {}, {}, "ok"
        result_file = run / "out" / "results.json"
        if rc is None:
            status = f"time limit: otter run stopped after {timeout:g} s"
        elif rc != 0 or not result_file.exists():
            died = (
                f", killed by signal {-rc if rc < 0 else rc - 128}"
                if (rc < 0 or rc > 128)
                else ""
            )
            status = f"otter run failed (exit code {rc}{died})" + _otter_reason(log)
        else:
            try:
                for t in json.loads(result_file.read_text()).get("tests", []):
                    q = t.get("name", "").split(" - ")[0]
                    otter_scores[q] = otter_scores.get(q, 0.0) + float(
                        t.get("score") or 0
                    )
                    otter_tests.setdefault(q, []).append(t.get("output", ""))
            except (ValueError, TypeError, AttributeError):
                status = "otter run failed (unreadable results)"
        trusted = work / "recheck"  # never visible to the learner's code
        trusted.mkdir()
        (trusted / "spec.json").write_text(json.dumps(spec))
        (trusted / "submission.ipynb").write_bytes(notebook)
        (trusted / "sandbox.json").write_text(sandbox.to_json())
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "tools"), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        _, out2 = _run_limited(
            [
                sys.executable,
                "-m",
                "course_grading.recheck",
                "spec.json",
                "submission.ipynb",
                "sandbox.json",
                str(call_timeout),
            ],
            trusted,
            timeout,
            env,
        )
        try:
            rechecked = json.loads(out2.strip().splitlines()[-1])
        except (ValueError, IndexError):  # one line for flags.md, not a traceback
            last = [ln for ln in out2.strip().splitlines() if ln.strip()][-1:] or ["?"]
            rechecked = {
                "_setup": {"message": "the re-check failed: " + capped(last[0], 300)}
            }
        rows = {}
        for q in spec["questions"]:
            name, pts = q["name"], float(q["points"])
            rows[name] = min(
                otter_scores.get(name, 0.0),
                float(rechecked.get(name, {}).get("score", 0.0)),
                pts,
            )
        result = {
            "student": student,
            "file": file,
            "assignment": spec["assignment"],
            "status": status,
            "scores": rows,
            "otter": otter_scores,
            "otter_tests": otter_tests,
            "recheck": rechecked,
            "seconds": time.perf_counter() - start,
            "otter_seconds": otter_s,
            "sandbox": sandbox.backend,
            "otter_log": log[-2000:],
        }
        result["flags"] = flags(result, spec)
        return result


def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.py"))
    }


def _load_assignments(root: Path) -> tuple[dict, dict]:
    specs, zips = {}, {}
    for spec_path in sorted(root.glob("*/grading.json")):
        spec = json.loads(spec_path.read_text())
        zip_path = min((spec_path.parent / "autograder").glob("*.zip"))
        specs[spec["assignment"]] = spec
        zips[spec["assignment"]] = (zip_path.read_bytes(), zip_path.name)
    return specs, zips


def submissions_problem(folder: Path) -> str:
    """Why SUBMISSIONS cannot be read (one line), or "" when it can."""
    if not folder.exists():
        return f"SUBMISSIONS: {folder} does not exist (expected a folder of notebooks)"
    if folder.is_file() and folder.suffix not in (".ipynb", ".zip"):
        return (
            f"SUBMISSIONS: {folder} is a file but not a notebook (.ipynb) or the zip "
            "of grader.export(); expected a folder of them, or one of them"
        )
    if folder.is_dir():
        try:
            next(folder.iterdir(), None)
        except OSError as err:
            return f"SUBMISSIONS: cannot read {folder}: {err.strerror}"
    return ""


def grade(args: argparse.Namespace) -> int:
    import transformer_course

    folder = Path(args.submissions).expanduser().resolve()
    root = Path(args.assignments).resolve()
    out = Path(
        args.out or ROOT / "dist" / "grades" / time.strftime("%Y%m%d-%H%M%S")
    ).resolve()
    problem = submissions_problem(folder)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        backend = choose(args.sandbox)
    except SandboxUnavailable as err:
        print(f"refusing to grade: {err}", file=sys.stderr)
        return 2
    hide = [str(p) for p in (ROOT, folder, root, out)]
    sandbox = Sandbox(backend, hide=hide, memory_mb=args.memory)
    # Everything the grading trusts is read into memory once, before any submission runs.
    specs, zips = _load_assignments(root)
    if not specs:
        print(
            f"no assignments in {root}: run `make assignments` first", file=sys.stderr
        )
        return 1
    library = Path(transformer_course.__file__).parent
    library_digest = _tree_digest(library)
    found, skipped = find_submissions(folder)
    jobs = []
    base = folder if folder.is_dir() else folder.parent
    for student, path, data in found:
        name = _assignment_name(data) or args.assignment
        if name not in specs:
            skipped.append(
                (
                    student,
                    path,
                    (
                        f"unknown assignment {name!r} (valid: "
                        f"{', '.join(specs)}; --assignment NAME for notebooks without "
                        "otter metadata)"
                    ),
                )
            )
        else:
            jobs.append(
                (
                    student,
                    str(path.relative_to(base)),
                    with_assignment(data, name),
                    name,
                )
            )
    for student, path, why in skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    if not jobs:
        if skipped:  # every file gets its row, also when none could be graded
            write_results(out, [], skipped, specs, [])
        print(
            f"no submissions to grade in {folder}"
            + (
                f" ({len(skipped)} skipped, one row each in {out / 'grades.csv'})"
                if skipped
                else ""
            ),
            file=sys.stderr,
        )
        return 1
    start = time.perf_counter()
    print(f"grading {len(jobs)} submissions (sandbox: {backend}) ...", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            pool.submit(
                grade_one,
                s,
                f,
                d,
                *zips[a],
                specs[a],
                sandbox,
                args.timeout,
                args.call_timeout,
            ): s
            for s, f, d, a in jobs
        }
        done_by_student = {}
        for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
            r = future.result()
            done_by_student[futures[future]] = r
            possible = sum(
                float(q["points"]) for q in specs[r["assignment"]]["questions"]
            )
            print(
                f"[{i}/{len(jobs)}] {r['student']}: {sum(r['scores'].values()):g} / "
                f"{possible:g}, {r['status']} ({r['seconds']:.0f} s, "
                f"{time.perf_counter() - start:.0f} s in all)"
                + ("  FLAGGED" if r["flags"] else ""),
                flush=True,
            )
        results = [done_by_student[s] for s, _, _, _ in jobs]
    for student, rows in duplicates(
        [r["student"] for r in results] + [s for s, _, _ in skipped]
    ).items():
        for r in results:
            if r["student"] in rows:
                r["flags"].append(
                    f"{student} handed in {len(rows)} files ("
                    + ", ".join(x.split(" (", 1)[1][:-1] for x in rows)
                    + "): each is graded on a row of its own; keep the one that counts"
                )
    warnings = []
    if backend == "none":
        warnings.append(
            "graded WITHOUT a sandbox (--sandbox none): the learners' code ran "
            "as your user, with your files and network"
        )
    if _tree_digest(library) != library_digest:
        warnings.append(
            f"{library} changed on disk while grading (a submission may have "
            "rewritten the checker): restore it and grade again"
        )
    write_results(out, results, skipped, specs, warnings)
    print(
        f"graded {len(results)} submissions in {time.perf_counter() - start:.0f} s "
        f"(sandbox: {backend}), skipped {len(skipped)}"
    )
    for r in results:
        print(
            f"  {r['student']:<24} {sum(r['scores'].values()):g}  {r['status']}  "
            f"(otter {r['otter_seconds']:.0f} s, all {r['seconds']:.0f} s)"
            + ("  FLAGGED" if r["flags"] else "")
        )
    for w in warnings:
        print(f"WARNING: {w}")
    print(f"results: {out}")
    return 0


def write_results(
    out: Path,
    results: list[dict],
    skipped: list[tuple],
    specs: dict,
    warnings: list[str],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    questions = [
        q["name"]
        for a in sorted({r["assignment"] for r in results})
        for q in specs[a]["questions"]
    ]
    for filename, key in (("grades.csv", "scores"), ("otter_grades.csv", "otter")):
        with open(out / filename, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(
                [
                    "student",
                    "file",
                    "assignment",
                    *questions,
                    "total",
                    "status",
                    "flags",
                    "sandbox",
                ]
            )
            for r in results:
                vals = [r[key].get(q, "") for q in questions]
                total = sum(v for v in vals if v != "")
                w.writerow(
                    [
                        r["student"],
                        r.get("file", ""),
                        r["assignment"],
                        *vals,
                        total,
                        r["status"],
                        " | ".join(r["flags"]),
                        r["sandbox"],
                    ]
                )
            for student, path, why in skipped:
                w.writerow(
                    [
                        student,
                        path.name,
                        "",
                        *[""] * len(questions),
                        "",
                        f"skipped {path.name}: {why}",
                        "",
                        "",
                    ]
                )
    for r in results:
        (out / "feedback" / f"{feedback_name(r['student'])}.md").write_text(
            feedback(r, specs[r["assignment"]])
        )
    (out / "flags.md").write_text(flags_report(results, specs, warnings))
    (out / "results.json").write_text(
        json.dumps(
            {
                "results": results,
                "skipped": [
                    {"student": s, "file": str(p), "reason": why}
                    for s, p, why in skipped
                ],
                "warnings": warnings,
            },
            indent=1,
            default=str,
        )
    )
    (out / "warnings.txt").write_text("".join(w + "\n" for w in warnings))
