"""Chapter 9: training a student (split, schedule, loss, loop, saving) and the shipped
student of tools/distill_student.py, each check with an input it must reject."""

from __future__ import annotations

import pytest

from transformer_course.student import (
    load_student,
)


def test_distill_student_script_writes_a_loadable_student(tmp_path):
    import distill_student  # tools/ is on pytest's pythonpath

    out = tmp_path / "student.safetensors"
    record = distill_student.main(
        [
            "--seconds",
            "2",
            "--lines",
            "64",
            "--report-every",
            "1",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert record["lines"] == 64 and record["steps"] > 0 and record["threads"] == 1
    assert [row[0] for row in record["curve"][:-1]] == pytest.approx([1.0], abs=0.5)
    from transformer_course.pretrained import load_minilm_encoder

    student, saved = load_student(load_minilm_encoder(), out)
    assert saved["spearman"] == record["spearman"] and len(student.layers) == 2
