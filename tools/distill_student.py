"""Train chapter 9's best distillation recipe for longer than a chapter can, and ship it.

The chapter compares four students at equal (short) training time and then measures
the student this script wrote: the same recipe (teacher layers 1 and 6 copied, pooled
cosine + token-state MSE, ``transformer_course.student.train_student``), given more
lines and more time. The weights (float16, the 2 Transformer layers only) and the
training record (arguments, steps, machine, and the fidelity curve on the chapter's
held-out lines, logged only: no checkpoint is picked by it) go into one safetensors
file, by default the one ``student.load_student`` reads.

    .venv/bin/python tools/distill_student.py --bf16 --threads 1  # as shipped (45 min)
    .venv/bin/python tools/distill_student.py --seconds 60 --out /tmp/student.safetensors

The held-out lines are the chapter's: whole works held out by ``data.split_works``,
and 100 of their lines drawn with ``random.Random(0)`` (the chapter's first draw).
"""

from __future__ import annotations

import argparse
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from transformer_course import set_cpu_threads
from transformer_course.data import load_shakespeare, split_works
from transformer_course.distill import (
    neighbour_agreement,
    spearman_fidelity,
)
from transformer_course.pretrained import load_minilm_encoder, tokenize_batch
from transformer_course.prune import sentence_embeddings
from transformer_course.student import (
    STUDENT_FILE,
    make_student,
    save_student,
    teacher_targets,
    train_student,
)


def _commit() -> str | None:
    """The repository's commit (None outside a git checkout)."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() or None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2700.0, help="training budget")
    parser.add_argument("--lines", type=int, default=0, help="training lines (0: all)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--init-from", default="0,5", help="teacher layers to copy")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    parser.add_argument(
        "--attention", action="store_true", help="add MiniLM's attention losses"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--report-every", type=float, default=120.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(STUDENT_FILE))
    args = parser.parse_args(argv)

    threads = set_cpu_threads(args.threads)
    device = torch.device(args.device)
    train_pool, held_pool, held_titles = split_works(load_shakespeare())
    held_lines = random.Random(0).sample(held_pool, 100)  # the chapter's yardstick
    lines = train_pool
    if args.lines:
        lines = random.Random(1).sample(train_pool, min(args.lines, len(train_pool)))
    teacher = load_minilm_encoder(device)
    held_ids, held_mask, _ = tokenize_batch(held_lines)
    held_ids, held_mask = held_ids.to(device), held_mask.to(device)

    def embed(model):
        with torch.no_grad():
            return sentence_embeddings(model, held_ids, held_mask).float().cpu()

    ref = embed(teacher)
    dtype = torch.bfloat16 if args.bf16 else None
    start = time.perf_counter()
    batches = teacher_targets(
        teacher,
        lines,
        batch_size=args.batch_size,
        with_attention=args.attention,
        autocast_dtype=dtype,
    )
    print(
        f"{len(lines):,} lines, {len(batches)} batches of targets in "
        f"{time.perf_counter() - start:.0f} s",
        flush=True,
    )
    init_from = tuple(int(i) for i in args.init_from.split(","))
    student = make_student(teacher, init_from=init_from)
    curve = []

    def report(elapsed, steps):
        rho = spearman_fidelity(embed(student), ref)
        curve.append([round(elapsed, 1), steps, round(rho, 4)])
        print(f"{elapsed:7.0f} s  {steps:6d} steps  Spearman {rho:.3f}", flush=True)

    steps = train_student(
        student,
        batches,
        args.seconds,
        lr=args.lr,
        with_attention=args.attention,
        autocast_dtype=dtype,
        report_every=args.report_every,
        report=report,
    )
    emb = embed(student)
    rho, nn_agree = spearman_fidelity(emb, ref), neighbour_agreement(emb, ref)
    curve.append([args.seconds, steps, round(rho, 4)])
    record = {
        "recipe": f"teacher layers {', '.join(str(i + 1) for i in init_from)}; pooled "
        "cosine + token-state MSE" + (" + attention" if args.attention else ""),
        "init_from": list(init_from),
        "seconds": args.seconds,
        "steps": steps,
        "lines": len(lines),
        "batch_size": args.batch_size,
        "lr": args.lr,
        "warmup": 0.1,
        "autocast": "bfloat16" if args.bf16 else None,
        "clock": "process CPU time" if device.type == "cpu" else "wall clock",
        "threads": threads.threads,
        "device": str(device),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "held_out_works": held_titles,
        "spearman": round(rho, 4),
        "neighbours": round(nn_agree, 4),
        "curve": curve,
        "commit": _commit(),
        "command": "python tools/distill_student.py " + " ".join(argv or sys.argv[1:]),
    }
    save_student(student, args.out, record)
    print(
        f"final: Spearman {rho:.3f}, neighbours {nn_agree:.0%} after {steps} steps; "
        f"wrote {args.out}"
    )
    return record


if __name__ == "__main__":
    main()
