"""Chapter 11's measurements: serving SmolLM2-135M-Instruct from a paged, shared and
quantized KV cache, and speculative decoding against plain and transformers' decoding.

Run through ``benchmarks/run.py`` (``--only serving`` runs only this), one torch
thread (speculative decoding also on all cores), float32, greedy:

- paged memory: a batch of chat requests of varied lengths served together (each ends
  at ``<|im_end|>`` or after ``N_NEW`` tokens): the most bytes the pool held against
  what chapter 7's preallocated cache reserves (every request the longest length);
- prefix sharing: requests with one long system prompt, time to their first tokens
  with and without prefix caching, and the prompt tokens computed;
- quantized cache: bytes per token of SmolLM2's cache in float32, int8 and int4
  (KIVI layout), and the greedy tokens that agree with the float cache's;
- speculative decoding on prompts whose answers repeat their input: tokens per second
  of plain ``generate``, prompt-lookup ``speculative_generate``, and ``transformers``'
  ``generate`` without and with ``prompt_lookup_num_tokens``, side by side, on each
  thread count; the tokens and the acceptance rate.

``--smoke`` uses ``llm_bench``'s tiny random Llama so that the tests run it in seconds.
"""

from __future__ import annotations

import functools
import time

import llm_bench
import torch

from transformer_course.decoding import generate
from transformer_course.kv_quant import QuantizedKVCache, quantized_bytes_per_token
from transformer_course.measure import kv_cache_bytes_per_token
from transformer_course.paged_cache import BlockPool, preallocated_bytes
from transformer_course.serving import serve
from transformer_course.speculative import PromptLookupDrafter, speculative_generate

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "Explain in two sentences what a KV cache is.",
    "What is 12 times 12?",
    "Give me a synonym for happy.",
    "List the planets of the solar system.",
    "Translate 'good morning' into German.",
]
SYSTEM = (
    "You are a careful assistant for a course on attention and the Transformer. Answer "
    "in plain English, briefly, and say when you are unsure. Use short sentences. Do "
    "not invent references. When the user asks for code, write Python with comments. "
    "When the user asks for a number, give the number first and the reason after it. "
    "Keep every answer under one hundred words unless the user asks for more detail."
)
REPEAT = [
    (
        "Repeat the following text exactly, word for word: Attention lets every token look "
        "at every other token. The keys say what a token offers, the queries what it "
        "seeks, and the values what it passes on."
    ),
    (
        "Fix the spelling and return the whole text: The quik brown fox jumpd over the "
        "lazy dog, and then the dog chasd the fox around the feild until sunset."
    ),
    (
        "Add a docstring to this function and return the whole function:\n"
        "def scaled_scores(q, k):\n    d = q.shape[-1]\n    return q @ k.T / d ** 0.5\n"
    ),
]
N_NEW = 48
K = 4  # draft tokens a pass (and transformers' prompt_lookup_num_tokens)


def _prompts(smoke: bool, tok, texts, system=None):
    if smoke:
        g = torch.Generator().manual_seed(len(texts))
        rows = [
            torch.randint(1, 97, (5 + 3 * i,), generator=g).tolist()
            for i in range(len(texts))
        ]
        if system is not None:
            head = torch.randint(1, 97, (40,), generator=g).tolist()
            rows = [head + r for r in rows]
        return rows
    from transformer_course.chat import apply_chat_template

    turns = [] if system is None else [{"role": "system", "content": system}]
    return [
        tok.encode(apply_chat_template([*turns, {"role": "user", "content": t}])).ids
        for t in texts
    ]


def _paged_memory(model, prompts, n_new, eos) -> dict:
    pool = BlockPool.for_model(model, n_blocks=len(prompts) * 8, block_size=16)
    start = time.perf_counter()
    res = serve(model, prompts, n_new, pool=pool, eos_token_id=eos)
    seconds = time.perf_counter() - start
    longest = max(map(len, prompts)) + n_new
    reserved = preallocated_bytes(pool, len(prompts), longest)
    held = res.peak_blocks * pool.bytes_per_block
    alone = [
        generate(model, torch.tensor([p]), n_new, eos_token_id=eos) for p in prompts
    ]
    same = all(
        out == row[0, len(p) :].tolist()[: len(out)]
        for out, row, p in zip(res.outputs, alone, prompts)
    )
    return {
        "requests": len(prompts),
        "prompt tokens": [len(p) for p in prompts],
        "new tokens": [len(o) for o in res.outputs],
        "block size": pool.block_size,
        "peak paged MB": held / 2**20,
        "preallocated MB": reserved / 2**20,
        "paged/preallocated memory": held / reserved,
        "serve seconds": seconds,
        "same tokens as generate alone": same,
    }


def _prefix(model, prompts) -> dict:
    rows = {}
    for name, caching in (
        ("without prefix caching", False),
        ("with prefix caching", True),
    ):
        pool = BlockPool.for_model(
            model, n_blocks=len(prompts) * 20, prefix_caching=caching
        )
        start = time.perf_counter()
        res = serve(model, prompts, 1, pool=pool)
        rows[name] = (time.perf_counter() - start, res)
    (plain_s, plain), (shared_s, shared) = rows.values()
    return {
        "requests": len(prompts),
        "prompt tokens each": [len(p) for p in prompts],
        "computed tokens without / with": [
            plain.computed_tokens,
            shared.computed_tokens,
        ],
        "first tokens seconds without": plain_s,
        "first tokens seconds with": shared_s,
        "prefix speed-up": plain_s / shared_s,
        "same first tokens": plain.outputs == shared.outputs,
    }


