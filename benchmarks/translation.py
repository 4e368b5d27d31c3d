"""Chapter 6's translator, measured: training budget, accuracy, decoding speed.

    python benchmarks/translation.py                 # the chapter's setup (minutes)
    python benchmarks/translation.py --steps 50 --smoke   # seconds; checks it runs

Trains the chapter's model (English number words -> German, 2 + 2 layers,
d_model 128, 4 heads, pre-LN, word-level English, 80-token German BPE, numbers split
80/10/10 by value with the basic numbers kept in training) for ``--steps`` optimisation
steps (time guard ``--max-seconds``) from each of ``--seeds`` seeds (default 3; the
goal holds for the mean) and writes the key "translation" of ``results.json`` and the
section "## Translation" of ``results.md`` (keeping the rest, which
``benchmarks/run.py`` writes), and
``results-translation.json`` and ``results-translation.md`` (into ``--out``, default
this folder) with:

- for every seed: held-out exact match on all test numbers, its errors, steps and
  seconds; the mean, standard deviation, min and max over seeds;
- for seed 0: steps, wall-clock and CPU seconds of training (numbers below 1,000
  repeated ten times, basic numbers twenty more, as in the chapter), and validation
  exact match
  every 100 steps;
- held-out test exact match, chrF and character BLEU (sacrebleu) for greedy decoding on
  all test numbers, and greedy vs beam search (K = 4, alpha = 0.6) on every tenth;
- greedy decoding time with and without the KV cache (identical outputs checked).

Numbers depend on the machine (and on other load on it); nothing here is a test.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import sacrebleu
import torch

from transformer_course.data import batches, pad_batch
from transformer_course.decoding import beam_search, greedy_decode
from transformer_course.device import get_device, set_seed
from transformer_course.model import (
    TransformerConfig,
    make_model,
    set_attention_backend,
)
from transformer_course.training import (
    fit,
    make_criterion,
    noam_scheduler,
    translation_loss,
)
from transformer_course.translation_data import make_translation_data, training_stream

HERE = Path(__file__).resolve().parent


def train_one(data, cfg, seed, args, device, exact, valid):
    """Train the chapter's model from seed ``seed``; returns (model, History, CPU s)."""
    set_seed(seed)
    model = make_model(cfg).to(device)
    train_src, train_tgt = training_stream(data)  # the chapter's stream
    opt = torch.optim.AdamW(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0
    )
    gen = torch.Generator().manual_seed(seed)
    cpu0 = time.process_time()
    hist = fit(
        model,
        lambda: batches(train_src, train_tgt, args.batch, generator=gen, device=device),
        functools.partial(translation_loss, criterion=make_criterion(0.1)),
        opt,
        scheduler=noam_scheduler(opt, cfg.d_model, warmup=200),
        max_steps=args.steps,
        max_seconds=args.max_seconds or None,  # 0: no time guard
        clip_norm=1.0,
        eval_fn=lambda: exact(model, *valid)[0],
        eval_every=100,
        progress=False,
    )
    return model, hist, time.process_time() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="time guard (0: none)"
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (CI: 2)")
    parser.add_argument("--smoke", action="store_true", help="small eval sets")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = get_device()

    start = time.perf_counter()
    data = make_translation_data(100_000, tgt_vocab_size=80)
    data_s = time.perf_counter() - start
    cfg = TransformerConfig(
        src_vocab_size=data.src_tok.vocab_size,
        tgt_vocab_size=data.tgt_tok.vocab_size,
        d_model=128,
        n_heads=4,
        d_ff=512,
        n_layers=2,
        dropout=0.1,
        norm_first=True,
        max_len=32,
        backend="sdpa",
    )
    every = 50 if args.smoke else 20  # validation numbers spread over the range
    valid = (
        pad_batch(data.src_ids["valid"][::every], device=device),
        data.tgt_texts["valid"][::every],
    )

    def exact(model, src, refs, decode=greedy_decode, **kw):
        outs = [data.tgt_tok.decode(o) for o in decode(model, src, 24, **kw)]
        return sum(o == r for o, r in zip(outs, refs)) / len(refs), outs

    n_test = 1000 if args.smoke else len(data.src_ids["test"])
    test_src = pad_batch(data.src_ids["test"][:n_test], device=device)
    test_ref = data.tgt_texts["test"][:n_test]
    seeds = []
    for seed in range(args.seeds):
        model, hist, train_cpu = train_one(data, cfg, seed, args, device, exact, valid)
        model.eval()
        start = time.perf_counter()
        acc, out = exact(model, test_src, test_ref)
        wrong = [
            (n, o, r) for n, o, r in zip(data.numbers["test"], out, test_ref) if o != r
        ]
        seeds.append(
            {
                "seed": seed,
                "steps": hist.steps,
                "train_seconds": round(hist.seconds, 1),
                "process_cpu_seconds": round(train_cpu, 1),
                "final_loss": round(hist.loss[-1], 4),
                "valid_exact_match": [(s, round(v, 4)) for s, v in hist.evals],
                "test_exact_match": round(acc, 5),
                "greedy_seconds": round(time.perf_counter() - start, 2),
                "errors": len(wrong),
                "first_errors": wrong[:10],
            }
        )
        print(
            f"seed {seed}: {hist.steps} steps in {hist.seconds:.0f} s, "
            f"test exact match {acc:.2%} ({len(wrong)} wrong)",
            flush=True,
        )
        if seed == 0:
            model0, hist0, cpu0, greedy_acc, greedy_out = (
                model,
                hist,
                train_cpu,
                acc,
                out,
            )
            greedy_s = seeds[0]["greedy_seconds"]
    model = set_attention_backend(model0, "naive").eval()
    accs = [r["test_exact_match"] for r in seeds]
    summary = {
        "exact_match_mean": round(statistics.fmean(accs), 5),
        "exact_match_std": round(statistics.pstdev(accs), 5),
        "exact_match_min": min(accs),
        "exact_match_max": max(accs),
        "exact_match_per_seed": accs,
        "seeds": len(seeds),
        "steps": [r["steps"] for r in seeds],
        "train_seconds_mean": round(
            statistics.fmean(r["train_seconds"] for r in seeds), 1
        ),
        "train_process_cpu_seconds_mean": round(
            statistics.fmean(r["process_cpu_seconds"] for r in seeds), 1
        ),
        "test_numbers": n_test,
        "torch_threads": args.threads,
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
    }

    step = max(1, n_test // 1000)  # about 1,000 test numbers spread over the range
    sub = len(test_ref[::step])
    start = time.perf_counter()
    beam_acc, _ = exact(
        model,
        test_src[::step],
        test_ref[::step],
        decode=beam_search,
        beam_size=4,
        length_penalty=0.6,
    )
    beam_s = time.perf_counter() - start
    sub_greedy = sum(o == r for o, r in zip(greedy_out[::step], test_ref[::step])) / sub

    timing = {}
    outs = {}
    for use_cache in (True, False):
        start = time.perf_counter()
        outs[use_cache] = greedy_decode(
            model, test_src[::step], 24, use_cache=use_cache
        )
        timing[use_cache] = time.perf_counter() - start

    results = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "device": str(device),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "data_seconds": round(data_s, 1),
        "translation": summary,
        "per_seed": seeds,
        "train": {
            "seed": 0,
            "steps": hist0.steps,
            "batch": args.batch,
            "seconds": round(hist0.seconds, 1),
            "process_cpu_seconds": round(cpu0, 1),
            "final_loss": round(hist0.loss[-1], 4),
            "valid_exact_match": [(s, round(v, 4)) for s, v in hist0.evals],
        },
        "test": {
            "numbers": n_test,
            "greedy_exact_match": round(greedy_acc, 4),
            "greedy_seconds": round(greedy_s, 2),
            "chrf": round(sacrebleu.corpus_chrf(greedy_out, [test_ref]).score, 2),
            "char_bleu": round(
                sacrebleu.corpus_bleu(greedy_out, [test_ref], tokenize="char").score, 2
            ),
            "greedy_exact_match_subset": round(sub_greedy, 4),
            "beam4_exact_match_subset": round(beam_acc, 4),
            "beam4_seconds": round(beam_s, 2),
        },
        "kv_cache": {
            "numbers": sub,
            "greedy_seconds_cached": round(timing[True], 3),
            "greedy_seconds_uncached": round(timing[False], 3),
            "speedup": round(timing[False] / timing[True], 2),
            "identical_outputs": outs[True] == outs[False],
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-translation.json").write_text(json.dumps(results, indent=2))
    t, e, k = results["train"], results["test"], results["kv_cache"]
    by_step = ", ".join(f"{s}: {v:.1%}" for s, v in t["valid_exact_match"])
    md = [
        "# Chapter 6 translator: measured",
        "",
        (
            f"Machine: {results['machine']['platform']}, {results['machine']['device']}, "
            f"{results['machine']['torch_threads']} torch threads, torch {torch.__version__}."
        ),
        "",
        (
            "Process CPU seconds count this process only; wall-clock seconds also include "
            "waiting for other load on a shared machine."
        ),
        "",
        "| quantity | value |",
        "|---|---|",
        f"| training steps (batch {t['batch']}) | {t['steps']} |",
        f"| training wall-clock seconds | {t['seconds']} |",
        f"| training process CPU seconds | {t['process_cpu_seconds']} |",
        f"| validation exact match by step | {by_step} |",
        (
            f"| test exact match, greedy ({e['numbers']:,} numbers) "
            f"| {e['greedy_exact_match']:.2%} |"
        ),
        f"| test chrF / character BLEU, greedy | {e['chrf']} / {e['char_bleu']} |",
        (
            f"| every {step}th test number ({sub:,}): greedy / beam 4 exact match "
            f"| {e['greedy_exact_match_subset']:.2%} / {e['beam4_exact_match_subset']:.2%} |"
        ),
        (
            f"| greedy with / without KV cache ({sub:,} numbers) "
            f"| {k['greedy_seconds_cached']} s / {k['greedy_seconds_uncached']} s "
            f"({k['speedup']}x), identical: {k['identical_outputs']} |"
        ),
        "",
    ]
    section = translation_section(summary, seeds)
    md[1:1] = ["", *section]
    (args.out / "results-translation.md").write_text("\n".join(md))
    print("\n".join(md))
    if not args.smoke:  # the shared results file holds full runs only
        update_shared_results(args.out, summary, section)


def translation_section(summary, seeds) -> list[str]:
    """The "## Translation" section of results.md: the mean and spread over seeds."""
    per_seed = ", ".join(
        f"seed {r['seed']}: {r['test_exact_match']:.2%} ({r['errors']} wrong, "
        f"{r['steps']} steps in {r['train_seconds']} s)"
        for r in seeds
    )
    s = summary
    return [
        "## Translation (benchmarks/translation.py)",
        "",
        (
            f"Chapter 6's translator trained from {s['seeds']} seeds (the same data "
            f"split), {s['torch_threads']} torch threads; 1-minute load average at "
            f"the end {s['load_average_1min_at_end']}. Greedy exact match on all "
            f"{s['test_numbers']:,} test numbers (goal: mean >= 99.9% within 120 s "
            "of training)."
        ),
        "",
        "| quantity | value |",
        "|---|---|",
        f"| exact_match_mean | {s['exact_match_mean']:.2%} |",
        (
            f"| exact_match_std (min / max) | {s['exact_match_std']:.2%} "
            f"({s['exact_match_min']:.2%} / {s['exact_match_max']:.2%}) |"
        ),
        f"| per seed | {per_seed} |",
        f"| train_seconds_mean | {s['train_seconds_mean']} |",
        (
            "| train_process_cpu_seconds_mean (this process only) "
            f"| {s['train_process_cpu_seconds_mean']} |"
        ),
        "",
    ]


def update_shared_results(folder: Path, summary: dict, section: list[str]) -> None:
    """Add or replace the "translation" key of results.json and the translation
    section of results.md, keeping everything else (benchmarks/run.py writes it)."""
    path = folder / "results.json"
    shared = json.loads(path.read_text()) if path.exists() else {}
    shared["translation"] = summary
    path.write_text(json.dumps(shared, indent=2) + "\n")
    path = folder / "results.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = "\n".join(section)
    pattern = re.compile(
        r"^## Translation \(benchmarks/translation\.py\).*?(?=^## |\Z)",
        re.DOTALL | re.MULTILINE,
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: block + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
    if "attention" in shared:  # benchmarks/run.py's report: redo its Goals table
        import run  # benchmarks/run.py, beside this script

        shared["goals"] = run.goals(shared)
        (folder / "results.json").write_text(json.dumps(shared, indent=2) + "\n")
        run.write_markdown(shared, path)


if __name__ == "__main__":
    main()
