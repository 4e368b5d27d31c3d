"""Prefix-cache block names (pitfall P19, chapter 11, from a public report): vLLM named a
full block with Python's ``hash((parent, tuple(tokens)))`` until advisory
GHSA-rm76-4mrf-v9r8 (PR 12621; SHA-256 the default since vLLM 0.10.2). Known wrong:
``pitfalls.block_name_builtin_hash``, whose names are the same in every process (so an
attacker can search for a collision offline) and whose parent enters the name only
modulo 2^61 - 1 (two different prefixes, one child name). Known right:
``paged_cache.block_hash``, SHA-256 of the parent's name and the token ids."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

from transformer_course.exercises import pitfalls
from transformer_course.paged_cache import BlockPool, PagedKVCache, block_hash

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
