"""paged_cache: a batch of varied lengths read through block tables gives the logits
of each sequence alone with chapter 7's contiguous cache; freed blocks are reused;
shared prefix blocks change no logits; the pool's bytes; bad inputs."""

import inspect
import os
import subprocess
import sys

import pytest
import torch

from transformer_course.decoding import new_caches
from transformer_course.exercises import pitfalls
from transformer_course.kv_cache import KVCache
from transformer_course.paged_cache import (
    BlockPool,
    PagedKVCache,
    block_hash,
    preallocated_bytes,
)

param = pytest.mark.parametrize
LENGTHS = (3, 9, 14, 1)  # prompts shorter than, equal to and across blocks of 4


def _model(tiny_lm, positional="rope", **kw):
    return tiny_lm(positional=positional, scale_embeddings=False, **kw)


def _prompts(lengths=LENGTHS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 40, (n,), generator=g).tolist() for n in lengths]


def _contiguous(model, prompt, new):
    """Logits of the prompt and then of each token of ``new``, one at a time, with
    a preallocated KVCache of one sequence: (len(prompt) + len(new), V)."""
    caches = new_caches(model, 48)
    out = [model(torch.tensor([prompt]), caches=caches)[0]]
    for t in new:
        out.append(model(torch.tensor([[t]]), caches=caches)[0])
    return torch.cat(out)


def _paged(model, pool, prompts, n_steps, corrupt=None):
    """Prefill every prompt in one batch, then ``n_steps`` greedy steps of all rows;
    returns each row's logits at its real positions and the tokens it produced."""
    cache = PagedKVCache(pool)
    seqs = [cache.add_sequence()[0] for _ in prompts]
    logits = [[] for _ in prompts]
    new = [list(p) for p in prompts]
    produced = [[] for _ in prompts]
    for step in range(n_steps + 1):
        ids, mask = cache.prepare(seqs, new)
        out = model(ids, attention_mask=mask, caches=cache.layers)  # (B, T, V)
        for b, tokens in enumerate(new):
            logits[b].append(out[b, out.shape[1] - len(tokens) :])
        new = [[int(out[b, -1].argmax())] for b in range(len(prompts))]
        for b, t in enumerate(new):
            produced[b] += t
        if corrupt is not None and step == 0:
            corrupt(cache, seqs)
    return [torch.cat(rows) for rows in logits], produced, cache, seqs


