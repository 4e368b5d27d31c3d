"""A paged KV cache: one pool of fixed-size blocks, a block table per sequence, and
blocks shared between prompts that start the same way.

Built in chapter 11 ("Serving"). Shape letters: B batch (the running sequences),
H_kv key/value heads, T new tokens this step, S keys read this step, d head size,
N blocks in the pool, b block size (tokens per block).

The preallocated ``KVCache`` of chapter 7 reserves ``max_len`` tokens for every
request, although most requests end far earlier: that reservation is memory no other
request can use. PagedAttention (Kwon et al. 2023) stores keys and values in blocks of
b tokens taken from one pool shared by all requests, the way an operating system pages
memory: a sequence's *block table* lists its blocks in order, token j lives in block
``table[j // b]`` at offset ``j % b``, a block is taken only when the previous one is
full, and a finished sequence hands its blocks back. A sequence then holds at most
b - 1 unused slots.

Prefix caching (vLLM's automatic prefix caching; SGLang's RadixAttention, Zheng et al.
2024) shares blocks between sequences: a *full* block is named by a hash of its tokens
and of every token before it (a chain: the block's hash covers its whole prefix), and a
new prompt whose first blocks have hashes already in the pool reads those blocks
instead of computing them again; a reference count says how many sequences read a
block. Only full blocks are shared and a full block is never written again, so no
copy-on-write is needed. A freed block keeps its contents and its hash until the pool
hands it out again (least recently freed first), so a prompt that arrives after an
earlier one ended still finds its prefix.

The attention layers are unchanged: ``PagedKVCache.layers`` are the ``caches`` of a
``DecoderOnlyLM``. Each step ``prepare`` lays the batch out left-padded (row b's keys
right-aligned in S slots, an ``attention_mask`` marking them), and each layer's
``update`` writes the new keys and values into the pool and *gathers* all of the row's
keys and values through its block table. A fused kernel (vLLM's) reads the blocks
inside the attention instead of gathering; the numbers are the same.

Sources: Kwon et al. 2023, "Efficient Memory Management for Large Language Model
Serving with PagedAttention", sections 4.1-4.4 (blocks, block tables, sharing);
vLLM's design document "Automatic Prefix Caching" (hash of a block's tokens and its
prefix, LRU eviction of free blocks); Zheng et al. 2024, "SGLang", section 3.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass

import torch

from transformer_course import _validation

Tensor = torch.Tensor


def block_hash(parent: bytes, tokens: list[int]) -> bytes:
    """The name of a full block: SHA-256 of the previous block's name and this block's
    token ids, so equal names mean equal prefixes. A cryptographic hash, not Python's
    ``hash``: with Python 3.12's predictable ``hash(None)`` a crafted prompt could
    make one request read another's cache (vLLM advisory GHSA-rm76-4mrf-v9r8, PR 12621;
    SHA-256 the default since vLLM 0.10.2)."""
    return hashlib.sha256(parent + struct.pack(f"<{len(tokens)}q", *tokens)).digest()


class BlockPool:
    """The physical memory of a paged KV cache: ``n_blocks`` blocks of ``block_size``
    tokens for every layer, handed out and taken back.

    ``k[layer]`` and ``v[layer]``: (N, H_kv, b, d) tensors of ``dtype`` (zeros at
    first). ``allocate()`` takes the least recently freed block (dropping its hash),
    ``retain(block)`` adds a reader, ``release(block)`` removes one (at zero readers the
    block is free again but keeps its contents and hash). ``bytes_in_use`` counts the
    blocks some sequence holds.

    Args:
        n_layers, n_kv_heads, head_dim: the model's (``cfg.n_layers``, ``n_kv_heads``,
            ``d_k``). n_blocks: blocks in the pool. block_size: tokens a block holds
            (vLLM's default is 16). prefix_caching: name full blocks by their hash so
            later prompts can share them (vLLM's ``enable_prefix_caching``).

    Raises:
        TypeError / ValueError: sizes that are not ints >= 1.
        RuntimeError: ``allocate`` with no free block (vLLM would preempt a request).
    """

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        n_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device=None,
        prefix_caching: bool = False,
    ):
        sizes = (n_layers, n_kv_heads, head_dim, n_blocks, block_size)
        names = ("n_layers", "n_kv_heads", "head_dim", "n_blocks", "block_size")
        for name, value in zip(names, sizes):
            _validation.positive_int(name, value)
        self.n_layers, self.n_blocks, self.block_size = n_layers, n_blocks, block_size
        self.prefix_caching = prefix_caching
        shape = (n_blocks, n_kv_heads, block_size, head_dim)  # (N, H_kv, b, d)
        self.k = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)
        ]
        self.v = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)
        ]
        self.refs = [0] * n_blocks  # readers of each block
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(n_blocks))
        self.hash_of: dict[int, bytes] = {}  # full block -> its name
        self.block_of: dict[bytes, int] = {}  # name -> block
        self.peak_used = 0

    @classmethod
    def for_model(cls, model, n_blocks: int, **kwargs) -> BlockPool:
        """A pool shaped for a ``DecoderOnlyLM`` (its layers, key/value heads, d_k, and
        the dtype and device of its weights)."""
        cfg, w = model.cfg, model.out.weight
        kwargs = {"dtype": w.dtype, "device": w.device, **kwargs}
        n_kv = cfg.n_kv_heads or cfg.n_heads
        return cls(cfg.n_layers, n_kv, cfg.d_k, n_blocks=n_blocks, **kwargs)

    @property
    def n_used(self) -> int:
        return self.n_blocks - len(self.free)

    @property
    def bytes_per_block(self) -> int:
        """Keys and values of b tokens in every layer."""
        return 2 * self.n_layers * self.k[0][0].numel() * self.k[0].element_size()

    @property
    def bytes_in_use(self) -> int:
        return self.n_used * self.bytes_per_block

    def allocate(self) -> int:
        if not self.free:
            raise RuntimeError(
                f"BlockPool: all {self.n_blocks} blocks are in use; free a sequence "
                "or make a larger pool"
            )
        block, _ = self.free.popitem(last=False)  # least recently freed
        name = self.hash_of.pop(block, None)
        if name is not None and self.block_of.get(name) == block:
            del self.block_of[name]  # evicted: its old contents are overwritten
        self.refs[block] = 1
        self.peak_used = max(self.peak_used, self.n_used)
        return block

    def retain(self, block: int) -> None:
        self.free.pop(block, None)  # a cached free block is in use again
        self.refs[block] += 1
        self.peak_used = max(self.peak_used, self.n_used)

    def release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free[block] = None  # the most recently freed, evicted last

    def name(self, block: int, name: bytes) -> None:
        """Record that full ``block`` holds the prefix called ``name``."""
        if self.prefix_caching and name not in self.block_of:
            self.block_of[name] = block
            self.hash_of[block] = name


@dataclass
class _Step:
    """Where one forward pass writes and reads: tensors of pool indices."""

    T: int  # new tokens a row (the longest row's)
    S: int  # keys a row reads
    write: tuple[Tensor, Tensor, Tensor, Tensor]  # row, chunk index, block, offset (n,)
    read: tuple[Tensor, Tensor]  # block, offset (B, S)


class PagedKVCache:
    """Sequences stored in a ``BlockPool``: a block table and the token ids of each.

    Use: ``seq, n_cached = cache.add_sequence(prompt)`` (the first ``n_cached`` prompt
    tokens were found in the pool: their blocks are shared), then each step
    ``ids, mask = cache.prepare(seqs, new_tokens)`` and ``model(ids,
    attention_mask=mask, caches=cache.layers)``; ``cache.free(seq)`` when a sequence
    ends. ``prepare`` allocates the blocks the new tokens need; the forward pass that
    follows writes them (one forward pass per ``prepare``).

    Shapes: ``prepare`` returns ids (B, T) long, the new tokens of row b right-aligned
    (``pad_id`` before them), and an attention mask (B, S) bool, True on row b's last
    ``length_b`` slots, where T is the most new tokens of a row and S the most tokens
    of a row after this step. ``layers[i].update(k, v)``: k, v (B, H_kv, T, d) ->
    (B, H_kv, S, d), row b's keys in token order in its last slots; ``length`` = S - T.

    Raises:
        KeyError: an unknown or freed sequence id.
        ValueError: ``prepare`` with an empty list of new tokens for a row, rows and
            token lists of different lengths, a sequence twice; ``update`` with k, v
            not (B, H_kv, T, d) of the pool's dtype.
        RuntimeError: the pool has too few free blocks for the step (nothing changes).
    """

    def __init__(self, pool: BlockPool, pad_id: int = 0):
        self.pool, self.pad_id = pool, pad_id
        self.block_tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}  # ids whose keys and values are stored
        self._names: dict[int, list[bytes]] = {}  # names of each sequence's full blocks
        self._next_id = 0
        self._step: _Step | None = None
        self.layers = [PagedLayerCache(self, i) for i in range(pool.n_layers)]

    def add_sequence(self, prompt: list[int] | None = None) -> tuple[int, int]:
        """A new sequence; with prefix caching, the longest run of full prompt blocks
        found in the pool is shared (leaving at least one prompt token to compute,
        whose logits predict the first new token). Returns (id, tokens shared)."""
        seq, self._next_id = self._next_id, self._next_id + 1
        table, names, bs = [], [], self.pool.block_size
        name = b""
        if prompt is not None and self.pool.prefix_caching:
            while (len(table) + 1) * bs < len(
                prompt
            ):  # a full block, not the last token
                start = len(table) * bs
                name = block_hash(name, list(prompt[start : start + bs]))
                block = self.pool.block_of.get(name)
                if block is None:
                    break
                self.pool.retain(block)
                table.append(block)
                names.append(name)
        self.block_tables[seq], self._names[seq] = table, names
        self.tokens[seq] = list(prompt[: len(table) * bs]) if table else []
        return seq, len(self.tokens[seq])

    def free(self, seq: int) -> None:
        """End a sequence: its blocks lose a reader (free at none)."""
        for block in self.block_tables.pop(seq):
            self.pool.release(block)
        del self.tokens[seq], self._names[seq]

    def prepare(
        self, seqs: list[int], new_tokens: list[list[int]]
    ) -> tuple[Tensor, Tensor]:
        if len(seqs) != len(new_tokens) or len(set(seqs)) != len(seqs):
            raise ValueError(
                f"seqs, new_tokens: expected distinct sequences, one token list each, "
                f"got {len(seqs)} sequences ({len(set(seqs))} distinct) and "
                f"{len(new_tokens)} lists"
            )
        for seq, new in zip(seqs, new_tokens):
            if seq not in self.tokens:
                raise KeyError(f"seqs: no sequence {seq} (never added, or freed)")
            if len(new) == 0:
                raise ValueError(f"new_tokens: sequence {seq} got no new token")
        bs, pool = self.pool.block_size, self.pool
        past = [len(self.tokens[s]) for s in seqs]
        total = [p + len(n) for p, n in zip(past, new_tokens)]
        need = sum(-(-t // bs) - len(self.block_tables[s]) for s, t in zip(seqs, total))
        if need > len(pool.free):
            raise RuntimeError(
                f"BlockPool: the step needs {need} free blocks, {len(pool.free)} are free"
            )
        T, S = max(len(n) for n in new_tokens), max(total)
        dev = pool.k[0].device
        ids = torch.full((len(seqs), T), self.pad_id, dtype=torch.long)
        write: list[list[int]] = [[], [], [], []]
        read_block = torch.zeros((len(seqs), S), dtype=torch.long)  # pads: block 0,
        read_off = torch.zeros((len(seqs), S), dtype=torch.long)  # offset 0 (finite)
        for b, (seq, new) in enumerate(zip(seqs, new_tokens)):
            table = self.block_tables[seq]
            while len(table) * bs < total[b]:
                table.append(pool.allocate())
            ids[b, T - len(new) :] = torch.tensor(new)
            for m, j in enumerate(range(past[b], total[b])):  # token j of the sequence
                for lst, x in zip(write, (b, T - len(new) + m, table[j // bs], j % bs)):
                    lst.append(x)
            j = torch.arange(total[b])
            read_block[b, S - total[b] :] = torch.tensor(table)[j // bs]
            read_off[b, S - total[b] :] = j % bs
            self.tokens[seq].extend(new)
            self._name_full_blocks(seq)
        mask = torch.arange(S)[None, :] >= S - torch.tensor(total)[:, None]  # (B, S)
        w = tuple(torch.tensor(x, dtype=torch.long, device=dev) for x in write)
        self._step = _Step(T, S, w, (read_block.to(dev), read_off.to(dev)))
        return ids.to(dev), mask.to(dev)

    def _name_full_blocks(self, seq: int) -> None:
        names, toks, bs = self._names[seq], self.tokens[seq], self.pool.block_size
        while (len(names) + 1) * bs <= len(toks):
            i = len(names)
            names.append(
                block_hash(names[-1] if names else b"", toks[i * bs : (i + 1) * bs])
            )
            self.pool.name(self.block_tables[seq][i], names[-1])

    def gather(self, layer: int, seq: int) -> tuple[Tensor, Tensor]:
        """The stored keys and values of one sequence, (H_kv, length, d) each, read
        through its block table (what the attention of that sequence sees)."""
        table, n, bs = (
            self.block_tables[seq],
            len(self.tokens[seq]),
            self.pool.block_size,
        )
        j = torch.arange(n, device=self.pool.k[0].device)
        blocks = torch.tensor(table, dtype=torch.long, device=j.device)[j // bs]
        k = self.pool.k[layer][blocks, :, j % bs]  # (length, H_kv, d)
        return k.transpose(0, 1), self.pool.v[layer][blocks, :, j % bs].transpose(0, 1)


class PagedLayerCache:
    """One layer's view of a ``PagedKVCache``: the ``KVCacheLike`` that
    ``MultiHeadAttention`` calls (see ``PagedKVCache`` for the shapes)."""

    def __init__(self, cache: PagedKVCache, layer: int):
        self.cache, self.layer = cache, layer

    @property
    def length(self) -> int:
        step = self.cache._step
        return 0 if step is None else step.S - step.T

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        step, pool = self.cache._step, self.cache.pool
        if step is None:
            raise ValueError(
                "update: call PagedKVCache.prepare before the forward pass"
            )
        pk, pv = pool.k[self.layer], pool.v[self.layer]  # (N, H_kv, b, d)
        want = (len(step.read[0]), pk.shape[1], step.T, pk.shape[3])
        if k.shape != want or v.shape != want or k.dtype != pk.dtype:
            raise ValueError(
                f"k, v: expected {want} of {pk.dtype} (the prepared step), got "
                f"{tuple(k.shape)}, {tuple(v.shape)} of {k.dtype}"
            )
        row, t, block, off = step.write
        pk[block, :, off] = k.transpose(1, 2)[
            row, t
        ]  # (n, H_kv, d): the real new tokens
        pv[block, :, off] = v.transpose(1, 2)[row, t]
        block, off = step.read
        keys = pk[block, :, off].transpose(1, 2)  # (B, S, H_kv, d) -> (B, H_kv, S, d)
        return keys, pv[block, :, off].transpose(1, 2)


def preallocated_bytes(pool: BlockPool, n_requests: int, max_len: int) -> int:
    """What chapter 7's preallocated cache reserves for ``n_requests`` of up to
    ``max_len`` tokens each, in the pool's layers, heads and dtype (for comparison
    with ``pool.bytes_in_use`` or ``pool.peak_used * pool.bytes_per_block``)."""
    _validation.positive_int("n_requests", n_requests, 0)
    _validation.positive_int("max_len", max_len)
    return n_requests * max_len * pool.bytes_per_block // pool.block_size
