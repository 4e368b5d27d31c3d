"""Flags for the instructor and the feedback file of one graded submission.

Two readers, two files: ``feedback(result, spec)`` is feedback/<student>.md, written for
the student and safe to forward as it is (scores, the checks' messages, the cells that
raised; never how a submission was caught, nor the grader's own paths); ``flags_report``
is flags.md, for the instructor only (every flag of every submission, what happened).
"""

from __future__ import annotations

from course_grading.recheck import capped

# The words of the feedback that are not the checks' (the checks speak the language of
# TRANSFORMER_COURSE_LANG; so does this frame around them).
WORDS = {
    "en": {
        "title": "Feedback for {student} ({assignment})",
        "total": "Total",
        "otter_failed": "**{status}**: no question of this notebook could be graded by "
        "otter; every question scores 0.",
        "raised": "Cells that raised while running your notebook (code cells counted "
        "from 1, top to bottom):",
        "missing": "Expected function missing: {missing}.",
        "otter_lower": "Your notebook's own run did not pass this question (what it "
        "printed is below), so it scores {score:g}:",
    },
    "zh": {
        "title": "{student} 的反馈（{assignment}）",
        "total": "总分",
        "otter_failed": "**{status}**：otter 无法为这个笔记本的任何一题评分；每题都记 0 分。",
        "raised": "运行你的笔记本时出错的单元格（代码单元格从上到下、从 1 开始数）：",
        "missing": "缺少要求的函数：{missing}。",
        "otter_lower": "你的笔记本自己运行时没有通过这一题（输出见下），"
        "所以这一题得 {score:g} 分：",
    },
}


def _words() -> dict[str, str]:
    import os

    lang = os.environ.get("TRANSFORMER_COURSE_LANG", "en").split("_")[0].lower()
    return WORDS.get(lang, WORDS["en"])


def flags(result: dict, spec: dict) -> list[str]:
    """Why the instructor should look at this submission (empty for an ordinary one)."""
    notes = []
    rechecked = result["recheck"]
    if result["status"] != "ok":
        status = result["status"]
        if status.startswith("time limit"):  # which question looped, and the others
            looped = [
                q["name"]
                for q in spec["questions"]
                if rechecked.get(q["name"], {}).get("looped")
            ]
            passed = [
                q["name"]
                for q in spec["questions"]
                if float(rechecked.get(q["name"], {}).get("score", 0))
                >= float(q["points"])
            ]
            setup_msg = rechecked.get("_setup", {}).get("message", "")
            status += (
                f"; in the re-check {', '.join(looped)} looped (no answer within the "
                "call time limit)"
                if looped
                else (
                    f"; in the re-check {setup_msg}"
                    if "time limit" in setup_msg
                    else ""
                )
            )
            if passed:
                status += f"; the re-check passed {', '.join(passed)}"
        notes.append(status)
    setup = rechecked.get("_setup", {})
    if setup.get("message") and not (
        result["status"].startswith("time limit") and "time limit" in setup["message"]
    ):
        notes.append(capped(setup["message"], 300))
    for err in setup.get("errors", []):
        if err.get("denied"):
            notes.append(
                f"blocked by the sandbox or a limit: code cell {err['cell']}: "
                f"{err['type']}: {err['message']}"[:300]
            )
    attempts = setup.get("attempts", [])
    if attempts:
        notes.append(
            f"tried {len(attempts)} thing(s) the sandbox refuses (whether or not its "
            "code caught the error): " + "; ".join(attempts[:8])
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
    echoes = setup.get("echoes", [])
    if echoes:
        notes.append(
            "messages that may carry what its code read (files, paths): "
            + "; ".join(echoes[:5])
            + " (the feedback holds them cut to 300 characters, paths as <path>)"
        )
    for q in spec["questions"]:
        name = q["name"]
        otter = result["otter"].get(name, 0.0)
        re = float(rechecked.get(name, {}).get("score", 0.0))
        if otter > re:
            notes.append(
                f"{name}: otter gave {otter:g} but the isolated re-check {re:g}"
            )
        elif re > otter and result["status"] == "ok":
            notes.append(
                f"{name}: the isolated re-check gave {re:g} but otter's run {otter:g} "
                "(the recorded score is the lower)"
            )
        missing = rechecked.get(name, {}).get("missing")
        if missing:
            notes.append(f"{name}: {missing}")
        library = rechecked.get(name, {}).get("library")
        if library:
            notes.append(f"{name}: {library} (scored 0)")
    return (
        notes  # graded without a sandbox: the "sandbox" column and warnings.txt say so
    )


def feedback(result: dict, spec: dict) -> str:
    """feedback/<student>.md: the scores and the checks' messages. Everything that came
    from the learner's code is capped and its paths replaced (``recheck.capped``)."""
    w = _words()
    lines = [
        "# "
        + w["title"].format(student=result["student"], assignment=result["assignment"]),
        "",
    ]
    total = sum(result["scores"].values())
    possible = sum(float(q["points"]) for q in spec["questions"])
    lines += [f"{w['total']}: {total:g} / {possible:g}", ""]
    if result["status"] != "ok":
        lines += [w["otter_failed"].format(status=capped(result["status"], 200)), ""]
    errors = result["recheck"].get("_setup", {}).get("errors", [])
    if errors:
        lines += [w["raised"], ""]
        lines += [
            f"- code cell {e['cell']}: {capped(e['type'], 60)}: "
            + capped(e["message"]).replace("\n", " / ")
            for e in errors[:20]
        ]
        lines += [""]
    for q in spec["questions"]:
        name = q["name"]
        title = q.get("title")
        heading = f"{title} ({q['label']})" if title else q["label"]
        score = result["scores"][name]
        lines += [f"## {heading}: {score:g} / {float(q['points']):g}", ""]
        rechecked = result["recheck"].get(name, {})
        if rechecked.get("missing"):
            lines += [w["missing"].format(missing=capped(rechecked["missing"])), ""]
        otter_out = [
            o.strip() for o in result["otter_tests"].get(name, []) if o.strip()
        ]
        passed_here = float(rechecked.get("score", 0.0)) > score
        if rechecked.get("message") and not (passed_here and otter_out):
            lines += ["```", capped(rechecked["message"], 1500), "```", ""]
        elif otter_out:
            if passed_here:
                lines += [w["otter_lower"].format(score=score), ""]
            for out in otter_out:
                lines += ["otter:", "```", capped(out, 1500), "```", ""]
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