def _quantized(model, prompts, n_new) -> list[dict]:
    cfg = model.cfg
    n_kv = cfg.n_kv_heads or cfg.n_heads
    full = kv_cache_bytes_per_token(cfg.n_layers, n_kv, cfg.d_k)
    ref = [generate(model, torch.tensor([p]), n_new)[0, len(p) :] for p in prompts]
    rows = [
        {
            "cache": "float32",
            "bytes/token": full,
            "of float32": 1.0,
            "greedy agreement": 1.0,
        }
    ]
    for bits in (8, 4):
        per = quantized_bytes_per_token(
            cfg.n_layers, n_kv, cfg.d_k, bits, group_size=32
        )
        cache = functools.partial(
            QuantizedKVCache, bits, n_sink=4, group_size=32, residual=32
        )
        agree = [
            (generate(model, torch.tensor([p]), n_new, cache=cache)[0, len(p) :] == r)
            .float()
            .mean()
            for p, r in zip(prompts, ref)
        ]
        rows.append(
            {
                "cache": f"int{bits} (KIVI: 4 sinks, groups of 32, 32 recent exact)",
                "bytes/token": per,
                "of float32": per / full,
                "greedy agreement": float(sum(agree) / len(agree)),
            }
        )
    return rows


def _contenders(ours, theirs, ids, n_new) -> dict:
    """The four decoders timed side by side on one prompt."""
    return {
        "generate": lambda: generate(ours, ids, n_new),
        "speculative": lambda: speculative_generate(
            ours, ids, n_new, PromptLookupDrafter(), k=K
        ),
        "transformers": lambda: llm_bench.hf_generate(theirs, ids, n_new),
        "transformers lookup": lambda: llm_bench.hf_generate(
            theirs, ids, n_new, prompt_lookup_num_tokens=K
        ),
    }


def _speculative(
    ours, theirs, prompts, n_new, side_by_side, rounds, threads, thread_counts
) -> list[dict]:
    """One row per prompt and thread count: the four decoders side by side."""
    rows = []
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        ref = generate(ours, ids, n_new)
        spec, stats = speculative_generate(ours, ids, n_new, PromptLookupDrafter(), k=K)
        hf = llm_bench.hf_generate(theirs, ids, n_new)
        for n in thread_counts:
            with threads(n) as used:
                best = side_by_side(
                    _contenders(ours, theirs, ids, n_new), "cpu", repeat=rounds
                )
            rows.append(
                {
                    "prompt": i,
                    "threads": used,
                    "prompt tokens": ids.shape[1],
                    "same tokens": torch.equal(spec, ref) and torch.equal(spec, hf),
                    "acceptance rate": stats.acceptance_rate,
                    "tokens/pass": stats.tokens_per_pass,
                    "generate tokens/s": n_new / best["generate"],
                    "speculative tokens/s": n_new / best["speculative"],
                    "transformers tokens/s": n_new / best["transformers"],
                    "transformers lookup tokens/s": n_new / best["transformers lookup"],
                    "speculative speed-up": best["generate"] / best["speculative"],
                    "speculative/transformers lookup time": best["speculative"]
                    / best["transformers lookup"],
                }
            )
    return rows


def bench_serving(smoke: bool, thread_counts, threads, side_by_side) -> dict:
    """The measurements above, on one torch thread; speculative decoding also on each
    of ``thread_counts``. ``threads`` and ``side_by_side`` are run.py's."""
    ours, theirs, _, what = llm_bench.models(smoke)
    tok, eos = None, None
    if not smoke:
        from transformer_course.chat import gguf_tokenizer
        from transformer_course.pretrained import smollm2_reader

        tok = gguf_tokenizer(smollm2_reader())
        eos = tok.token_to_id("<|im_end|>")
    n_new = 8 if smoke else N_NEW
    with threads(1) as used:
        questions = _prompts(smoke, tok, QUESTIONS)
        result = {
            "model": what.split(", prompt ")[0],  # llm_bench's prompt is not used here
            "torch threads": used,
            "paged": _paged_memory(ours, questions, n_new, eos),
            "prefix": _prefix(ours, _prompts(smoke, tok, QUESTIONS, SYSTEM)),
            "quantized": _quantized(ours, questions[: 2 if smoke else 4], n_new),
        }
    repeating = _prompts(smoke, tok, REPEAT)
    spec = _speculative(
        ours,
        theirs,
        repeating,
        n_new,
        side_by_side,
        1 if smoke else 3,
        threads,
        thread_counts,
    )
    return result | {"speculative": spec}


def markdown(result: dict, table, alone: str | None = None) -> list[str]:
    """The section of results.md; ``alone``: the command that measured it by itself."""
    paged, prefix = result["paged"], result["prefix"]
    return [
        "## Serving: paged, shared and quantized KV caches, speculative decoding (chapter 11)",
        "",
        f"Model: {result['model']}, greedy, {result['torch threads']} torch thread."
        + (f" Measured alone: `{alone}`." if alone else ""),
        "",
        table([{k: v for k, v in paged.items() if not isinstance(v, list)}]),
        "",
        table([{k: v for k, v in prefix.items() if not isinstance(v, list)}]),
        "",
        (
            "Quantized cache: greedy agreement over the first chat requests above, "
            f"{N_NEW} new tokens each; at these lengths few tokens are past the exact "
            "sinks and residual (chapter 11 measures 20 long prompts, with "
            "the KL divergence)."
        ),
        "",
        table(result["quantized"]),
        "",
        (
            f"Speculative decoding: prompt lookup (`PromptLookupDrafter()`: n-grams of "
            f"3 down to 2 tokens), k = {K}, against `generate` and transformers' "
            "`generate` (with and without `prompt_lookup_num_tokens`, whose n-grams go "
            "down to 1 token), side by side, on one torch thread and on all cores."
        ),
        "",
        table(result["speculative"]),
        "",
    ]
