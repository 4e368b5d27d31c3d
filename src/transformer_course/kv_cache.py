"""The KV cache: the keys and values a self-attention layer has already computed.

Derived in chapter 6 (the translator's greedy and beam search) and measured in
chapter 7 (why it must not copy itself). Shape letters: B batch, H heads (key/value
heads under grouped-query attention), S sequence length so far, d_k head size.

A decoder that feeds one new token a step attends to every earlier token's key and
value; the cache keeps them so they are computed once. How the cache *grows* matters
as much: appending with ``torch.cat`` allocates a new tensor and copies everything
so far at every step, so T steps copy 1 + 2 + ... + T rows, O(T^2) bytes, and the
cache becomes as quadratic as the recomputation it replaced. ``KVCache`` instead
preallocates a buffer and writes each step's rows in place (as Hugging Face's
``StaticCache`` does); when the buffer is full it doubles, so T steps copy fewer than
2T rows in all. ``ConcatKVCache`` keeps the copy-per-step version for the comparison
in chapter 7 and ``benchmarks/run.py``.

Sources: Pope et al. 2022, "Efficiently Scaling Transformer Inference", section 2
(the KV cache); Hugging Face ``transformers`` ``StaticCache`` (preallocated, written
in place with ``index_copy_``).
"""

from __future__ import annotations

import torch

from transformer_course import _validation

Tensor = torch.Tensor


