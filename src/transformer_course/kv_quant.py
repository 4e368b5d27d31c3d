"""A quantized KV cache: keys and values stored in int8 or int4 with their scales,
keys per channel and values per token (KIVI), the first tokens in full precision.

Built in chapter 11 ("Serving"). Shape letters: B batch, H_kv key/value heads,
S tokens cached, d head size, G tokens in a key group.

At long contexts the KV cache, not the weights, fills the memory (chapter 7's
``kv_cache_bytes_per_token``). Storing each number in b bits with a scale s and a
minimum m per group (asymmetric uniform quantization, x ~ m + s * round((x - m) / s),
s = (max - min) / (2^b - 1)) cuts it by about 32 / b in float32. Which numbers share a
scale matters: KIVI (Liu et al. 2024, section 3) found that keys have a few *channels*
of large magnitude in every token, so a key's scale is taken per channel over a group
of G tokens, while values have no such channels and take one scale per token. The
newest tokens stay in full precision (KIVI's residual: the next queries read them
most); once ``residual`` + G of them wait, the oldest G are quantized, keys per
channel and values per token. The first ``n_sink`` tokens are never quantized: most
heads put much of their weight on them (the attention sink, Xiao et al. 2023,
section 3.1; chapter 10 shows it in SmolLM2), so their error would reach every query.

Error bound (what the tests check): each dequantized number is within s / 2 of the
original, where s is its group's scale (up to float rounding, a few ulps of the
group's range); sink tokens and the residual tokens are exact.

Sources: Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
Cache", sections 3.1-3.3 (per-channel keys, per-token values, the residual group);
Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
section 3.1; Jacob et al. 2018, section 2.1 (asymmetric uniform quantization).
"""

from __future__ import annotations

import torch

from transformer_course import _validation

Tensor = torch.Tensor
BITS = (8, 4)


def quantize(x: Tensor, bits: int, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric uniform quantization of ``x`` with one scale and minimum per slice
    along ``dim`` (the numbers reduced over share them).

    Returns ``(codes, scale, minimum)``: codes uint8 of ``x``'s shape with values in
    [0, 2^bits - 1] (``pack_int4`` halves them for 4 bits), scale and minimum of ``x``'s
    dtype with ``dim`` kept as size 1. A constant slice gets scale 1 and is exact.
    Dequantize with ``codes * scale + minimum``; the error is at most scale / 2.

    Raises: TypeError for a non-float ``x``; ValueError for bits not 8 or 4.
    Source: Jacob et al. 2018, section 2.1; KIVI (Liu et al. 2024), section 3.
    """
    _validation.float_tensor("x", x, 1)
    _validation.one_of("bits", bits, BITS)
    levels = 2**bits - 1
    lo, hi = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((x - lo) / scale).round().clamp(0, levels).to(torch.uint8)
    return codes, scale, lo


def dequantize(codes: Tensor, scale: Tensor, minimum: Tensor) -> Tensor:
    """``codes * scale + minimum`` in the scale's dtype (shapes broadcast)."""
    return codes.to(scale.dtype) * scale + minimum


def pack_int4(codes: Tensor) -> Tensor:
    """Two 4-bit codes a byte: (..., d) uint8 in [0, 15], d even -> (..., d / 2), the
    even entries in the low nibbles. Raises ValueError for an odd last size."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: expected an even last size, got {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """The inverse of ``pack_int4``: (..., d / 2) -> (..., d)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)  # (..., d/2, 2) -> (..., d)