@param("positional", ["rope", "alibi", "learned"])
@torch.no_grad()
def test_paged_equals_contiguous_for_a_batch_of_varied_lengths(tiny_lm, positional):
    model = _model(tiny_lm, positional)
    prompts = _prompts()
    pool = BlockPool.for_model(model, n_blocks=24, block_size=4)
    logits, produced, cache, seqs = _paged(model, pool, prompts, n_steps=6)
    for b, prompt in enumerate(prompts):
        ref = _contiguous(model, prompt, produced[b][:-1])
        assert logits[b].shape == ref.shape
        assert torch.allclose(logits[b], ref, atol=1e-5, rtol=0), b
        # the sequence's keys, read through its block table, are its own
        k, _ = cache.gather(0, seqs[b])
        assert k.shape[1] == len(prompt) + 6
    held = sum(-(-(n + 6) // 4) for n in LENGTHS)  # blocks: ceil(tokens / b)
    assert pool.n_used == held
    assert pool.bytes_in_use == held * pool.bytes_per_block


@torch.no_grad()
def test_an_off_by_one_block_table_gives_different_logits(tiny_lm):
    model = _model(tiny_lm)
    prompts = _prompts()
    pool = BlockPool.for_model(model, n_blocks=24, block_size=4)

    def shift(cache, seqs):  # known wrong: row 2 reads its blocks one place late
        table = cache.block_tables[seqs[2]]
        table[:] = table[1:] + table[:1]

    logits, produced, _, _ = _paged(model, pool, prompts, n_steps=2, corrupt=shift)
    ref = _contiguous(model, prompts[2], produced[2][:-1])
    assert (logits[2][-2:] - ref[-2:]).abs().max() > 1e-3
    for b in (0, 1, 3):  # the other rows are untouched
        ref = _contiguous(model, prompts[b], produced[b][:-1])
        assert torch.allclose(logits[b], ref, atol=1e-5, rtol=0)


def test_freed_blocks_are_reused_least_recently_freed_first(tiny_lm):
    pool = BlockPool.for_model(_model(tiny_lm), n_blocks=6, block_size=4)
    cache = PagedKVCache(pool)
    a, _ = cache.add_sequence()
    b, _ = cache.add_sequence()
    cache.prepare([a, b], [[1] * 9, [2] * 5])  # 3 + 2 blocks of 6
    taken = cache.block_tables[a] + cache.block_tables[b]
    assert sorted(taken) == [0, 1, 2, 3, 4] and pool.n_used == 5
    with pytest.raises(RuntimeError, match="needs 2 free blocks, 1 are free"):
        c, _ = cache.add_sequence()
        cache.prepare([c], [[3] * 8])
    assert pool.n_used == 5 and cache.block_tables[c] == []  # nothing changed
    cache.free(a)
    assert pool.n_used == 2 and pool.bytes_in_use == 2 * pool.bytes_per_block
    cache.prepare([c], [[3] * 8])  # block 5 (never used) first, then a's first block
    assert cache.block_tables[c] == [5, taken[0]]
    assert pool.peak_used == 5


def test_preallocated_bytes_are_what_kv_cache_allocates(tiny_lm):
    model = _model(tiny_lm)
    pool = BlockPool.for_model(model, n_blocks=8, block_size=4)
    caches = [KVCache(48, grow=False) for _ in model.layers]
    ids = torch.ones((len(LENGTHS), 1), dtype=torch.long)
    with torch.no_grad():
        model(ids, caches=caches)
    allocated = sum(c._k.nbytes + c._v.nbytes for c in caches)
    assert preallocated_bytes(pool, len(LENGTHS), 48) == allocated
    with pytest.raises(ValueError, match="max_len"):
        preallocated_bytes(pool, 2, 0)


def _serve_prefix(model, pool, prompts):
    """Each prompt in turn (the earlier ones' blocks named), logits of its last token."""
    cache, out, shared = PagedKVCache(pool), [], []
    for prompt in prompts:
        seq, n = cache.add_sequence(prompt)
        ids, mask = cache.prepare([seq], [prompt[n:]])
        out.append(model(ids, attention_mask=mask, caches=cache.layers)[0, -1])
        shared.append(n)
        cache.free(seq)
    return out, shared


@torch.no_grad()
def test_a_shared_prefix_is_computed_once_and_changes_no_logits(tiny_lm):
    model = _model(tiny_lm)
    system = _prompts((10,), seed=2)[0]
    prompts = [system + tail for tail in _prompts((3, 6, 1), seed=3)] + [system[:8]]
    pool = BlockPool.for_model(model, n_blocks=12, block_size=4, prefix_caching=True)
    out, shared = _serve_prefix(model, pool, prompts)
    assert shared == [0, 8, 8, 4]  # full blocks only, and never the last token
    for logits, prompt in zip(out, prompts):
        ref = model(torch.tensor([prompt]))[0, -1]
        assert torch.allclose(logits, ref, atol=1e-5, rtol=0)
    assert pool.n_used == 0 and len(pool.block_of) > 0  # free, and still named


def _share_then_overwrite(model, pool, system, tails):
    """A computes the system prompt; B shares its blocks; A ends; C takes free blocks;
    then B's next-token logits."""
    cache = PagedKVCache(pool)
    a, _ = cache.add_sequence(system + tails[0])
    ids, mask = cache.prepare([a], [system + tails[0]])
    model(ids, attention_mask=mask, caches=cache.layers)
    b, n = cache.add_sequence(system + tails[1])
    assert n == 8
    cache.free(a)
    c, _ = cache.add_sequence()
    n = 4 * (len(pool.free) - 1)  # every free block but one, which B needs
    ids, mask = cache.prepare([c], [(tails[2] * 4)[:n]])
    model(ids, attention_mask=mask, caches=cache.layers)
    ids, mask = cache.prepare([b], [tails[1]])
    return model(ids, attention_mask=mask, caches=cache.layers)[0, -1]


@torch.no_grad()
def test_a_shared_block_without_a_reference_count_is_overwritten(tiny_lm, monkeypatch):
    model = _model(tiny_lm)
    system = _prompts((8,), seed=2)[0]
    tails = _prompts((2, 3, 5), seed=6)
    ref = model(torch.tensor([system + tails[1]]))[0, -1]
    pool = BlockPool.for_model(model, n_blocks=6, block_size=4, prefix_caching=True)
    right = _share_then_overwrite(model, pool, system, tails)
    assert torch.allclose(right, ref, atol=1e-5, rtol=0)

    def forgetful(self, block):  # known wrong: B reads the block, nobody counts it
        self.free.pop(block, None)

    monkeypatch.setattr(BlockPool, "retain", forgetful)
    pool = BlockPool.for_model(model, n_blocks=6, block_size=4, prefix_caching=True)
    wrong = _share_then_overwrite(model, pool, system, tails)
    assert (wrong - ref).abs().max() > 1e-3


def test_bad_inputs_raise_clear_errors(tiny_lm):
    model = _model(tiny_lm)
    with pytest.raises(TypeError, match="block_size: expected an int"):
        BlockPool(2, 2, 8, n_blocks=4, block_size=2.0)
    with pytest.raises(ValueError, match="n_blocks: expected an int >= 1"):
        BlockPool(2, 2, 8, n_blocks=0)
    pool = BlockPool.for_model(model, n_blocks=4, block_size=4)
    cache = PagedKVCache(pool)
    seq, _ = cache.add_sequence()
    with pytest.raises(KeyError, match="no sequence 7"):
        cache.prepare([7], [[1]])
    with pytest.raises(ValueError, match="sequence 0 got no new token"):
        cache.prepare([seq], [[]])
    with pytest.raises(ValueError, match="distinct sequences"):
        cache.prepare([seq, seq], [[1], [2]])
    with pytest.raises(ValueError, match="call PagedKVCache.prepare"):
        cache.layers[0].update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    cache.prepare([seq], [[1, 2]])
    with pytest.raises(ValueError, match=r"expected \(1, 2, 2, 8\) of torch.float32"):
        cache.layers[0].update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))


