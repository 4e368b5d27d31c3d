"""The benchmark script's smoke run: every measurement runs and is written (chapter 7).
Speed is never asserted; only that the reports exist and hold the ratios."""

import importlib.util
import json
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_reports(bench, tmp_path):
    # another script's results (benchmarks/translation.py) must survive a rewrite
    translation = {
        "exact_match_mean": 0.9995,
        "seeds": 3,
        "train_seconds_mean": 95.0,
        "torch_threads": 2,
    }
    (tmp_path / "results.json").write_text(json.dumps({"translation": translation}))
    (tmp_path / "results.md").write_text(
        "# old\n\n## Machine\n\nold\n\n## Translation: seeds\n\nkept row\n"
    )
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["smoke"] and results["machine"]["torch"]
    assert results["translation"] == translation
    for row in results["attention"]:
        assert row["T"] > 0
        for key in ("tiled/naive memory", "tiled/sdpa time", "naive/sdpa time"):
            assert row[key] > 0
    assert {r["pass"] for r in results["mha"]} == {"forward", "forward+backward"}
    for row in results["mha"]:
        assert row["mha/torch time"] > 0 and row["max_abs_diff"] < 1e-5
    assert all(r["tiled/sdpa time"] > 0 for r in results["tile_sweep"])
    parts = results["profile"]["parts"]
    assert abs(sum(p["share of tiled"] for p in parts) - 1) < 1e-6
    for row in results["kv_cache"]:
        assert row["same_tokens"] and row["max_logit_diff"] < 1e-4
        assert row["cached/uncached time"] > 0
    assert [r["n_kv_heads"] for r in results["kv_bytes"]] == [4, 2, 1]
    llm = results["llm"]
    assert llm["same_tokens"] and len(llm["rows"]) >= 1
    for row in llm["rows"]:
        assert row["library/transformers time"] > 0 and row["uncached/cached time"] > 0
    int8 = results["int8"]
    assert 0.2 < int8["int8 by hand"]["size/float32"] < 0.6
    assert "torchao int8 weight-only" in int8 or "torchao error" in int8
    text = (tmp_path / "results.md").read_text()
    for heading in (
        "## Machine",
        "## KV cache",
        "## Int8",
        "tiled/naive memory",
        "## A real LLM",
    ):
        assert heading in text
    assert "## Translation: seeds\n\nkept row" in text and "\nold\n" not in text
    goals = text[text.index("## Goals") :]
    assert goals.count("\n## ") == 0 and "| measure | now | goal | met? |" in goals
    assert "chapter 6 held-out exact match, mean over 3 seeds" in goals


def test_translation_goal_needs_the_mean_and_the_time(bench):
    """The Goals row for chapter 6 is met only with both the mean exact match and
    the training time within the goal (99.9%, 120 s)."""
    base = {"seeds": 3, "torch_threads": 2}

    def met(mean, seconds):
        results = {
            "attention": [
                {
                    "T": 1024,
                    "tiled/sdpa time": 1.5,
                    "tiled/sdpa time, all cores": 1.5,
                    "all-core threads": 2,
                    "tiled/naive memory": 0.01,
                },
            ],
            "mha": [],
            "translation": {
                **base,
                "exact_match_mean": mean,
                "train_seconds_mean": seconds,
            },
        }
        row = [g for g in bench.goals(results) if "chapter 6" in g["measure"]]
        return row[0]["met?"]

    assert met(0.9995, 95.0)
    assert not met(0.9985, 95.0)  # the mean misses 99.9%
    assert not met(0.9995, 130.0)  # over the training budget


def test_table_shows_every_column(bench):
    text = bench.table([{"a": 1}, {"a": 2.0, "b": None}])
    assert text.splitlines()[0] == "| a | b |"
    assert text.splitlines()[2:] == ["| 1 | n/a |", "| 2 | n/a |"]


def test_only_llm_runs_the_llm_benchmark_alone(bench, tmp_path):
    assert bench.main(["--only", "llm", "--smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results-llm.json").read_text())
    assert result["llm"]["same_tokens"]
    assert {r["torch threads"] for r in result["llm"]["rows"]} == set(bench.LLM_THREADS)
    assert "library/transformers time" in (tmp_path / "results-llm.md").read_text()
    assert not (tmp_path / "results.json").exists()  # nothing else ran
