"""Flags for the instructor and the feedback file of one graded submission.

Two readers, two files: ``feedback(result, spec)`` is feedback/<student>.md, written for
the student and safe to forward as it is (scores, the checks' messages, the cells that
raised; never how a submission was caught, nor the grader's own paths); ``flags_report``
is flags.md, for the instructor only (every flag of every submission, what happened).
"""

from __future__ import annotations


def flags(result: dict, spec: dict) -> list[str]:
    """Why the instructor should look at this submission (empty for an ordinary one)."""
    notes = []
    if result["status"] != "ok":
        notes.append(result["status"])
    setup = result["recheck"].get("_setup", {})
    if setup.get("message"):
        notes.append(setup["message"])
    for err in setup.get("errors", []):
        if err.get("denied"):
            notes.append(
                f"blocked by the sandbox or a limit: code cell {err['cell']}: "
                f"{err['type']}: {err['message']}"[:300]
            )
    for what in setup.get("stray", []):
        notes.append(f"left a process running after its cells: {what}"[:300])
    written = setup.get("home_writes", [])
    if written:
        notes.append(
            f"wrote {len(written)} file(s) into ~ ({', '.join(written[:5])}): inside "
            "the sandbox ~ is a scratch folder, deleted after grading; your own home "
            "was not touched"[:300]
        )
    for q in spec["questions"]:
        name = q["name"]
        otter = result["otter"].get(name, 0.0)
        re = float(result["recheck"].get(name, {}).get("score", 0.0))
        if otter > re:
            notes.append(
                f"{name}: otter gave {otter:g} but the isolated re-check {re:g}"
            )
        missing = result["recheck"].get(name, {}).get("missing")
        if missing:
            notes.append(f"{name}: {missing}")
    return (
        notes  # graded without a sandbox: the "sandbox" column and warnings.txt say so
    )


def feedback(result: dict, spec: dict) -> str:
    lines = [f"# Feedback for {result['student']} ({result['assignment']})", ""]
    total = sum(result["scores"].values())
    possible = sum(float(q["points"]) for q in spec["questions"])
    lines += [f"Total: {total:g} / {possible:g}", ""]
    if result["status"] != "ok":
        lines += [
            (
                f"**{result['status']}**: no question of this notebook could be graded "
                "by otter; every question scores 0."
            ),
            "",
        ]
    errors = result["recheck"].get("_setup", {}).get("errors", [])
    if errors:
        lines += [
            (
                "Cells that raised while running your notebook (code cells counted from "
                "1, top to bottom):"
            ),
            "",
        ]
        lines += [
            f"- code cell {e['cell']}: {e['type']}: {e['message']}"[:400]
            for e in errors
        ]
        lines += [""]
    for q in spec["questions"]:
        name = q["name"]
        lines += [
            f"## {q['label']}: {result['scores'][name]:g} / {float(q['points']):g}",
            "",
        ]
        rechecked = result["recheck"].get(name, {})
        if rechecked.get("missing"):
            lines += [f"Expected function missing: {rechecked['missing']}.", ""]
        if rechecked.get("message"):
            lines += ["```", rechecked["message"], "```", ""]
        elif result["otter_tests"].get(name):
            for out in result["otter_tests"][name]:
                if out.strip():
                    lines += ["otter:", "```", out.strip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def flags_report(results: list[dict], specs: dict, warnings: list[str]) -> str:
    """flags.md: for the instructor only, each flagged submission with its flags (the
    grades.csv "flags" column in full), then the run's warnings."""
    lines = ["# Flags for the instructor (do not forward to students)", ""]
    lines += [f"**Warning:** {w}" for w in warnings] + ([""] if warnings else [])
    flagged = [r for r in results if r["flags"]]
    if not flagged:
        lines += ["No submission was flagged."]
    for r in flagged:
        spec = specs[r["assignment"]]
        possible = sum(float(q["points"]) for q in spec["questions"])
        total = sum(r["scores"].values())
        lines += [
            f"## {r['student']} ({r['assignment']}): {total:g} / {possible:g}",
            "",
            *[f"- {f}" for f in r["flags"]],
            "",
        ]
        if r["sandbox"] == "none":
            lines += ["_Graded without a sandbox (--sandbox none)._", ""]
    return "\n".join(lines).rstrip() + "\n"
