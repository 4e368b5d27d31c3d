"""Chapter 7's measurements at larger sizes, side by side in one run.

    python benchmarks/run.py            # full run (minutes on a laptop CPU)
    python benchmarks/run.py --smoke    # tiny sizes, seconds; what the tests run
    python benchmarks/run.py --only flash-backward   # that section alone, merged in
    python benchmarks/run.py --only llm # chapter 10's real LLM alone (llm_bench.py)
    python benchmarks/run.py --only serving  # chapter 11 alone (serving_bench.py)

Writes ``results.json`` and ``results.md`` (into ``--out``, default this folder) with
the machine it ran on and these ratios:

- attention: peak extra memory of tiled / naive and SDPA / naive, time of tiled / SDPA
  and naive / SDPA, for growing sequence length T up to 8192; a sweep of tile sizes
  (the fastest is used for the table); a torch.profiler breakdown of the tiled time;
- the course's ``MultiHeadAttention`` (backend "sdpa") against
  ``torch.nn.MultiheadAttention`` with the same weights, forward and forward+backward;
- a "Goals" table (issue 14) at the end; an existing "translation" entry of
  results.json and "## Translation..." sections of results.md (written by
  ``benchmarks/translation.py``), and likewise ``live_views.py``'s "live_views" entry
  and "## Live views..." section, are kept;
- sliding-window (banded) time
  against T; PyTorch's SDPA backends and ``torch.compile``; on a GPU, the Triton
  kernel's TFLOP/s against SDPA's;
- a character-level Shakespeare language model: generation with / without the KV
  cache (time, identical tokens), KV cache bytes per token for multi-head,
  grouped-query and multi-query attention;
- int8: model size, CPU time and validation loss, by hand and with torchao, each
  against float32;
- flash-backward (issue 29): training through tiled attention, forward + backward:
  peak extra memory tiled / naive at T = 8192 and time tiled / SDPA for T = 1024 to
  8192 on one thread (with a torch.profiler breakdown where it misses 3x).
- chapter 10's real LLM (``llm_bench.py``): the library's cached greedy decoding
  of SmolLM2-135M-Instruct against ``transformers``' ``generate`` on the same weights,
  and cached against uncached decoding at 256 new tokens, on one thread and all cores.
  ``--only llm`` (and ``--only kv-cache``) run that section alone and merge it into
  the full report, or write ``results-llm.json`` where ``--out`` has none.
- chapter 11's serving (``serving_bench.py``, ``--only serving``): paged against
  preallocated cache memory, the prefix-caching speed-up, the quantized cache's bytes
  per token, and speculative decoding against plain and transformers' ``generate``.

Numbers depend on the machine; the ratios are what to compare. Nothing here is a test
of speed: the smoke run only checks that every measurement runs and is written.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer_course.decoding import generate
from transformer_course.kv_cache import ConcatKVCache, KVCache
from transformer_course.measure import best_time, record_forward, state_dict_bytes
from transformer_course.quantize import quantize_linear_weights_, torchao_int8
from transformer_course.training import (
    evaluating,
    lm_loss,
    next_token_windows,
    train_lm,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/llm_bench.py, a sibling module
import llm_bench
import serving_bench


def machine(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# Attention timings run on one thread and, alongside, on all cores. With several
# threads every operator ends at an OpenMP barrier, which costs the tiled loop's many
# small operators far more than SDPA's single fused call (the profile measures it);
# on a machine shared with other work the all-cores column also depends on the load.
TIMING_THREADS = 1
ALL_CORES = os.cpu_count() or 1
ATTN_SHAPE = (1, 2)  # (batch, heads): naive at T = 8192 holds 2 x 8192^2 float32
FLASH_BACKWARD_TIME_GOAL = 3.0  # tiled / SDPA, forward + backward, one thread
FLASH_BACKWARD_MEMORY_GOAL = 0.05  # tiled / naive, forward + backward, T = 8192
TILES = [
    (64, 64),
    (128, 128),
    (256, 256),
    (512, 512),
    (128, 256),
    (256, 128),
    (256, 512),
    (None, 128),
    (None, 256),
]  # (block_q, block_k); None = all T


@contextlib.contextmanager
def threads(n: int | None):
    """Run the block with ``n`` torch threads (None: leave as it is)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def side_by_side(fns: dict, device, repeat: int) -> dict:
    """Best time of each function, the repeats taken in turns (round robin) so that
    load from other processes falls on all of them alike."""
    best = {name: math.inf for name in fns}
    for r in range(repeat):
        for name, fn in fns.items():
            t = best_time(fn, device, 1, warmup=1 if r == 0 else 0)
            best[name] = min(best[name], t)
    return best


def attention_inputs(t, device, d_k=64):
    return tuple(torch.randn(*ATTN_SHAPE, t, d_k, device=device) for _ in range(3))


def bench_tile_sweep(t, device, tiles=TILES, repeat=3) -> list[dict]:
    """tiled/SDPA time for each (block_q, block_k), at one length T."""
    from transformer_course.flash import tiled_attention

    q, k, v = attention_inputs(t, device)
    fns = {"sdpa": partial(F.scaled_dot_product_attention, q, k, v)}
    for bq, bk in tiles:
        fns[bq, bk] = partial(tiled_attention, q, k, v, block_q=bq, block_k=bk)
    with threads(TIMING_THREADS):
        best = side_by_side(fns, device, repeat)
    rows = [
        {
            "T": t,
            "block_q": "all T" if bq is None else bq,
            "block_k": bk,
            "tiled_s": best[bq, bk],
            "tiled/sdpa time": best[bq, bk] / best["sdpa"],
        }
        for bq, bk in tiles
    ]
    print(
        "tile sweep:",
        [(r["block_q"], r["block_k"], round(r["tiled/sdpa time"], 2)) for r in rows],
    )
    return rows


