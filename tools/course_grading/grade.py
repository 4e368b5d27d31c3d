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
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from course_grading.feedback import feedback, flags, flags_report
from course_grading.sandbox import Sandbox, SandboxUnavailable, choose

ROOT = Path(__file__).resolve().parents[2]


def _notebook_bytes(path: Path) -> tuple[bytes | None, str]:
    """(the notebook's bytes, "") or (None, why it is not graded)."""
    if path.suffix == ".ipynb":
        return path.read_bytes(), ""
    if path.suffix == ".zip":
        try:
            with zipfile.ZipFile(path) as z:
                names = [
                    n
                    for n in z.namelist()
                    if n.endswith(".ipynb") and not n.startswith("__MACOSX")
                ]
                if len(names) != 1:
                    return None, f"the zip holds {len(names)} notebooks, expected 1"
                return z.read(names[0]), ""
        except zipfile.BadZipFile:
            return None, "not a readable zip file"
    return None, "neither a notebook (.ipynb) nor the zip of grader.export()"


def _assignment_name(data: bytes) -> str | None:
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return (nb.get("metadata", {}).get("otter", {}) or {}).get("assignment_name")


def find_submissions(folder: Path) -> tuple[list[tuple[str, Path, bytes]], list[tuple]]:
    """([(student, file, notebook bytes)], [(student, file, reason skipped)]):
    SUBMISSIONS/<student>.ipynb|.zip or SUBMISSIONS/<student>/<one notebook or zip>;
    SUBMISSIONS may also be one notebook or zip (a single regrade)."""
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
    return found, skipped


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


def grade_one(
    student: str,
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
            status = f"otter run failed (exit code {rc}{died})"
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
        except (ValueError, IndexError):
            rechecked = {"_setup": {"message": "the re-check failed: " + out2[-500:]}}
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
            jobs.append((student, data, name))
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
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(
                grade_one,
                s,
                d,
                *zips[a],
                specs[a],
                sandbox,
                args.timeout,
                args.call_timeout,
            )
            for s, d, a in jobs
        ]
        results = [f.result() for f in futures]
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
                        "",
                        *[""] * len(questions),
                        "",
                        f"skipped {path.name}: {why}",
                        "",
                        "",
                    ]
                )
    for r in results:
        (out / "feedback" / f"{r['student']}.md").write_text(
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
