"""serving: continuous batching over a paged pool gives each request the tokens of
``generate`` on its prompt alone, with a pool too small to hold them all at once,
and with a shared system prompt computed once; bad inputs."""

import pytest
import torch

from transformer_course.decoding import generate
from transformer_course.paged_cache import BlockPool
from transformer_course.serving import serve

param = pytest.mark.parametrize


@pytest.fixture(scope="module")
def model(tiny_lm):
    return tiny_lm()


def _prompts(lengths, seed=1, prefix=()):
    g = torch.Generator().manual_seed(seed)
    return [
        list(prefix) + torch.randint(1, 40, (n,), generator=g).tolist() for n in lengths
    ]


def _alone(model, prompt, n, eos=None):
    out = generate(model, torch.tensor([prompt]), n, eos_token_id=eos)[0, len(prompt) :]
    return out.tolist()


@param("max_batch", [None, 2])
def test_each_request_gets_what_it_would_alone(model, max_batch):
    prompts = _prompts((3, 11, 1, 7, 16))
    pool = BlockPool.for_model(model, n_blocks=10, block_size=4)  # not all at once
    res = serve(model, prompts, 6, pool=pool, max_batch=max_batch)
    assert res.outputs == [_alone(model, p, 6) for p in prompts]
    assert res.peak_blocks <= 10 and pool.n_used == 0  # every block handed back
    assert res.computed_tokens == sum(map(len, prompts)) and res.shared_tokens == 0
    held_at_once = sum(-(-(len(p) + 6) // 4) for p in prompts)
    assert held_at_once > 10  # so blocks freed by finished requests were reused


def test_a_stop_token_ends_a_request_and_frees_its_blocks(model):
    prompts = _prompts((5, 9))
    free_run = serve(model, prompts, 8, pool=BlockPool.for_model(model, n_blocks=8))
    eos = free_run.outputs[0][2]  # a token request 0 produces third
    res = serve(
        model, prompts, 8, pool=BlockPool.for_model(model, n_blocks=8), eos_token_id=eos
    )
    assert res.outputs[0] == free_run.outputs[0][: free_run.outputs[0].index(eos) + 1]
    assert res.outputs == [_alone(model, p, 8, eos) for p in prompts]


def test_a_shared_system_prompt_is_computed_once(model):
    system = _prompts((13,), seed=2)[0]
    prompts = _prompts((2, 6, 4), seed=3, prefix=system)
    pool = BlockPool.for_model(model, n_blocks=16, block_size=4, prefix_caching=True)
    res = serve(model, prompts, 5, pool=pool)
    assert res.outputs == [_alone(model, p, 5) for p in prompts]
    assert res.shared_tokens == 2 * 12  # three full blocks of the 13 system tokens
    assert res.computed_tokens == sum(map(len, prompts)) - res.shared_tokens
    plain = serve(model, prompts, 5, pool=BlockPool.for_model(model, n_blocks=16))
    assert plain.outputs == res.outputs and plain.shared_tokens == 0
    assert plain.steps == res.steps - 1  # the two that share waited one step
    again = serve(model, prompts, 5, pool=pool)  # the pool still holds every block:
    full = sum(
        (len(p) - 1) // 4 * 4 for p in prompts
    )  # all full ones, but the last token
    assert again.outputs == res.outputs and again.shared_tokens == full


def test_bad_inputs_raise_clear_errors(model):
    pool = BlockPool.for_model(model, n_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        serve(model, [[1], []], 2, pool=pool)
    with pytest.raises(
        ValueError, match="request 0 needs 3 blocks of 4 tokens, the pool has 2"
    ):
        serve(model, [[1] * 7], 3, pool=pool)
    with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 1"):
        serve(model, [[1]], 0, pool=pool)
    with pytest.raises(TypeError, match="max_batch: expected an int"):
        serve(model, [[1]], 1, pool=pool, max_batch=1.5)
