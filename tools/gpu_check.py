"""The GPU path of the course, checked on a CUDA GPU: `make gpu-check`.

    python tools/gpu_check.py               # on a machine with a CUDA GPU
    python tools/gpu_check.py --cpu-smoke   # the same steps, tiny, on the CPU (tests)

Steps (each prints what it measured; any failed check exits 1):

1. device selection: ``get_device()`` picks CUDA, ``TRANSFORMER_COURSE_DEVICE=cpu``
   overrides it, and the library's attention backends agree with a float64 reference
   on the GPU in float32/float16/bfloat16, fully masked rows giving zeros (pitfall P1);
2. a short training run of the library's ``DecoderOnlyLM`` on the GPU (character level,
   English number words from ``num2words``, so nothing is downloaded): the loss must
   fall, and greedy generation with the KV cache must equal generation without it;
3. the Triton FlashAttention kernel (``triton_kernels.flash_attention``, if present):
   agreement with PyTorch's SDPA (causal, padding mask, T not a multiple of the block),
   then its time and TFLOP/s against ``F.scaled_dot_product_attention`` for growing T;
4. running out of memory: naive attention (the full (B, H, T, T) scores) at doubling T
   until ``torch.cuda.OutOfMemoryError``, which is caught and reported with the longest
   length that ran, next to the fused SDPA at the length that failed.

Writes ``benchmarks/gpu-results.md``. Sized for one H100/H200 well within 8 minutes.
Without a CUDA GPU it says so and exits 0 (nothing is written).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "gpu-results.md"


class Report:
    def __init__(self):
        self.lines: list[str] = []
        self.failures: list[str] = []

    def section(self, title: str):
        print(f"\n== {title}", flush=True)
        self.lines += ["", f"## {title}", ""]

    def line(self, text: str):
        print(text, flush=True)
        self.lines.append(text)

    def check(self, ok: bool, what: str):
        self.line(f"- {'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            self.failures.append(what)

    def table(self, rows: list[dict]):
        if not rows:
            return
        keys = list(rows[0])
        self.line("| " + " | ".join(keys) + " |")
        self.line("|" + "---|" * len(keys))
        for r in rows:
            self.line(
                "| "
                + " | ".join(
                    f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()
                )
                + " |"
            )


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_device(report: Report, device: torch.device):
    from transformer_course.attention import ATTENTION_BACKENDS
    from transformer_course.device import ENV_VAR, get_device
    from transformer_course.masks import causal_mask

    report.section("Device selection and attention backends")
    old = os.environ.pop(ENV_VAR, None)
    try:
        chosen = get_device()
        report.check(chosen.type == device.type, f"get_device() chose {chosen}")
        os.environ[ENV_VAR] = "cpu"
        report.check(get_device().type == "cpu", f"{ENV_VAR}=cpu overrides it")
    finally:
        os.environ.pop(ENV_VAR, None)
        if old is not None:
            os.environ[ENV_VAR] = old

    torch.manual_seed(0)
    B, H, T, d = 2, 4, 67, 32
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(3))
    mask = causal_mask(T, T).expand(B, H, T, T).clone()
    mask[1, :, 5, :] = False  # one fully masked query row (pitfall P1)
    ref = (
        torch.softmax(
            (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf")),
            dim=-1,
        ).nan_to_num(0.0)
        @ v
    )
    tolerance = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
    backends = dict(ATTENTION_BACKENDS)
    rows = []
    for name, fn in backends.items():
        for dtype, tol in tolerance.items():
            args = [x.to(device, dtype) for x in (q, k, v)]
            out = fn(*args, mask=mask.to(device))[0]
            err = (out.double().cpu() - ref).abs().max().item()
            row5 = out[1, :, 5].abs().max().item()
            finite = bool(torch.isfinite(out).all())
            rows.append(
                {
                    "backend": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "max abs error": err,
                    "masked row max": row5,
                    "finite": finite,
                }
            )
            if not (err <= tol and row5 == 0.0 and finite):
                report.failures.append(
                    f"{name} {dtype}: error {err:.3g}, masked row "
                    f"{row5:.3g}, finite {finite}"
                )
    report.table(rows)
    report.check(
        not any("error" in f for f in report.failures),
        "every backend agrees with the float64 reference; masked rows are 0",
    )


# -- 2. a training run on the device ---------------------------------------------------------


def check_training(
    report: Report,
    device: torch.device,
    *,
    steps: int,
    d_model: int,
    n_layers: int,
    batch: int,
    block: int,
):
    from transformer_course.data import CharTokenizer
    from transformer_course.decoding import generate
    from transformer_course.model import DecoderOnlyLM, TransformerConfig
    from transformer_course.translation_data import number_words

    report.section("Training the library's DecoderOnlyLM on the device")
    torch.manual_seed(0)
    text = " ".join(number_words(n) + "." for n in range(0, 20_000, 7))
    tok = CharTokenizer([text])
    data = torch.tensor(tok.encode(text), device=device)
    cfg = TransformerConfig(
        tgt_vocab_size=tok.vocab_size,
        d_model=d_model,
        n_heads=max(1, d_model // 64),
        d_ff=4 * d_model,
        n_layers=n_layers,
        max_len=block + 32,
        dropout=0.0,
        backend="sdpa",
        tie_embeddings=True,
    )
    model = DecoderOnlyLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = device.type == "cuda"

    def batch_xy():
        i = torch.randint(0, len(data) - block - 1, (batch,), device=device)
        idx = i[:, None] + torch.arange(block + 1, device=device)  # (batch, block + 1)
        chunk = data[idx]
        return chunk[:, :-1], chunk[:, 1:]

    losses = []
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = batch_xy()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)  # (batch, block, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    sync(device)
    seconds = time.perf_counter() - start
    first = sum(losses[:10]) / min(10, len(losses))
    last = sum(losses[-10:]) / min(10, len(losses))
    report.table(
        [
            {
                "parameters": n_params,
                "steps": steps,
                "batch x block": f"{batch} x {block}",
                "seconds": seconds,
                "tokens/s": steps * batch * block / seconds,
                "loss first 10": first,
                "loss last 10": last,
            }
        ]
    )
    report.check(last < 0.7 * first, f"loss fell from {first:.3f} to {last:.3f}")

    model.eval()
    prompt = torch.tensor([tok.encode("forty-two")], device=device)
    plain = generate(model, prompt, 16, use_cache=False)
    cached = generate(model, prompt, 16)
    report.line(f"generated after 'forty-two': {tok.decode(plain[0].tolist())!r}")
    report.check(torch.equal(plain, cached), "greedy tokens with KV cache == without")


# -- 3. the Triton kernel --------------------------------------------------------------------------


def check_triton(
    report: Report, device: torch.device, *, lengths: list[int], repeat: int
):
    report.section("Triton FlashAttention kernel against PyTorch SDPA")
    if importlib.util.find_spec("transformer_course.triton_kernels") is None:
        report.line("transformer_course.triton_kernels does not exist yet: skipped")
        return
    from transformer_course import triton_kernels
    from transformer_course.measure import best_time

    if not triton_kernels.is_available(device):
        report.line(f"Triton cannot run on {device} here: skipped")
        return
    flash = triton_kernels.flash_attention
    torch.manual_seed(0)
    # Every dtype the kernel's docstring promises, each within its rounding of SDPA in
    # float32 (under TRITON_INTERPRET=1 too: bfloat16 once returned garbage there).
    tolerances = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}
    B, H, T, d = (2, 3, 130, 64) if device.type == "cuda" else (1, 1, 130, 32)
    for dtype, tol in tolerances.items():  # T not a multiple of the block (P17)
        q, k, v = (torch.randn(B, H, T, d, device=device) for _ in range(3))
        keep = torch.ones(B, T, dtype=torch.bool, device=device)
        keep[-1, 100:] = False
        low = [x.to(dtype) for x in (q, k, v)]
        # the reference: SDPA in float32 on the same (rounded) inputs
        ref = partial(F.scaled_dot_product_attention, *(x.float() for x in low))
        cases = {
            "plain": (flash(*low), ref()),
            "causal": (flash(*low, causal=True), ref(is_causal=True)),
            "padding mask": (
                flash(*low, key_mask=keep),
                ref(attn_mask=keep[:, None, None, :]),
            ),
        }
        name = str(dtype).removeprefix("torch.")
        for case, (ours, want) in cases.items():
            err = (ours.float() - want).abs().max().item()
            report.check(
                ours.dtype == dtype and err <= tol,
                f"{name} {case}: max abs difference {err:.2e} (<= {tol:g}), "
                f"output {str(ours.dtype).removeprefix('torch.')}",
            )

    dtypes = (
        [torch.float16, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    )
    ratio_at = {}
    for dtype in dtypes:
        rows = []
        for t in lengths:
            B, H, d = 4, 16, 64
            q, k, v = (
                torch.randn(B, H, t, d, device=device, dtype=dtype) for _ in range(3)
            )
            flops = 4 * B * H * t * t * d / 2  # two matmuls, causal half
            ours = best_time(partial(flash, q, k, v, causal=True), device, repeat)
            ref = best_time(
                partial(F.scaled_dot_product_attention, q, k, v, is_causal=True),
                device,
                repeat,
            )
            ratio_at[dtype, t] = ref / ours
            rows.append(
                {
                    "T": t,
                    "B x H x d": f"{B} x {H} x {d}",
                    "triton ms": ours * 1e3,
                    "sdpa ms": ref * 1e3,
                    "triton TFLOP/s": flops / ours / 1e12,
                    "sdpa TFLOP/s": flops / ref / 1e12,
                    "triton / sdpa time": ours / ref,
                }
            )
        report.line("")
        report.line(
            f"causal forward, {str(dtype).removeprefix('torch.')}, fastest of {repeat}:"
        )
        report.line("")
        report.table(rows)
    goal = (torch.bfloat16, 4096)
    if goal in ratio_at:
        speed = ratio_at[goal]
        report.line("")
        report.line(
            f"goal: the Triton forward at >= 0.7x SDPA's speed in bfloat16 at T = 4096: "
            f"{speed:.2f}x, {'reached' if speed >= 0.7 else 'NOT reached'}"
        )
    if device.type == "cuda":
        launch_sweep(report, device, repeat=repeat)


# the launch configurations the sweep tries: (block_m, block_n, num_warps, num_stages);
# None = Triton's default. The first is what flash_attention launches by default.
LAUNCHES = [
    (64, 64, None, None),
    (64, 64, 4, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (128, 128, 8, 3),
    (128, 32, 4, 3),
    (64, 128, 4, 3),
    (128, 128, 8, 2),
]


def launch_sweep(report: Report, device, *, repeat: int, t: int = 4096):
    """The forward kernel at bfloat16, T = ``t``, causal, under each of ``LAUNCHES``:
    its error against SDPA and its time, to say which tiles and warps suit the GPU."""
    from transformer_course import triton_kernels as tk
    from transformer_course.measure import best_time

    triton, kernel = tk._kernels()
    B, H, d = 4, 16, 64
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(B * H, t, d, device=device, dtype=torch.bfloat16) for _ in range(3)
    )
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = best_time(
        partial(F.scaled_dot_product_attention, q, k, v, is_causal=True), device, repeat
    )
    keep = torch.ones(1, 1, dtype=torch.int8, device=device)
    scale = 1 / math.sqrt(d)
    flops = 4 * B * H * t * t * d / 2
    rows = []
    for block_m, block_n, warps, stages in LAUNCHES:
        cfg = tk._Config(scale, H, False, True, "tf32", block_m, block_n)
        launch = {
            **tk._constants(cfg, triton, d),
            **({"num_warps": warps} if warps else {}),
            **({"num_stages": stages} if stages else {}),
        }
        out = torch.empty_like(q)
        lse = torch.empty(B * H, t, device=device, dtype=torch.float32)
        grid = (triton.cdiv(t, block_m), B * H)

        def run(out=out, lse=lse, grid=grid, launch=launch):
            kernel[grid](q, k, v, out, lse, keep, scale, t, t, H, d, **launch)

        row = {"block_m x block_n": f"{block_m} x {block_n}"}
        row["warps, stages"] = f"{warps or 'default'}, {stages or 'default'}"
        try:
            run()
            err = (out.float() - want.float()).abs().max().item()
            seconds = best_time(run, device, repeat)
            row.update(
                {
                    "max abs error": err,
                    "ms": seconds * 1e3,
                    "TFLOP/s": flops / seconds / 1e12,
                    "speed / sdpa": ref / seconds,
                }
            )
        except Exception as err:  # noqa: BLE001 (a launch the GPU refuses: reported)
            row["max abs error"] = f"{type(err).__name__}: {str(err)[:60]}"
        rows.append(row)
    report.line("")
    report.line(
        f"launch sweep of the forward kernel, bfloat16, causal, B x H x T x d = "
        f"{B} x {H} x {t} x {d}; SDPA {ref * 1e3:.3f} ms "
        f"({flops / ref / 1e12:.0f} TFLOP/s), fastest of {repeat}:"
    )
    report.line("")
    report.table(rows)


# -- 4. running out of memory -----------------------------------------------------------


def naive_attention(q, k, v):
    """The three steps with the (B, H, T, T) scores and weights in full."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def check_out_of_memory(
    report: Report,
    device: torch.device,
    *,
    start: int,
    limit: int,
    heads: int,
    attend=naive_attention,
):
    """Double T from ``start`` until ``attend`` raises OutOfMemoryError or T > limit."""
    report.section("Running out of memory: naive attention at growing T")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    rows, largest, failed_at, t = [], None, None, start
    while t <= limit:
        try:
            q, k, v = (
                torch.randn(1, heads, t, 64, device=device, dtype=dtype)
                for _ in range(3)
            )
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            out = attend(q, k, v)
            sync(device)
            peak = (
                torch.cuda.max_memory_allocated(device) / 2**30
                if device.type == "cuda"
                else float("nan")
            )
            rows.append({"T": t, "ran": "yes", "peak GiB": peak})
            largest = t
            del q, k, v, out
        except torch.OutOfMemoryError:  # torch.cuda.OutOfMemoryError is this class
            failed_at = t
            rows.append({"T": t, "ran": "OutOfMemoryError", "peak GiB": float("nan")})
            break
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        t *= 2
    total = (
        torch.cuda.get_device_properties(device).total_memory / 2**30
        if device.type == "cuda"
        else float("nan")
    )
    report.line(
        f"1 sequence, {heads} heads, d_k = 64, "
        f"{str(dtype).removeprefix('torch.')}; device memory {total:.0f} GiB:"
    )
    report.line("")
    report.table(rows)
    report.line("")
    if failed_at is None:
        report.line(
            f"no OutOfMemoryError up to T = {limit}; longest that ran: {largest}"
        )
    else:
        report.line(
            f"longest length that ran: {largest}; OutOfMemoryError at T = {failed_at}"
        )
        try:  # the fused kernel never holds the scores: does it fit where naive failed?
            q, k, v = (
                torch.randn(1, heads, failed_at, 64, device=device, dtype=dtype)
                for _ in range(3)
            )
            F.scaled_dot_product_attention(q, k, v)
            sync(device)
            report.line(f"F.scaled_dot_product_attention at T = {failed_at}: ran")
        except torch.OutOfMemoryError:
            report.line(
                f"F.scaled_dot_product_attention at T = {failed_at}: also "
                "OutOfMemoryError"
            )
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report.check(largest is not None, "naive attention ran at the smallest length")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run every step at tiny sizes on the CPU (for tests)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        device = torch.device("cpu")
        sizes = {"steps": 30, "d_model": 64, "n_layers": 1, "batch": 8, "block": 32}
        lengths, repeat = [32], 1
        oom = {"start": 64, "limit": 256, "heads": 2}
    elif torch.cuda.is_available():
        device = torch.device("cuda")
        sizes = {
            "steps": 1500,
            "d_model": 384,
            "n_layers": 6,
            "batch": 64,
            "block": 256,
        }
        lengths, repeat = [1024, 2048, 4096, 8192, 16384], 20
        oom = {"start": 4096, "limit": 2**20, "heads": 32}
    else:
        print(
            "gpu-check: no CUDA GPU on this machine; nothing to check. Run `make "
            "gpu-check` on a machine with an NVIDIA GPU (the chapters themselves use "
            "one in Colab through get_device())."
        )
        return 0
    if args.cpu_smoke and importlib.util.find_spec("triton") is not None:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    report = Report()
    start = time.perf_counter()
    name = (
        torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor()
    )
    report.lines += [
        "# GPU check results",
        "",
        (
            f"Written by `tools/gpu_check.py` (`make gpu-check`) on "
            f"{time.strftime('%Y-%m-%d')}: {name or device}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, Python {platform.python_version()}."
        ),
    ]
    if importlib.util.find_spec("triton") is not None:
        import triton

        report.lines[-1] += f" Triton {triton.__version__}."
    steps = [
        lambda: check_device(report, device),
        lambda: check_training(report, device, **sizes),
        lambda: check_triton(report, device, lengths=lengths, repeat=repeat),
        lambda: check_out_of_memory(report, device, **oom),
    ]
    for step in steps:
        try:
            step()
        except Exception as err:  # noqa: BLE001 (report and go on with the next step)
            report.check(False, f"raised {type(err).__name__}: {err}")
    total = time.perf_counter() - start
    report.section("Summary")
    report.line(f"{len(report.failures)} failed check(s); total {total:.0f} s.")
    for failure in report.failures:
        report.line(f"- {failure}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report.lines).lstrip() + "\n")
    print(f"gpu-check: wrote {args.out}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
