"""tools/gpu_check.py (`make gpu-check`): without a GPU it says so and exits 0; its steps
run (tiny, on the CPU) and its checks reject a wrong attention backend."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def run(*args, **env):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=600,
    )


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "gpu-results.md"
    result = run("--out", str(out), CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU" in result.stdout
    assert not out.exists()


def test_every_step_runs_on_the_cpu_and_writes_the_report(tmp_path):
    out = tmp_path / "gpu-results.md"
    result = run("--cpu-smoke", "--out", str(out), CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = out.read_text()
    for title in (
        "Device selection",
        "Training the library's DecoderOnlyLM",
        "Triton FlashAttention",
        "Running out of memory",
        "0 failed check(s)",
    ):
        assert title in text
    if (
        importlib.util.find_spec("triton") is not None
    ):  # every dtype the kernel promises
        for dtype in ("float32", "float16", "bfloat16"):
            for case in ("plain", "causal", "padding mask"):
                assert f"- ok: {dtype} {case}:" in text, (dtype, case)


def test_a_wrong_backend_is_reported(monkeypatch):
    from transformer_course import attention

    def unscaled(q, k, v, mask=None, **kw):  # pitfall P12: no 1/sqrt(d_k)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, -1).nan_to_num(0.0) @ v, None

    monkeypatch.setitem(attention.ATTENTION_BACKENDS, "unscaled", unscaled)
    module = load()
    report = module.Report()
    module.check_device(report, torch.device("cpu"))
    assert any(f.startswith("unscaled") for f in report.failures), report.failures
    assert not any(f.startswith(("naive", "sdpa")) for f in report.failures)


def test_out_of_memory_is_caught_and_the_longest_length_reported():
    module = load()

    def runs_out_above_128(q, k, v):
        if q.shape[-2] > 128:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return module.naive_attention(q, k, v)

    report = module.Report()
    module.check_out_of_memory(
        report,
        torch.device("cpu"),
        start=32,
        limit=4096,
        heads=1,
        attend=runs_out_above_128,
    )
    text = "\n".join(report.lines)
    assert "longest length that ran: 128; OutOfMemoryError at T = 256" in text
    assert not report.failures


def test_a_length_that_never_runs_is_a_failure():
    module = load()

    def always_out(q, k, v):
        raise torch.cuda.OutOfMemoryError("simulated")

    report = module.Report()
    module.check_out_of_memory(
        report, torch.device("cpu"), start=32, limit=64, heads=1, attend=always_out
    )
    assert report.failures
