"""kv_quant: every dequantized key and value within half its group's scale, sink
tokens and the residual (newest) tokens exact, per-channel keys beating per-token ones on a
key with an outlier channel (KIVI's reason), the bytes held, and bad inputs."""

import functools

import pytest
import torch

from transformer_course.decoding import generate
from transformer_course.kv_quant import (
    QuantizedKVCache,
    dequantize,
    pack_int4,
    quantize,
    quantized_bytes_per_token,
    unpack_int4,
)

param = pytest.mark.parametrize
B, H, S, D = 2, 3, 45, 8
ULPS = 1e-5  # float rounding of (x - m) / s and back, relative to the range


def _kv(seed=0, outlier=False):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, B, H, S, D, generator=g)
    if outlier:  # KIVI: a few key channels are large in every token
        k[..., 3] = 20.0 + k[..., 3]
    return k, v


def _within_half_scale(x, approx, scale):
    return ((approx - x).abs() <= scale / 2 + ULPS * scale * 2**8).all()


def _floor_quantize(x, bits, dim):  # known wrong: truncates instead of rounding
    levels = 2**bits - 1
    lo, hi = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scale = (hi - lo) / levels
    return ((x - lo) / scale).floor().to(torch.uint8), scale, lo


@param("bits", [8, 4])
def test_quantize_is_within_half_a_step_and_truncation_is_not(bits):
    x, _ = _kv()
    for dim in (2, 3):
        codes, scale, lo = quantize(x, bits, dim)
        assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
        assert _within_half_scale(x, dequantize(codes, scale, lo), scale)
        wrong = _floor_quantize(x, bits, dim)
        assert not _within_half_scale(x, dequantize(*wrong), wrong[1])
    const = torch.full((1, 4), 0.3)
    assert torch.equal(dequantize(*quantize(const, bits, 1)), const)  # scale 1, exact


def test_int4_codes_pack_two_a_byte_and_back():
    codes = torch.randint(0, 16, (3, 5, 8), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (3, 5, 4) and torch.equal(unpack_int4(packed), codes)
    assert int(packed[0, 0, 0]) == int(codes[0, 0, 0]) + 16 * int(codes[0, 0, 1])
    with pytest.raises(ValueError, match="even last size"):
        pack_int4(codes[..., :3])


def _fill(cache, k, v, chunks=(7, 1, 1, 20, 16)):
    start = 0
    for n in chunks:
        out = cache.update(k[:, :, start : start + n], v[:, :, start : start + n])
        start += n
    assert start == S
    return out


@param("bits", [8, 4])
@param("residual", [0, 8])
def test_the_cache_keeps_sinks_exact_and_every_number_within_its_bound(bits, residual):
    k, v = _kv()
    n_sink, G = 4, 8
    cache = QuantizedKVCache(bits, n_sink=n_sink, group_size=G, residual=residual)
    keys, values = _fill(cache, k, v)
    assert keys.shape == k.shape and values.shape == v.shape and cache.length == S
    assert torch.equal(keys[:, :, :n_sink], k[:, :, :n_sink])  # the sinks
    assert torch.equal(values[:, :, :n_sink], v[:, :, :n_sink])
    n_groups = (S - n_sink - residual) // G  # the oldest groups beyond the residual
    resid = n_sink + n_groups * G
    assert torch.equal(keys[:, :, resid:], k[:, :, resid:])  # the newest, exact
    assert torch.equal(values[:, :, resid:], v[:, :, resid:])
    assert residual <= S - resid < residual + G
    for i in range(n_groups):  # keys: a scale per channel over the group's tokens
        part = slice(n_sink + i * G, n_sink + (i + 1) * G)
        _, scale, _ = quantize(k[:, :, part], bits, dim=2)
        assert _within_half_scale(k[:, :, part], keys[:, :, part], scale)
    _, scale, _ = quantize(v[:, :, n_sink:resid], bits, dim=3)  # values: one per token
    assert _within_half_scale(v[:, :, n_sink:resid], values[:, :, n_sink:resid], scale)
    assert not torch.equal(keys[:, :, n_sink:resid], k[:, :, n_sink:resid])  # quantized
    no_sink = QuantizedKVCache(bits, n_sink=0, group_size=G, residual=residual)  # wrong
    assert not torch.equal(_fill(no_sink, k, v)[1][:, :, :n_sink], v[:, :, :n_sink])


def test_per_channel_keys_beat_per_token_keys_when_a_channel_is_an_outlier():
    k, _ = _kv(outlier=True)
    per_channel = dequantize(*quantize(k, 4, dim=2))  # KIVI's keys
    per_token = dequantize(*quantize(k, 4, dim=3))  # the known-wrong axis for keys
    err_channel = (per_channel - k).abs().mean()
    err_token = (per_token - k).abs().mean()
    assert err_token > 3 * err_channel


@param("bits", [8, 4])
def test_bytes_held_match_the_formula_and_shrink_with_bits(bits):
    k, v = _kv()
    n_sink, G = 5, 8  # S - n_sink = 40 = 5 groups, no residual
    cache = QuantizedKVCache(bits, n_sink=n_sink, group_size=G, residual=0)
    _fill(cache, k, v)
    per_token = quantized_bytes_per_token(1, H, D, bits, group_size=G)
    sinks = 2 * B * H * n_sink * D * 4
    assert cache.nbytes == sinks + B * (S - n_sink) * per_token
    codes = 2 * H * D * bits / 8  # keys and values
    scales = 2 * 4 * H * (1 + D / G)  # scale and minimum: a value token, a key channel
    assert per_token == codes + scales < 2 * H * D * 4  # below float32
    assert quantized_bytes_per_token(
        1, H, D, 4, group_size=G
    ) < quantized_bytes_per_token(1, H, D, 8, group_size=G)


def test_in_generate_sinks_covering_everything_give_the_float_tokens(tiny_lm):
    model = tiny_lm()
    ids = torch.randint(1, 40, (2, 9), generator=torch.Generator().manual_seed(3))
    ref = generate(model, ids, 12)
    exact = functools.partial(QuantizedKVCache, 4, n_sink=48)
    assert torch.equal(generate(model, ids, 12, cache=exact), ref)
    with torch.no_grad():  # and 8 bits sit closer to the float logits than 4 bits
        err = {}
        for bits in (8, 4):
            caches = [
                QuantizedKVCache(bits, n_sink=1, group_size=4, residual=0)
                for _ in model.layers
            ]
            model(ids[:, :8], caches=caches)
            out = model(ids[:, 8:], caches=caches)[:, -1]
            err[bits] = (out - model(ids)[:, -1]).abs().max()
        assert 0 < err[8] < err[4]


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"bits: expected one of \[4, 8\], got 3"):
        QuantizedKVCache(3)
    with pytest.raises(ValueError, match="n_sink: expected an int >= 0"):
        QuantizedKVCache(8, n_sink=-1)
    with pytest.raises(ValueError, match="residual: expected an int >= 0"):
        QuantizedKVCache(8, residual=-1)
    with pytest.raises(TypeError, match="x: expected a floating-point tensor"):
        quantize(torch.ones(3, dtype=torch.long), 8, 0)
    cache = QuantizedKVCache(4)
    with pytest.raises(ValueError, match="expected an even d"):
        cache.update(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3))
    cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))
    with pytest.raises(ValueError, match="like the cached tokens"):
        cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="of one shape and dtype"):
        cache.update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 2, 4))
