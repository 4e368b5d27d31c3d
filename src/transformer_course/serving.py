"""Serving many requests from one paged KV cache: continuous batching, greedy.

Built in chapter 11 ("Serving"). A request joins the running batch as soon as the pool
has room for it (continuous, or iteration-level, batching: Yu et al. 2022, Orca,
section 3.1) and leaves it, handing its blocks back, the step it ends; one forward pass
computes the prompts of the requests that just joined and the next token of every
other one (``PagedKVCache.prepare`` lays out rows of different lengths). With a pool
made with ``prefix_caching=True`` a prompt whose first blocks are already in the pool
(a shared system prompt, a request seen before) computes only the rest.

Sources: Kwon et al. 2023 (PagedAttention, vLLM), sections 4.2-4.5; Yu et al. 2022,
"Orca: A Distributed Serving System for Transformer-Based Generative Models", 3.1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import torch

from transformer_course import _validation
from transformer_course.paged_cache import BlockPool, PagedKVCache, block_hash
from transformer_course.training import in_eval_mode


@dataclass
class ServeResult:
    """What ``serve`` returns: ``outputs[r]`` the new token ids of request r (up to and
    including a stop token); ``computed_tokens`` prompt tokens run through the model;
    ``shared_tokens`` prompt tokens read from shared blocks instead; ``steps`` forward
    passes; ``peak_blocks`` the most blocks in use at once."""

    outputs: list[list[int]]
    computed_tokens: int
    shared_tokens: int
    steps: int
    peak_blocks: int


def _blocks(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


def _first_block_name(prompt: list[int], pool: BlockPool) -> bytes | None:
    """The name of the prompt's first block if it could be shared, else None."""
    if not pool.prefix_caching or len(prompt) <= pool.block_size:
        return None
    return block_hash(b"", list(prompt[: pool.block_size]))


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def serve(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    pool: BlockPool,
    max_batch: int | None = None,
    eos_token_id: int | Collection[int] | None = None,
) -> ServeResult:
    """Greedy continuations of ``prompts`` with a ``DecoderOnlyLM`` whose keys and values
    live in ``pool``: each request's tokens equal ``decoding.generate`` on its prompt
    alone (up to float rounding in the last digits, 1e-5 in float32).

    Requests are admitted in order, while the running batch has fewer than
    ``max_batch`` rows and the pool's free blocks cover the worst case of every running
    request and the new one (prompt + ``max_new_tokens``): no step can run out of
    blocks, so no request is ever preempted. A request whose first block is being
    computed for another request this step waits one step and then shares it (a block
    is named in the step that fills it), so requests that share a system prompt compute
    it once.

    Args:
        model: a ``DecoderOnlyLM``. prompts: lists of token ids, each non-empty.
        max_new_tokens: tokens to add to each request (>= 1).
        pool: a ``BlockPool`` for the model (``BlockPool.for_model``); it may hold
            named blocks from earlier calls, which prompts then share.
        max_batch: most requests running at once (default: no limit but the pool).
        eos_token_id: a stop id or several; a request ends on one (it is kept).

    Returns:
        A ``ServeResult``.

    Raises:
        TypeError / ValueError: a bad ``max_new_tokens``, ``max_batch`` or
            ``eos_token_id``, an empty prompt, or a request that needs more blocks
            than the whole pool has.
    """
    _validation.positive_int("max_new_tokens", max_new_tokens)
    if max_batch is not None:
        _validation.positive_int("max_batch", max_batch)
    stop = set()
    if eos_token_id is not None:
        _validation.token_id_set("eos_token_id", eos_token_id)
        stop = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    bs = pool.block_size
    for r, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(
                f"prompts: expected non-empty token lists, prompt {r} is empty"
            )
        if _blocks(len(prompt) + max_new_tokens, bs) > pool.n_blocks:
            raise ValueError(
                f"prompts: request {r} needs {_blocks(len(prompt) + max_new_tokens, bs)}"
                f" blocks of {bs} tokens, the pool has {pool.n_blocks}"
            )
    cache = PagedKVCache(pool, pad_id=model.cfg.pad_id)
    waiting = deque(range(len(prompts)))
    running: dict[int, int] = {}  # request -> sequence
    pending: dict[int, list[int]] = {}  # request -> tokens to feed next step
    outputs: list[list[int]] = [[] for _ in prompts]
    computed = shared = steps = 0
    pool.peak_used = pool.n_used

    def worst_case(r: int) -> int:  # blocks request r may still take
        need = _blocks(len(prompts[r]) + max_new_tokens, bs)
        return need - len(cache.block_tables.get(running.get(r, -1), []))

    with torch.inference_mode():
        while waiting or running:
            computing: set[bytes] = set()  # first blocks computed this step
            while waiting and (max_batch is None or len(running) < max_batch):
                r = waiting[0]
                reserved = sum(worst_case(x) for x in running)
                if worst_case(r) + reserved > len(pool.free):
                    break  # wait for a running request to end
                first = _first_block_name(prompts[r], pool)
                if (
                    first is not None
                    and first in computing
                    and first not in pool.block_of
                ):
                    break  # its prefix is computed this step: share it from the next
                if first is not None:
                    computing.add(first)
                waiting.popleft()
                seq, n_shared = cache.add_sequence(prompts[r])
                running[r], pending[r] = seq, list(prompts[r][n_shared:])
                shared += n_shared
                computed += len(pending[r])
            rows = list(running)
            ids, mask = cache.prepare(
                [running[r] for r in rows], [pending[r] for r in rows]
            )
            logits = model(
                ids, attention_mask=mask, caches=cache.layers, logits_to_keep=1
            )
            steps += 1
            for r, token in zip(rows, logits[:, -1].argmax(-1).tolist()):
                outputs[r].append(token)
                if token in stop or len(outputs[r]) == max_new_tokens:
                    cache.free(running.pop(r))  # its blocks go back to the pool
                    del pending[r]
                else:
                    pending[r] = [token]
    return ServeResult(outputs, computed, shared, steps, pool.peak_used)
