"""tools/gpu_decode.py (the decoding and serving step of tools/gpu_run.sh): its smoke run
on the CPU measures both sides and passes every serving check; a failing check exits 1."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_decode.py"

pytest.importorskip("transformers")


def load():
    spec = importlib.util.spec_from_file_location("gpu_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_measures_both_sides_and_passes(tmp_path):
    out = tmp_path / "decode.json"
    assert load().main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["failed"] == []
    rows = result["decoding"]["rows"]
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    for r in rows:
        assert r["library tokens/s"] > 0 and r["transformers tokens/s"] > 0
    # the same weights on both sides: float32 logits agree
    assert result["decoding"]["float32 logits max abs diff (64-token prompt)"] < 1e-4
    assert result["serving"]["serve == generate"] is True


def test_a_failing_serving_check_exits_1(tmp_path, monkeypatch):
    module = load()
    monkeypatch.setattr(module, "bench_decoding", lambda *a, **k: {"rows": []})
    wrong = {
        "paged == contiguous (<= 1e-4)": True,
        "serve == generate": False,  # the known-wrong result
        "speculative greedy == greedy": True,
        "quantized (all sinks) == float": True,
    }
    monkeypatch.setattr(module, "check_serving", lambda *a, **k: dict(wrong))
    out = tmp_path / "decode.json"
    assert module.main(["--smoke", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["failed"] == ["serve == generate"]