# -- prefix-cache block names: pitfall P19 ----------------------------------------
# Prefix-cache block names (pitfall P19, chapter 11, from a public report): vLLM named a
# full block with Python's ``hash((parent, tuple(tokens)))`` until advisory
# GHSA-rm76-4mrf-v9r8 (PR 12621; SHA-256 the default since vLLM 0.10.2). Known wrong:
# ``pitfalls.block_name_builtin_hash``, whose names are the same in every process (so an
# attacker can search for a collision offline) and whose parent enters the name only
# modulo 2^61 - 1 (two different prefixes, one child name). Known right:
# ``paged_cache.block_hash``, SHA-256 of the parent's name and the token ids.

MODULUS = 2**61 - 1  # CPython hashes an int modulo this (sys.hash_info.modulus)
TOKENS = [17, 4, 29, 8]


def _in_fresh_interpreter(expression: str, seed: int) -> str:
    """``expression`` evaluated by a new Python (no torch) under PYTHONHASHSEED=seed,
    with the pitfall's code defined."""
    code = inspect.getsource(pitfalls.block_name_builtin_hash)
    script = "from __future__ import annotations\n" + code + f"\nprint({expression})"
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_builtin_hash_names_are_the_same_in_every_process():
    """The hash seed randomises str and bytes, never ints or tuples of ints: a block
    after a known parent gets the same name in every server (and, from Python 3.12 on,
    where ``hash(None)`` is a constant, so does every first block)."""
    name = "block_name_builtin_hash(12345, [17, 4, 29, 8])"
    assert _in_fresh_interpreter(name, 1) == _in_fresh_interpreter(name, 2)
    # known wrong for the comparison: the seed was in effect (a str's hash moved)
    assert _in_fresh_interpreter("hash('x')", 1) != _in_fresh_interpreter(
        "hash('x')", 2
    )
    if sys.version_info >= (3, 12):
        first = "block_name_builtin_hash(None, [17, 4, 29, 8])"
        assert _in_fresh_interpreter(first, 1) == _in_fresh_interpreter(first, 2)