class QuantizedKVCache:
    """A ``KVCacheLike`` whose tokens after the first ``n_sink``, but for the newest
    ``residual`` (to ``residual + group_size - 1``), are stored in ``bits`` bits: keys
    per channel in groups of ``group_size`` tokens, values per token.

    ``update(k, v)``: k, v (B, H_kv, S_new, d) of one float dtype -> all keys and
    values so far, dequantized, (B, H_kv, S, d) each (new tensors every call: the
    dequantization a fused kernel does on the fly). ``length``: tokens S. ``nbytes``:
    the bytes held (codes, scales and minima, sinks and residual tokens at full
    precision); ``bytes_per_token`` = nbytes / S. Use one per layer, e.g.
    ``generate(model, ids, n, cache=functools.partial(QuantizedKVCache, bits=4))``.

    Args:
        bits: 8 or 4. n_sink: tokens kept at full precision from the start (>= 0;
            StreamingLLM keeps 4). group_size: tokens that share a key channel's scale
            (KIVI uses 32). residual: newest tokens kept at full precision (>= 0;
            KIVI's R, 128 in the paper).

    Raises:
        TypeError / ValueError: bits not 8 or 4, a negative n_sink or residual,
            group_size < 1;
            in ``update``, k and v not 4-d float of the same shape (4 bits: d even),
            or different from the cached ones in (B, H_kv, d), dtype or device.

    Source: KIVI (Liu et al. 2024), Algorithm 1; Xiao et al. 2023 (attention sinks).
    """

    def __init__(
        self,
        bits: int = 8,
        *,
        n_sink: int = 4,
        group_size: int = 32,
        residual: int = 32,
    ):
        _validation.one_of("bits", bits, BITS)
        _validation.positive_int("n_sink", n_sink, 0)
        _validation.positive_int("group_size", group_size)
        _validation.positive_int("residual", residual, 0)
        self.bits, self.n_sink, self.group_size = bits, n_sink, group_size
        self.residual = residual
        self.sink_k: Tensor | None = None  # (B, H_kv, <= n_sink, d), exact
        self.sink_v: Tensor | None = None
        self.recent_k: Tensor | None = None  # (B, H_kv, < residual + G, d), exact
        self.recent_v: Tensor | None = None
        self.key_groups: list[tuple[Tensor, Tensor, Tensor]] = []  # codes, scale, min
        self.values: tuple[Tensor, Tensor, Tensor] | None = None  # per-token codes
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._check(k, v)
        self._length += k.shape[2]
        n = 0 if self.sink_k is None else self.sink_k.shape[2]
        take = min(self.n_sink - n, k.shape[2])  # tokens that still become sinks
        if take > 0 or self.sink_k is None:
            self.sink_k = _cat(self.sink_k, k[:, :, :take])
            self.sink_v = _cat(self.sink_v, v[:, :, :take])
        k, v = k[:, :, take:], v[:, :, take:]
        if k.shape[2]:
            self.recent_k, self.recent_v = (
                _cat(self.recent_k, k),
                _cat(self.recent_v, v),
            )
        G = self.group_size
        while self.recent_k is not None and self.recent_k.shape[2] >= self.residual + G:
            old_k, self.recent_k = self.recent_k[:, :, :G], self.recent_k[:, :, G:]
            old_v, self.recent_v = self.recent_v[:, :, :G], self.recent_v[:, :, G:]
            codes, scale, lo = quantize(old_k, self.bits, dim=2)  # a scale per channel
            self.key_groups.append((self._pack(codes), scale, lo))  # scale (B, H, 1, d)
            self._add_values(old_v)
        return self._keys(), self._values()

    def _add_values(self, v: Tensor) -> None:
        codes, scale, lo = quantize(v, self.bits, dim=3)  # one scale per token
        new = (self._pack(codes), scale, lo)  # scale (B, H_kv, S_new, 1)
        old = self.values
        self.values = new if old is None else tuple(map(_cat, old, new))

    def _pack(self, codes: Tensor) -> Tensor:
        return pack_int4(codes) if self.bits == 4 else codes

    def _unpack(self, codes: Tensor) -> Tensor:
        return unpack_int4(codes) if self.bits == 4 else codes

    def _keys(self) -> Tensor:
        parts = [self.sink_k]
        parts += [dequantize(self._unpack(c), s, m) for c, s, m in self.key_groups]
        parts.append(self.recent_k)
        return torch.cat([p for p in parts if p is not None], dim=2)  # (B, H_kv, S, d)

    def _values(self) -> Tensor:
        parts = [self.sink_v, self.recent_v]
        if self.values is not None:
            codes, scale, lo = self.values
            parts.insert(1, dequantize(self._unpack(codes), scale, lo))
        return torch.cat([p for p in parts if p is not None], dim=2)  # (B, H_kv, S, d)

    @property
    def nbytes(self) -> int:
        tensors = [self.sink_k, self.sink_v, self.recent_k, self.recent_v]
        tensors += list(self.values or ())
        tensors += [t for group in self.key_groups for t in group]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @property
    def bytes_per_token(self) -> float:
        return self.nbytes / max(self._length, 1)

    def _check(self, k: Tensor, v: Tensor) -> None:
        _validation.float_tensor("k", k, 4)
        _validation.float_tensor("v", v, 4)
        if k.dim() != 4 or k.shape != v.shape or k.dtype != v.dtype:
            raise ValueError(
                "k, v: expected (B, H_kv, S_new, d) of one shape and dtype, got "
                f"{tuple(k.shape)} {k.dtype} and {tuple(v.shape)} {v.dtype}"
            )
        if self.bits == 4 and k.shape[3] % 2:
            raise ValueError(
                f"k: 4-bit codes pack in pairs, expected an even d, got {k.shape}"
            )
        ref = self.sink_k
        if ref is not None and (
            (ref.shape[:2], ref.shape[3]) != (k.shape[:2], k.shape[3])
            or (ref.dtype, ref.device) != (k.dtype, k.device)
        ):
            raise ValueError(
                f"k, v: expected (B, H_kv, S_new, d) = ({ref.shape[0]}, {ref.shape[1]}, "
                f"S_new, {ref.shape[3]}) of {ref.dtype} on {ref.device} like the cached "
                f"tokens, got {tuple(k.shape)} of {k.dtype} on {k.device}"
            )


def _cat(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None else torch.cat([a, b], dim=2)


def quantized_bytes_per_token(
    n_layers: int,
    n_kv_heads: int,
    d_k: int,
    bits: int,
    *,
    group_size: int = 32,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Bytes a token takes in ``QuantizedKVCache`` over a whole model, sinks and the
    residual aside (they are a fixed few tokens): codes of b bits for keys and values,
    a scale and a minimum per value token and per key channel per ``group_size``
    tokens, in ``dtype``. Compare ``measure.kv_cache_bytes_per_token``.

    Raises TypeError / ValueError for sizes that are not ints >= 1 or bits not 8 or 4.
    """
    for name, value in [
        ("n_layers", n_layers),
        ("n_kv_heads", n_kv_heads),
        ("d_k", d_k),
    ]:
        _validation.positive_int(name, value)
    _validation.one_of("bits", bits, BITS)
    _validation.positive_int("group_size", group_size)
    size = torch.empty((), dtype=dtype).element_size()
    codes = 2 * d_k * bits / 8  # keys and values
    scales = 2 * size * (1 + d_k / group_size)  # values per token, keys per channel
    return n_layers * n_kv_heads * (codes + scales)