def bench_attention(lengths, device, block_q, block_k, repeat=3) -> list[dict]:
    from transformer_course.attention import scaled_dot_product_attention
    from transformer_course.flash import tiled_attention
    from transformer_course.measure import peak_tensor_bytes

    rows = []
    for t in lengths:
        q, k, v = attention_inputs(t, device)
        fns = {
            "naive": partial(scaled_dot_product_attention, q, k, v),
            "tiled": partial(
                tiled_attention, q, k, v, block_q=block_q, block_k=block_k
            ),
            "sdpa": partial(F.scaled_dot_product_attention, q, k, v),
        }
        row = {"T": t}
        for name, fn in fns.items():
            row[f"{name}_bytes"] = peak_tensor_bytes(fn, device)
        # naive at the largest T takes seconds a call: one repeat there
        big = t >= 8192
        with threads(TIMING_THREADS):
            fast = {n: f for n, f in fns.items() if n != "naive" or not big}
            row |= {f"{n}_s": s for n, s in side_by_side(fast, device, repeat).items()}
            if big:
                row["naive_s"] = best_time(fns["naive"], device, 1, warmup=0)
        row["tiled/naive memory"] = row["tiled_bytes"] / row["naive_bytes"]
        row["sdpa/naive memory"] = row["sdpa_bytes"] / row["naive_bytes"]
        row["tiled/sdpa time"] = row["tiled_s"] / row["sdpa_s"]
        row["naive/sdpa time"] = row["naive_s"] / row["sdpa_s"]
        pair = {name: fns[name] for name in ("tiled", "sdpa")}
        with threads(ALL_CORES) as n_all:  # one thread per core
            both = side_by_side(pair, device, max(1, repeat - 1))
        row["tiled/sdpa time, all cores"] = both["tiled"] / both["sdpa"]
        row["all-core threads"] = n_all
        rows.append(row)
        print(f"attention T={t}: " + ", ".join(f"{k}={v:.3g}" for k, v in row.items()))
    return rows


def profile_tiled(
    t, device, block_q, block_k, runs=3, n_threads=TIMING_THREADS, backward=False
) -> dict:
    """Where tiled attention's time goes: torch.profiler's self time of each aten
    operator, summed by kind, and the rest of the wall time (the Python loop, the
    dispatcher, the profiler's own bookkeeping). The run with the least wall time
    of ``runs`` is kept (other processes only ever add time). ``backward``: profile
    forward + backward, against SDPA's forward + backward."""
    from torch.profiler import ProfilerActivity, profile

    from transformer_course.flash import tiled_attention

    kinds = {
        "matmul (bmm, mm)": ("aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm"),
        "exp": ("aten::exp", "aten::exp_"),
        "reductions (amax, sum)": ("aten::amax", "aten::sum"),
        "elementwise (sub, mul, add, where, div, ...)": (
            "aten::sub",
            "aten::sub_",
            "aten::mul",
            "aten::mul_",
            "aten::add",
            "aten::add_",
            "aten::where",
            "aten::div",
            "aten::maximum",
            "aten::isfinite",
            "aten::masked_fill_",
            "aten::gt",
        ),
    }
    q, k, v = attention_inputs(t, device)
    fn = partial(tiled_attention, q, k, v, block_q=block_q, block_k=block_k)
    sdpa = partial(F.scaled_dot_product_attention, q, k, v)
    if backward:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        tiled = partial(tiled_attention, block_q=block_q, block_k=block_k)
        fn = partial(forward_backward, lambda *x: tiled(*x)[0], q, k, v)
        sdpa = partial(forward_backward, F.scaled_dot_product_attention, q, k, v)
    best = None
    with threads(n_threads) as n_used, torch.no_grad():
        sdpa_s = best_time(sdpa, device, 3)
        fn()
        for _ in range(runs):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                fn()
                wall = time.perf_counter() - start
            if best is None or wall < best[0]:
                best = (wall, prof.key_averages())
    wall, events = best
    other = "other aten operators (copies, views, allocation)"
    share = dict.fromkeys([*kinds, other], 0.0)
    calls = 0
    for ev in events:
        kind = next((n for n, ops in kinds.items() if ev.key in ops), None)
        share[kind or other] += ev.self_cpu_time_total / 1e6
        calls += ev.count
    in_ops = sum(share.values())
    share["outside operators (Python loop, dispatch, profiler)"] = wall - sum(
        share.values()
    )
    rows = [
        {"part": part, "s": s, "share of tiled": s / wall, "/ sdpa time": s / sdpa_s}
        for part, s in share.items()
    ]
    out = {
        "T": t,
        "block_q": block_q,
        "block_k": block_k,
        "wall_s_under_profiler": wall,
        "sdpa_s": sdpa_s,
        "threads": n_used,
        "operator_calls": calls,
        "ms_per_operator_call": 1e3 * in_ops / calls,
        "parts": rows,
    }
    print("profile:", out)
    return out


def forward_backward(fn, q, k, v):
    """One training step's attention: ``fn(q, k, v)`` and the gradients of its sum
    with respect to q, k and v (gradients enabled even under ``best_time``'s
    no_grad)."""
    with torch.enable_grad():
        return torch.autograd.grad(fn(q, k, v).sum(), (q, k, v))