class KVCache:
    """The keys and values a self-attention layer has seen so far, in a preallocated
    buffer written in place.

    ``update(k, v)`` writes this step's keys and values, each (B, H, S_new, d_k) (the
    values may have their own d_v), after the ``length`` tokens already cached and
    returns everything so far, (B, H, length + S_new, d_k): *views* into the buffer,
    valid until the next ``update``, ``reorder`` or ``reset`` (the attention layer
    reads them once, within the step). ``length`` counts the cached tokens.
    ``reorder(index)`` keeps batch rows ``index`` (beam search moves hypotheses
    between beams). ``reset()`` empties the cache and keeps its buffer for the next
    sequence; ``crop(n)`` keeps the first n tokens; ``k`` and ``v`` are the cached
    tensors (None when empty).

    Args:
        capacity: tokens the buffer holds before it first has to grow (default 64;
            the first ``update`` allocates at least that many, B, H and d_k come from
            it). A decoder that knows its maximum length passes it, and then the
            buffer never grows.
        grow: when a write would go past the buffer, allocate one twice as large and
            copy the cached tokens into it once (True, the default: n tokens cost
            O(n) copies in all), or raise a ValueError (False: a fixed-size cache,
            like ``StaticCache``).

    Raises:
        TypeError: a ``capacity`` that is not an int.
        ValueError: ``capacity`` < 1; in ``update``, k and v that are not 4-d or
            disagree in (B, H, S_new), or that differ from the cached tensors in
            B, H, d_k, d_v, dtype or device (a ``reset`` cache accepts new ones), or
            a write past the capacity with ``grow=False``; in ``reorder``, an index
            that is not a 1-d integer tensor of rows in [0, B).
    """

    def __init__(self, capacity: int = 64, *, grow: bool = True):
        _validation.positive_int("capacity", capacity)
        self.capacity, self.grow = capacity, grow
        self._k: Tensor | None = None  # (B, H, capacity, d_k), filled up to length
        self._v: Tensor | None = None  # (B, H, capacity, d_v)
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def k(self) -> Tensor | None:
        return None if self._length == 0 else self._k[:, :, : self._length]

    @property
    def v(self) -> Tensor | None:
        return None if self._length == 0 else self._v[:, :, : self._length]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._check(k, v)
        start, end = self._length, self._length + k.shape[2]
        if start == 0 and (self._k is None or not self._fits(k, v)):  # allocate
            size = max(self.capacity, end) if self.grow else self.capacity
            self._k = k.new_empty((*k.shape[:2], size, k.shape[3]))  # (B, H, C, d_k)
            self._v = v.new_empty((*v.shape[:2], size, v.shape[3]))  # (B, H, C, d_v)
        if end > self._k.shape[2]:
            self._enlarge(end)
        self._k[:, :, start:end] = k  # in place: no earlier row moves
        self._v[:, :, start:end] = v
        self._length = end
        return self._k[:, :, :end], self._v[:, :, :end]  # (B, H, S_past + S_new, d)

    def reorder(self, index: Tensor) -> None:
        if not (
            isinstance(index, Tensor)
            and index.dim() == 1
            and not index.is_floating_point()
        ):
            raise ValueError(f"index: expected a 1-d integer tensor, got {index!r}")
        if self._length == 0:
            return
        B = self._k.shape[0]
        if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < B:
            raise ValueError(f"index: expected batch rows in [0, {B}), got {index}")
        n = self._length
        if index.numel() == B:  # the usual beam step: rows permuted in place
            self._k[:, :, :n] = self._k[index, :, :n]  # the right side is a copy
            self._v[:, :, :n] = self._v[index, :, :n]
        else:  # a different batch size: a new buffer
            self._k, self._v = self._k[index], self._v[index]

    def reset(self) -> None:
        """Forget every cached token; the buffer stays allocated for reuse."""
        self._length = 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached tokens and forget the rest: speculative
        decoding (chapter 11) rolls back the draft tokens the model rejected, as Hugging
        Face's ``DynamicCache.crop``. Raises TypeError / ValueError for a length that is
        not an int in [0, self.length]."""
        _validation.positive_int("length", length, 0)
        if length > self._length:
            raise ValueError(
                f"length: expected at most the {self._length} cached tokens, got {length}"
            )
        self._length = length

    def _fits(self, k: Tensor, v: Tensor) -> bool:
        """Whether the allocated buffer can take k and v (B, H, d, dtype, device)."""
        bk, bv = self._k, self._v  # (B, H, C, d_k), (B, H, C, d_v)
        return (
            k.shape[:2] == bk.shape[:2]  # v's (B, H) equal k's (``_check``)
            and (k.shape[3], v.shape[3]) == (bk.shape[3], bv.shape[3])
            and (k.dtype, v.dtype) == (bk.dtype, bv.dtype)
            and (k.device, v.device) == (bk.device, bv.device)
        )

    def _enlarge(self, end: int) -> None:
        size = self._k.shape[2]
        if not self.grow:
            raise ValueError(
                f"k: the cache holds {size} tokens (capacity, grow=False) and has "
                f"{self._length}; cannot add {end - self._length} more"
            )
        size = max(2 * size, end)
        n = self._length
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], size, old.shape[3]))
            new[:, :, :n] = old[:, :, :n]  # the one copy per doubling
            setattr(self, name, new)

    def _check(self, k: Tensor, v: Tensor) -> None:
        if not isinstance(k, Tensor) or not isinstance(v, Tensor):
            raise TypeError(
                f"k, v: expected tensors, got {type(k).__name__} and {type(v).__name__}"
            )
        if k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(
                "k, v: expected (B, H, S_new, d_k) with the same first three sizes, "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if self._length == 0 or self._fits(k, v):
            return
        want = (*self._k.shape[:2], "S_new", self._k.shape[3])
        raise ValueError(
            f"k, v: expected {want} (d_v {self._v.shape[3]}), {self._k.dtype} on "
            f"{self._k.device} to match the cache, got {tuple(k.shape)} (d_v "
            f"{v.shape[3]}), {k.dtype} on {k.device}"
        )


class ConcatKVCache(KVCache):
    """The copy-per-step cache, kept to be measured against ``KVCache``: ``update``
    appends with ``torch.cat``, which allocates a new tensor and copies every cached
    token at every step (T steps copy O(T^2) bytes). Same interface and errors as
    ``KVCache`` (there is no capacity: it never runs out, it only gets slower).
    Used by chapter 7 and ``benchmarks/run.py`` only."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._check(k, v)
        if self._length == 0:
            self._k, self._v = k, v
        else:
            self._k = torch.cat([self.k, k], dim=2)  # (B, H, S_past + S_new, d_k)
            self._v = torch.cat([self.v, v], dim=2)
        self._length = self._k.shape[2]
        return self._k, self._v