def _two_parents() -> tuple[int, int]:
    """Two different names a parent block can have (both 64-bit hashes) that CPython
    hashes alike: they differ by 2^61 - 1."""
    parent = pitfalls.block_name_builtin_hash(None, [3, 1, 4, 1])
    return parent, _same_hash(parent)


def _same_hash(name: int) -> int:
    """Another 64-bit int of the same sign whose CPython hash equals ``name``'s: away
    from zero by 2^61 - 1 where there is room, else towards it."""
    sign = -1 if name < 0 else 1
    step = MODULUS if abs(name) + MODULUS < 2**63 else -MODULUS
    other = name + sign * step
    assert other != name and -(2**63) <= other < 2**63 and hash(other) == hash(name)
    return other


def test_builtin_hash_names_collide_for_different_prefixes():
    """The same block after two different prefixes gets one name: a pool keyed by it
    hands the second sequence the first one's keys and values."""
    assert sys.hash_info.modulus == MODULUS
    parent, other = _two_parents()
    a = pitfalls.block_name_builtin_hash(parent, TOKENS)
    b = pitfalls.block_name_builtin_hash(other, TOKENS)
    assert a == b
    for name in (parent, 7, -7, 2**63 - 9, -(2**63) + 9):  # whatever the root's hash
        assert pitfalls.block_name_builtin_hash(
            name, TOKENS
        ) == pitfalls.block_name_builtin_hash(_same_hash(name), TOKENS)
    block_of = {a: 5}  # the pool's table: name -> block
    assert block_of.get(b) == 5  # the other prefix reads block 5, computed for `parent`


def test_sha256_names_keep_the_two_prefixes_apart():
    parent, other = _two_parents()
    as_bytes = [x.to_bytes(8, "little", signed=True) for x in (parent, other)]
    a, b = (block_hash(p, TOKENS) for p in as_bytes)
    assert a != b and len(a) == 32
    # the same inputs give the same name (a cache needs that), other tokens another
    assert block_hash(as_bytes[0], TOKENS) == a
    assert block_hash(as_bytes[0], [*TOKENS[:-1], TOKENS[-1] + 1]) != a


def test_the_pool_shares_a_block_only_after_the_same_prefix():
    """The chained names at work in ``PagedKVCache``: a second prompt with the same
    second block but another first block shares nothing; one with the same first
    block shares it (known right and known wrong in one pool)."""
    pool = BlockPool(1, 1, 2, n_blocks=8, block_size=4, prefix_caching=True)
    cache = PagedKVCache(pool)
    first = [3, 1, 4, 1, *TOKENS, 9]
    seq, shared = cache.add_sequence(first)
    assert shared == 0
    cache.prepare([seq], [first])  # names its two full blocks
    _, shared = cache.add_sequence([2, 7, 1, 8, *TOKENS, 9])
    assert shared == 0
    _, shared = cache.add_sequence([3, 1, 4, 1, *TOKENS, 5])
    assert shared == 8