def bench_flash_backward(lengths, device, memory_t=8192, repeat=3) -> dict:
    """Training through tiled attention (issue 29): peak extra memory of forward +
    backward, tiled / naive, at ``memory_t``; forward + backward time, tiled / SDPA,
    at each of ``lengths`` on one thread, side by side. The library's default tiles
    (256 x 256), which ``backend="tiled"`` trains with. If a length misses the time
    goal (3x), a torch.profiler breakdown of the worst one says where the time goes.
    """
    from transformer_course.attention import scaled_dot_product_attention
    from transformer_course.flash import tiled_attention
    from transformer_course.measure import peak_tensor_bytes

    fns = {
        "naive": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
        "tiled": lambda q, k, v: tiled_attention(q, k, v)[0],
        "sdpa": F.scaled_dot_product_attention,
    }

    def inputs(t):
        return tuple(x.requires_grad_() for x in attention_inputs(t, device))

    q, k, v = inputs(memory_t)
    memory = {
        "T": memory_t,
        **{
            f"{name}_bytes": peak_tensor_bytes(
                partial(forward_backward, fn, q, k, v), device
            )
            for name, fn in fns.items()
        },
    }
    memory["tiled/naive memory"] = memory["tiled_bytes"] / memory["naive_bytes"]
    memory["sdpa/naive memory"] = memory["sdpa_bytes"] / memory["naive_bytes"]
    print("flash-backward memory:", memory)
    rows = []
    for t in lengths:
        q, k, v = inputs(t)
        pair = {
            n: partial(forward_backward, fns[n], q, k, v) for n in ("tiled", "sdpa")
        }
        with threads(TIMING_THREADS) as n_used:
            best = side_by_side(pair, device, repeat)
        rows.append(
            {
                "T": t,
                "threads": n_used,
                "tiled_s": best["tiled"],
                "sdpa_s": best["sdpa"],
                "tiled/sdpa time": best["tiled"] / best["sdpa"],
            }
        )
        print("flash-backward time:", rows[-1])
    out = {"shape": ATTN_SHAPE, "memory": memory, "time": rows}
    worst = max(rows, key=lambda r: r["tiled/sdpa time"])
    if worst["tiled/sdpa time"] > FLASH_BACKWARD_TIME_GOAL:
        out["profile"] = profile_tiled(
            worst["T"], device, 256, 256, runs=1 if repeat == 1 else 2, backward=True
        )
    return out


def bench_mha(device, batch=8, t=256, d_model=256, n_heads=4, repeat=5) -> list[dict]:
    """The course's MultiHeadAttention (backend "sdpa") against
    torch.nn.MultiheadAttention holding the same weights, self-attention."""
    from torch import nn

    from transformer_course.interop import from_torch_mha

    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True).to(device)
    ours = from_torch_mha(theirs, backend="sdpa")
    x = torch.randn(batch, t, d_model, device=device)
    mods = {"own": ours, "torch": theirs}
    with torch.no_grad():
        outs = [m.eval()(x, x, x, need_weights=False)[0] for m in mods.values()]
    diff = (outs[0] - outs[1]).abs().max().item()

    def forward(m):
        return m(x, x, x, need_weights=False)[0]

    def forward_backward(m):
        with torch.enable_grad():
            m.zero_grad(set_to_none=True)
            forward(m).sum().backward()

    rows = []
    for n_threads in dict.fromkeys((TIMING_THREADS, ALL_CORES)):
        for name, step in (
            ("forward", forward),
            ("forward+backward", forward_backward),
        ):
            with threads(n_threads) as n:
                fns = {k: partial(step, m) for k, m in mods.items()}
                best = side_by_side(fns, device, repeat)
            rows.append(
                {
                    "pass": name,
                    "threads": n,
                    "own_s": best["own"],
                    "torch_s": best["torch"],
                    "mha/torch time": best["own"] / best["torch"],
                    "max_abs_diff": diff,
                }
            )
            print("mha:", rows[-1])
    return rows


def bench_sliding_window(lengths, window, device, repeat=3) -> list[dict]:
    from transformer_course.attention import scaled_dot_product_attention
    from transformer_course.local import sliding_window_attention
    from transformer_course.masks import sliding_window_mask

    rows = []
    for t in lengths:
        q, k, v = (torch.randn(1, 4, t, 64, device=device) for _ in range(3))
        mask = sliding_window_mask(t, window, device=device)
        banded = best_time(
            partial(sliding_window_attention, q, k, v, window), device, repeat
        )
        masked = best_time(
            partial(scaled_dot_product_attention, q, k, v, mask), device, repeat
        )
        rows.append(
            {
                "T": t,
                "window": window,
                "banded_s": banded,
                "masked_full_s": masked,
                "banded/masked time": banded / masked,
            }
        )
        print(f"sliding window T={t}: banded {banded:.4f} s, masked {masked:.4f} s")
    return rows


def bench_sdpa_backends(t, device, compile_too=True, repeat=3) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, 4, t, 64, device=device) for _ in range(3))
    out = {"T": t}
    for backend in (
        SDPBackend.MATH,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
    ):
        name = backend.name.lower()
        try:
            with sdpa_kernel(backend):
                out[f"sdpa_{name}_s"] = best_time(
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    device,
                    repeat,
                )
        except RuntimeError as err:  # e.g. no memory-efficient kernel on the CPU
            out[f"sdpa_{name}_s"] = None
            out[f"sdpa_{name}_error"] = str(err).split("\n")[0][:120]

    def plain(q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v

    out["eager_plain_s"] = best_time(lambda: plain(q, k, v), device, repeat)
    if compile_too:
        try:
            start = time.perf_counter()
            compiled = torch.compile(plain)
            compiled(q, k, v)
            out["compile_first_call_s"] = time.perf_counter() - start
            out["compiled_plain_s"] = best_time(
                lambda: compiled(q, k, v), device, repeat
            )
        except Exception as err:  # noqa: BLE001 (no C++ compiler, platform, ...)
            out["compile_error"] = f"{type(err).__name__}: {str(err)[:120]}"
    print("sdpa backends:", out)
    return out


def bench_triton(t, device, repeat=10) -> dict:
    if device.type != "cuda":
        return {
            "skipped": "no CUDA GPU: the Triton kernel is benchmarked on GPUs only "
            "(it is tested on the CPU under TRITON_INTERPRET=1)"
        }
    from transformer_course.triton_kernels import flash_attention

    q, k, v = (
        torch.randn(4, 8, t, 64, device=device, dtype=torch.float16) for _ in range(3)
    )
    flops = 4 * 4 * 8 * t * t * 64 / 2  # two matmuls, causal half
    tri = best_time(lambda: flash_attention(q, k, v, causal=True), device, repeat)
    ref = best_time(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, repeat
    )
    ours = flash_attention(q, k, v, causal=True).float()
    err = (ours - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max()
    out = {
        "T": t,
        "triton_s": tri,
        "sdpa_s": ref,
        "triton_tflops": flops / tri / 1e12,
        "sdpa_tflops": flops / ref / 1e12,
        "triton/sdpa time": tri / ref,
        "max_abs_diff": err.item(),
    }
    print("triton:", out)
    return out


# ------------------------------------------------------------- the language model


def shakespeare_lm(
    steps: int,
    d_model: int,
    n_layers: int,
    max_len: int,
    device,
    block: int = 64,
    batch: int = 16,
    seed: int = 0,
):
    """Train a small character-level LM on Shakespeare; returns (model, tokenizer,
    validation batch (x, y), final training loss)."""
    from transformer_course.data import CharTokenizer, load_shakespeare
    from transformer_course.model import DecoderOnlyLM, TransformerConfig

    torch.manual_seed(seed)
    texts = load_shakespeare()
    val_text = texts.pop("tempest")
    train_text = "\n".join(texts.values())
    tok = CharTokenizer([train_text, val_text])
    cfg = TransformerConfig(
        tgt_vocab_size=tok.vocab_size,
        d_model=d_model,
        n_heads=4,
        d_ff=4 * d_model,
        n_layers=n_layers,
        dropout=0.0,
        max_len=max_len,
        backend="sdpa",
    )
    model = DecoderOnlyLM(cfg).to(device)
    data = torch.tensor(tok.encode(train_text), device=device)
    val = torch.tensor(tok.encode(val_text[:20_000]), device=device)
    hist = train_lm(model, data, steps=steps, batch_size=batch, block=block, seed=seed)
    return model, tok, next_token_windows(val, block), hist.loss[-1]


def val_loss(model, x_val, y_val) -> float:
    with evaluating(model):
        return lm_loss(model, x_val, y_val).item()


def generate_with_logits(model, prompt, n_new, cache):
    """The library's greedy ``generate`` with ``cache`` (a cache class, or None to
    recompute the whole prefix every step); returns (ids, logits of every step)."""
    use_cache = cache is not None
    with record_forward(model) as steps:
        ids = generate(
            model, prompt, n_new, use_cache=use_cache, cache=cache or KVCache
        )
    return ids, torch.stack([logits for _, logits in steps], dim=1)


def _keep(out: dict, name: str, fn, *args):
    out[name] = fn(*args)


def bench_kv_cache(model, tok, lengths, device) -> list[dict]:
    """Generation time with the preallocated ``KVCache``, the copy-per-step
    ``ConcatKVCache`` and no cache, side by side at each length, on
    ``TIMING_THREADS`` threads; the three must generate the same tokens."""

    prompt = torch.tensor([tok.encode("ROMEO:\n")], device=device)
    kinds = {"preallocated": KVCache, "concat": ConcatKVCache, "none": None}
    rows = []
    with threads(TIMING_THREADS):
        for cache in kinds.values():
            generate_with_logits(model, prompt, 4, cache)  # warm-up
        for n in lengths:
            out, secs = {}, {}
            for name, cache in kinds.items():  # one timed call each (no warm-up)
                run = partial(
                    _keep, out, name, generate_with_logits, model, prompt, n, cache
                )
                secs[name] = best_time(run, device, 1, warmup=0)
            ids, logits = out["preallocated"]
            for name in ("concat", "none"):
                if not torch.equal(out[name][0], ids):
                    raise AssertionError(
                        f"{n} new tokens: the {name!r} cache generated other tokens "
                        "than the preallocated one"
                    )
            rows.append(
                {
                    "new_tokens": n,
                    "cached_s": secs["preallocated"],
                    "concat_cached_s": secs["concat"],
                    "uncached_s": secs["none"],
                    "cached/uncached time": secs["preallocated"] / secs["none"],
                    "concat/uncached time": secs["concat"] / secs["none"],
                    "same_tokens": True,
                    "max_logit_diff": (logits - out["none"][1]).abs().max().item(),
                }
            )
            print("kv cache:", rows[-1], flush=True)
    return rows


def kv_bytes_table(cfg, n_kv_options) -> list[dict]:
    from transformer_course.measure import kv_cache_bytes_per_token

    d_k = cfg.d_model // cfg.n_heads
    rows = []
    for n_kv in n_kv_options:
        kind = (
            "multi-head"
            if n_kv == cfg.n_heads
            else "multi-query"
            if n_kv == 1
            else "grouped-query"
        )
        rows.append(
            {
                "attention": kind,
                "n_kv_heads": n_kv,
                "bytes_per_token_fp32": kv_cache_bytes_per_token(
                    cfg.n_layers, n_kv, d_k, torch.float32
                ),
                "bytes_per_token_fp16": kv_cache_bytes_per_token(
                    cfg.n_layers, n_kv, d_k, torch.float16
                ),
            }
        )
    return rows


def bench_int8(model, x_val, y_val, repeat=3) -> dict:
    cpu = torch.device("cpu")
    model = model.to(cpu).eval()
    x_val, y_val = x_val.to(cpu), y_val.to(cpu)
    rows = {
        "float32": {
            "bytes": state_dict_bytes(model),
            "loss": val_loss(model, x_val, y_val),
            "s": best_time(lambda: model(x_val), cpu, repeat),
        }
    }
    by_hand = copy.deepcopy(model)
    int8_bytes = quantize_linear_weights_(by_hand)
    fp32_bytes = sum(4 * p.numel() for p in model.parameters())
    rows["int8 by hand"] = {
        "bytes": rows["float32"]["bytes"] - fp32_bytes + int8_bytes,
        "loss": val_loss(by_hand, x_val, y_val),
        "s": None,
        "note": "Linear weights rounded to int8 per row; bytes count int8 weights "
        "plus one float32 scale per row; run with the weights dequantized",
    }
    try:
        for name, q in torchao_int8(model).items():
            rows[name] = {
                "bytes": state_dict_bytes(q),
                "loss": val_loss(q, x_val, y_val),
                "s": best_time(lambda q=q: q(x_val), cpu, repeat),
            }
    except Exception as err:  # noqa: BLE001 (report, not hide, a torchao failure)
        rows["torchao error"] = f"{type(err).__name__}: {str(err)[:200]}"
    base = rows["float32"]
    for name, row in rows.items():
        if isinstance(row, dict) and name != "float32":
            row["size/float32"] = row["bytes"] / base["bytes"]
            row["loss/float32"] = row["loss"] / base["loss"]
            row["time/float32"] = row["s"] / base["s"] if row["s"] else None
    print("int8:", rows)
    return rows


# ---------------------------------------------------------------------- reporting


def fmt(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))  # every column, in order
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def goals(results: dict) -> list[dict]:
    """The goals of issues 14, 26 and 29 that this script measures, against the numbers
    now (the rows of the sections that ``results`` holds)."""
    rows = (
        flash_backward_goals(results["flash_backward"])
        if "flash_backward" in results
        else []
    )
    if "attention" not in results:  # a run of --only flash-backward alone
        return rows
    att = [r for r in results["attention"] if r["T"] >= 1024] or results["attention"]
    worst = max(att, key=lambda r: r["tiled/sdpa time"])
    worst_all = max(att, key=lambda r: r["tiled/sdpa time, all cores"])
    top = max(results["attention"], key=lambda r: r["T"])
    rows[:0] = [
        {
            "measure": f"tiled/sdpa time, worst T >= 1024, threads = {TIMING_THREADS}",
            "now": f"{worst['tiled/sdpa time']:.2f} (T = {worst['T']})",
            "goal": "<= 2.0",
            "met?": worst["tiled/sdpa time"] <= 2.0,
        },
        {
            "measure": "tiled/sdpa time, worst T >= 1024, threads = "
            f"{worst_all['all-core threads']} (all cores)",
            "now": f"{worst_all['tiled/sdpa time, all cores']:.2f} "
            f"(T = {worst_all['T']})",
            "goal": "<= 2.0",
            "met?": worst_all["tiled/sdpa time, all cores"] <= 2.0,
        },
        {
            "measure": f"tiled/naive peak extra memory, T = {top['T']}",
            "now": f"{top['tiled/naive memory']:.4f}",
            "goal": "<= 0.05 at T = 8192",
            "met?": top["T"] >= 8192 and top["tiled/naive memory"] <= 0.05,
        },
    ]
    kv = [r for r in results.get("kv_cache", []) if "concat/uncached time" in r]
    if kv:  # the longest generation
        top = max(kv, key=lambda r: r["new_tokens"])
        rows.append(
            {
                "measure": f"KV-cached/uncached generation time, {top['new_tokens']:,} "
                f"new tokens, threads = {TIMING_THREADS}",
                "now": f"{top['cached/uncached time']:.3f} (copy-per-step cache: "
                f"{top['concat/uncached time']:.3f})",
                "goal": "<= 0.05 at 2,048 new tokens",
                "met?": top["new_tokens"] >= 2048
                and top["cached/uncached time"] <= 0.05,
            }
        )
    if "translation" in results:  # written by benchmarks/translation.py
        tr = results["translation"]
        rows.append(
            {
                "measure": "chapter 6 held-out exact match, mean over "
                f"{tr['seeds']} seeds (benchmarks/translation.py)",
                "now": f"{tr['exact_match_mean']:.2%} (lowest seed "
                f"{tr.get('exact_match_min', float('nan')):.2%}), "
                f"{tr['train_seconds_mean']} s of training ({tr['torch_threads']} "
                "threads)",
                "goal": "every seed >= 99.8%, mean >= 99.9%, within 120 s of training",
                "met?": tr["exact_match_mean"] >= 0.999
                and tr.get("exact_match_min", 0.0) >= 0.998
                and tr["train_seconds_mean"] <= 120,
            }
        )
    for r in results.get("llm", {}).get("rows", []):  # chapter 10, issue 26
        rows.append(
            {
                "measure": "SmolLM2-135M cached greedy decoding, library/transformers "
                f"time, 64 new tokens, threads = {r['torch threads']}",
                "now": f"{r['library/transformers time']:.2f}",
                "goal": "<= 1.0 (the library at least as fast)",
                "met?": r["library/transformers time"] <= 1.0,
            }
        )
    rows += serving_goals(results.get("serving"))
    for r in results["mha"]:
        rows.append(
            {
                "measure": f"mha/torch time, {r['pass']}, threads = {r['threads']}",
                "now": f"{r['mha/torch time']:.2f}",
                "goal": "<= 1.1",
                "met?": r["mha/torch time"] <= 1.1,
            }
        )
    return rows


def serving_goals(serving: dict | None) -> list[dict]:
    """Issue 43's rows: the speculative speed-up on prompts that repeat their input,
    for each thread count measured."""
    if not serving:
        return []
    by_threads: dict[int, list[dict]] = {}  # rows written before "threads": one count
    for r in serving["speculative"]:
        by_threads.setdefault(r.get("threads", serving["torch threads"]), []).append(r)
    rows = []
    for n, runs in by_threads.items():
        worst = min(r["speculative speed-up"] for r in runs)
        against_hf = max(r["speculative/transformers lookup time"] for r in runs)
        rows += [
            {
                "measure": "speculative (prompt lookup)/plain greedy speed-up, worst of "
                f"{len(runs)} repeating prompts, threads = {n}",
                "now": f"{worst:.2f}",
                "goal": ">= 1.5",
                "met?": worst >= 1.5,
            },
            {
                "measure": "speculative/transformers prompt-lookup generate time, "
                f"worst, threads = {n}",
                "now": f"{against_hf:.2f}",
                "goal": "< 1.0",
                "met?": against_hf < 1.0,
            },
        ]
    return rows


def flash_backward_goals(fb: dict) -> list[dict]:
    """Issue 29's rows: memory and time of forward + backward through tiled attention."""
    mem = fb["memory"]
    rows = [r for r in fb["time"] if r["T"] >= 1024] or fb["time"]
    worst = max(rows, key=lambda r: r["tiled/sdpa time"])
    return [
        {
            "measure": "flash-backward: tiled/naive peak extra memory of forward + "
            f"backward, T = {mem['T']}",
            "now": f"{mem['tiled/naive memory']:.4f}",
            "goal": f"<= {FLASH_BACKWARD_MEMORY_GOAL} at T = 8192",
            "met?": mem["T"] >= 8192
            and mem["tiled/naive memory"] <= FLASH_BACKWARD_MEMORY_GOAL,
        },
        {
            "measure": "flash-backward: tiled/sdpa time of forward + backward, worst "
            f"T >= 1024, threads = {worst['threads']}",
            "now": f"{worst['tiled/sdpa time']:.2f} (T = {worst['T']})",
            "goal": f"<= {FLASH_BACKWARD_TIME_GOAL} (else the profile says why)",
            "met?": worst["tiled/sdpa time"] <= FLASH_BACKWARD_TIME_GOAL,
        },
    ]


def flash_backward_text(fb: dict) -> list[str]:
    """The report's section on training through tiled attention."""
    mem = fb["memory"]
    parts = [
        "## Flash-backward: training through tiled attention",
        "",
        (
            f"Run: `{fb['command']}`, load average (1, 5, 15 min) at the end: "
            f"{fb['load']}. Shape (batch, heads) = {tuple(fb['shape'])}, "
            "d_k = 64, float32, the library's default tiles (256 x 256). "
            "Forward + backward: the output, then the gradients of its sum with "
            "respect to q, k and v. Peak extra memory (tensors alive at once, "
            f"counted as in the attention table) at T = {mem['T']}:"
        ),
        "",
        table([mem]),
        "",
        "Time of forward + backward, measured side by side, best of several repeats:",
        "",
        table(fb["time"]),
        "",
    ]
    if "profile" in fb:
        parts += [
            "Where the time goes at the worst length (forward + backward):",
            "",
            *profile_text(fb["profile"]),
            "",
        ]
    return parts


def profile_text(prof: dict) -> list[str]:
    parts = {r["part"]: r["s"] for r in prof["parts"]}
    sdpa = prof["sdpa_s"]
    matmul = parts["matmul (bmm, mm)"]
    outside = next(s for p, s in parts.items() if p.startswith("outside"))
    softmax_ops = sum(parts.values()) - matmul - outside
    bigger = "separate operators" if softmax_ops > outside else "Python loop"
    return [
        (
            f"T = {prof['T']}, block_q = {prof['block_q']}, block_k = "
            f"{prof['block_k']}: {prof['operator_calls']} aten operator calls, "
            f"{prof['wall_s_under_profiler']:.3g} s under the profiler; SDPA (one "
            f"fused call) {sdpa:.3g} s."
        ),
        "",
        table(prof["parts"]),
        "",
        (
            f"Conclusion (computed from the rows above): the matmuls alone take "
            f"{matmul / sdpa:.2f} x SDPA's whole call, the softmax steps done as "
            f"separate operators (exp, max, sum, rescaling, copies) "
            f"{softmax_ops / sdpa:.2f} x, and the time outside operators (Python "
            f"loop, dispatcher, profiler) {outside / sdpa:.2f} x. The gap to SDPA "
            f"comes more from the {bigger} than from the "
            f"{'Python loop' if bigger != 'Python loop' else 'separate operators'}: "
            "SDPA's CPU kernel does the max, exp, sum and rescaling of a tile in one "
            "pass while the tile is in cache; the matmuls are the same arithmetic "
            "in both."
        ),
    ]


def threads_text(one: dict, many: dict) -> list[str]:
    """Why the all-cores column differs: the same profile with one thread per core."""
    outside = [
        next(r["s"] for r in p["parts"] if r["part"].startswith("outside"))
        for p in (one, many)
    ]
    return [
        (
            f"The same profile with {many['threads']} threads (all cores, while other "
            f"processes also run): {many['wall_s_under_profiler']:.3g} s, SDPA "
            f"{many['sdpa_s']:.3g} s. The time per operator call inside operators "
            f"goes from {one['ms_per_operator_call']:.3g} ms to "
            f"{many['ms_per_operator_call']:.3g} ms, the time outside operators from "
            f"{outside[0]:.3g} s to {outside[1]:.3g} s. A parallel operator ends only "
            "when all its threads have run, so on busy cores each of the loop's "
            "operators waits for a core; SDPA is one call and waits once. That is "
            "what the all-cores column of the attention table measures."
        ),
        "",
        table(many["parts"]),
    ]


# Sections of results.md and keys of results.json that other scripts write and a
# rewrite of the report keeps: benchmarks/translation.py's, benchmarks/live_views.py's
KEPT_HEADINGS = ("## Translation", "## Live views")
KEPT_KEYS = ("translation", "live_views")


def kept_translation_sections(path: Path) -> list[str]:
    """Sections of an existing report whose heading starts with one of
    ``KEPT_HEADINGS`` (written by ``benchmarks/translation.py`` and
    ``benchmarks/live_views.py``), kept as they are."""
    if not path.exists():
        return []
    kept, keep = [], False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            keep = line.startswith(KEPT_HEADINGS)
        if keep:
            kept.append(line)
    if kept and kept[-1].strip():
        kept.append("")
    return kept


def write_markdown(results: dict, path: Path) -> None:
    parts = [
        "# Benchmarks (chapter 7)",
        "",
        (
            f"Run: `{results['command']}`, {results['seconds']:.0f} s; load average "
            f"(1, 5, 15 min) at the end: {results['load']} on "
            f"{results['machine']['cpu_cores']} cores."
        ),
        "",
        "## Machine",
        "",
        table([results["machine"]]),
        "",
        "## Attention: peak extra memory and time against sequence length",
        "",
        (
            "Memory counts the tensors operators create (on a GPU, the "
            "allocator's peak); ratios below 1 mean less than naive."
        ),
        "",
        (
            f"Shape: {results['attention_shape']}; tiled with block_q = "
            f"{results['attention_tile']['block_q']}, block_k = "
            f"{results['attention_tile']['block_k']} (the fastest of the sweep "
            f"below). Times on {TIMING_THREADS} torch thread, and on all cores "
            "(one thread per core) in the last columns (see the profile below)."
        ),
        "",
        table(results["attention"]),
        "",
        "## Tiled attention: tile-size sweep",
        "",
        (
            "tiled/SDPA time for each (block_q, block_k), measured side by side in "
            "one run; `all T` processes every query row of a key block in one matmul."
        ),
        "",
        table(results["tile_sweep"]),
        "",
        "## Tiled attention: where the time goes (torch.profiler)",
        "",
        *profile_text(results["profile"]),
        "",
        *threads_text(results["profile"], results["profile_all_cores"]),
        "",
        "## Own MultiHeadAttention vs torch.nn.MultiheadAttention",
        "",
        (
            f"Self-attention, (batch, T, d_model, heads) = {results['mha_shape']}, "
            "the same weights copied with `interop.from_torch_mha`; own backend "
            '"sdpa". Times side by side, best of several repeats.'
        ),
        "",
        table(results["mha"]),
        "",
        "## Sliding-window attention: banded computation vs full masked",
        "",
        table(results["sliding_window"]),
        "",
        "## PyTorch SDPA backends and torch.compile (causal)",
        "",
        table([results["sdpa_backends"]]),
        "",
        "## Triton FlashAttention forward",
        "",
        table([results["triton"]]),
        "",
        "## KV cache: greedy generation with and without it",
        "",
        (
            f"Model: {results['lm']}. One greedy generation each, side by side, on "
            f"{TIMING_THREADS} torch thread: the preallocated `KVCache` (written in "
            "place), the copy-per-step `ConcatKVCache` (`torch.cat` every step) and "
            "no cache (the whole prefix recomputed every step); the run stops if "
            "they generate different tokens."
            + (
                f" Measured alone: `{results['kv_cache_command']}`."
                if "kv_cache_command" in results
                else ""
            )
        ),
        "",
        table(results["kv_cache"]),
        "",
        "## KV cache bytes per token",
        "",
        table(results["kv_bytes"]),
        "",
        "## Int8 quantization (CPU)",
        "",
    ]
    int8 = [
        {"variant": k, **v} for k, v in results["int8"].items() if isinstance(v, dict)
    ]
    parts += [table(int8), ""]
    if "llm" in results:
        parts += llm_bench.markdown(results["llm"], table, results.get("llm_command"))
    if "serving" in results:
        command = results.get("serving_command")
        parts += serving_bench.markdown(results["serving"], table, command)
    if "torchao error" in results["int8"]:
        parts += [f"torchao failed here: {results['int8']['torchao error']}", ""]
    parts += flash_backward_text(results["flash_backward"])
    parts += kept_translation_sections(path)
    parts += ["## Goals", "", table(results["goals"]), ""]
    path.write_text("\n".join(parts))


def run_flash_backward(device, smoke: bool, command: str) -> dict:
    out = bench_flash_backward(
        [64, 128] if smoke else [1024, 2048, 4096, 8192],
        device,
        memory_t=256 if smoke else 8192,
        repeat=1 if smoke else 3,
    )
    return {"command": command, "load": load_average(), **out}


def only_flash_backward(args, device, command: str) -> int:
    """``--only flash-backward``: measure it and merge it into ``--out``'s reports
    (the other sections stay as the last full run wrote them)."""
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results["flash_backward"] = run_flash_backward(device, args.smoke, command)
    results["flash_backward"]["machine"] = machine(device)
    results["goals"] = goals(results)
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    md = args.out / "results.md"
    if "attention" in results:  # a full run's results: rewrite the whole report
        write_markdown(results, md)
    else:
        fb = flash_backward_text(results["flash_backward"])
        md.write_text("\n".join([*fb, "## Goals", "", table(results["goals"]), ""]))
    print(f"wrote {md} and {path}")
    return 0


def lm_measurements(results: dict, smoke: bool, device):
    """Train the Shakespeare LM and measure its KV cache (time and bytes per token);
    returns the model and its validation batch for the int8 measurement."""
    gen_lengths = [8, 16] if smoke else [256, 512, 1024, 2048]
    model, tok, val, train_loss = shakespeare_lm(
        steps=3 if smoke else 300,
        d_model=32 if smoke else 128,
        n_layers=1 if smoke else 2,
        max_len=max(gen_lengths) + 80,
        device=device,
    )
    results["lm"] = (
        f"character-level DecoderOnlyLM, d_model {model.cfg.d_model}, "
        f"{model.cfg.n_layers} layers, {model.cfg.n_heads} heads, "
        f"final training loss {train_loss:.3f}"
    )
    results["kv_cache"] = bench_kv_cache(model, tok, gen_lengths, device)
    results["kv_bytes"] = kv_bytes_table(model.cfg, [model.cfg.n_heads, 2, 1])
    return model, val


LLM_THREADS = sorted({TIMING_THREADS, ALL_CORES})  # one thread, and all cores


def merge_alone(results: dict, keys: tuple[str, ...], args, seconds: float) -> int:
    """``--only kv-cache`` / ``--only llm``: put the sections ``keys`` of ``results``
    into the full report in ``args.out`` when there is one (its Goals table redone, the
    command that measured them noted as ``<first key>_command`` and shown in their
    section), else write them alone to ``results-<args.only>.json``."""
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    full = json.loads(path.read_text()) if path.exists() else {}
    if "attention" not in full:  # no full run to update
        results["seconds"], results["load"] = seconds, load_average()
        path = out / f"results-{args.only}.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path} in {seconds:.0f} s")
        return 0
    full.update({k: results[k] for k in keys})
    full[f"{keys[0]}_command"] = f"{results['command']}, {seconds:.0f} s"
    full["goals"] = goals(full)
    path.write_text(json.dumps(full, indent=2))
    write_markdown(full, out / "results.md")
    print(
        f"updated the {', '.join(keys)} sections of {out}/results.md and results.json"
    )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the reports")
    parser.add_argument(
        "--only",
        choices=["flash-backward", "kv-cache", "llm", "serving"],
        help="run this measurement alone and merge it into the reports in --out "
        "(into results-<name>.json where --out has no full run)",
    )
    args = parser.parse_args(argv)
    from transformer_course.device import get_device

    device = get_device()
    start = time.perf_counter()
    smoke = args.smoke
    command = "python benchmarks/run.py" + (" --smoke" if smoke else "")
    if args.only == "flash-backward":
        return only_flash_backward(args, device, f"{command} --only {args.only}")
    results = {
        "command": command + (f" --only {args.only}" if args.only else ""),
        "smoke": smoke,
        "machine": machine(device),
    }
    if args.only == "kv-cache":
        lm_measurements(results, smoke, device)
        keys = ("kv_cache", "lm", "kv_bytes")
        return merge_alone(results, keys, args, time.perf_counter() - start)
    if args.only == "llm":
        results["llm"] = llm_bench.bench_llm(smoke, LLM_THREADS, threads, side_by_side)
        return merge_alone(results, ("llm",), args, time.perf_counter() - start)
    if args.only == "serving":
        results["serving"] = serving_bench.bench_serving(
            smoke, LLM_THREADS, threads, side_by_side
        )
        return merge_alone(results, ("serving",), args, time.perf_counter() - start)
    lengths = [64, 128] if smoke else [256, 512, 1024, 2048, 4096, 8192]
    sweep_t = 128 if smoke else 2048
    results["tile_sweep"] = bench_tile_sweep(
        sweep_t,
        device,
        TILES[:3] + TILES[-1:] if smoke else TILES,
        repeat=1 if smoke else 3,
    )
    fastest = min(results["tile_sweep"], key=lambda r: r["tiled/sdpa time"])
    block_q = None if fastest["block_q"] == "all T" else fastest["block_q"]
    block_k = fastest["block_k"]
    results["attention_tile"] = {"block_q": fastest["block_q"], "block_k": block_k}
    results["attention_shape"] = (
        f"(batch, heads, T, d_k) = ({ATTN_SHAPE[0]}, {ATTN_SHAPE[1]}, T, 64), float32"
    )
    results["attention"] = bench_attention(
        lengths, device, block_q, block_k, repeat=1 if smoke else 3
    )
    results["profile"] = profile_tiled(
        128 if smoke else 2048, device, block_q, block_k, runs=1 if smoke else 3
    )
    results["profile_all_cores"] = profile_tiled(
        128 if smoke else 2048, device, block_q, block_k, 1 if smoke else 2, ALL_CORES
    )
    mha_shape = (2, 32, 64, 4) if smoke else (8, 256, 256, 4)
    results["mha_shape"] = mha_shape
    results["mha"] = bench_mha(device, *mha_shape, repeat=1 if smoke else 5)
    results["sliding_window"] = bench_sliding_window(
        [128, 256] if smoke else [1024, 2048, 4096, 8192],
        32 if smoke else 256,
        device,
        repeat=1 if smoke else 3,
    )
    results["sdpa_backends"] = bench_sdpa_backends(
        128 if smoke else 2048, device, compile_too=not smoke, repeat=1 if smoke else 3
    )
    results["triton"] = bench_triton(1024 if smoke else 4096, device)
    model, (x_val, y_val) = lm_measurements(results, smoke, device)
    results["int8"] = bench_int8(model, x_val, y_val, repeat=1 if smoke else 5)
    results["flash_backward"] = run_flash_backward(device, smoke, command)
    results["llm"] = llm_bench.bench_llm(smoke, LLM_THREADS, threads, side_by_side)
    results["serving"] = serving_bench.bench_serving(
        smoke, LLM_THREADS, threads, side_by_side
    )
    results["seconds"] = time.perf_counter() - start
    results["load"] = load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    old_json = args.out / "results.json"
    if old_json.exists():  # translation.py's and live_views.py's results stay
        old = json.loads(old_json.read_text())
        results |= {k: old[k] for k in KEPT_KEYS if k in old}
    results["goals"] = goals(results)
    old_json.write_text(json.dumps(results, indent=2))
    write_markdown(results, args.out / "results.md")
    print(f"wrote {args.out}/results.md and results.json in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
