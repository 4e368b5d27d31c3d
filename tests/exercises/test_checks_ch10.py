"""Chapter 10's self-checks: the library's reference passes, each known-wrong variant
fails with the message that names its mistake (``check.strict``) and returns False
(``check``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_course.exercises import (
    CheckError,
    ShapeError,
    check_gqa_cache_bytes,
    check_rms_norm,
    check_swiglu,
    check_unpermute_rows,
)
from transformer_course.interop import permute_rotary_rows
from transformer_course.layers import RMSNorm, SwiGLU
from transformer_course.measure import kv_cache_bytes_per_token


def library_rms_norm(x, weight, eps):
    norm = RMSNorm(x.shape[-1], eps)
    norm.weight.data.copy_(weight)
    return norm(x).detach()


def test_rms_norm_check(quiet_check):
    assert quiet_check(check_rms_norm, library_rms_norm) is True
    with pytest.raises(CheckError, match="LayerNorm"):
        check_rms_norm.strict(
            lambda x, w, eps: F.layer_norm(x, x.shape[-1:], w, eps=eps)
        )
    with pytest.raises(CheckError, match="inside the square root"):
        check_rms_norm.strict(
            lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w
        )
    with pytest.raises(CheckError, match="gain"):
        check_rms_norm.strict(
            lambda x, w, eps: library_rms_norm(x, torch.ones_like(w), eps)
        )
    with pytest.raises(CheckError, match="last axis"):
        check_rms_norm.strict(
            lambda x, w, eps: x / (x.pow(2).mean(1, keepdim=True) + eps).sqrt() * w
        )
    with pytest.raises(ShapeError):
        check_rms_norm.strict(lambda x, w, eps: x.pow(2).mean(-1))
    assert quiet_check(check_rms_norm, lambda x, w, eps: x) is False


def library_swiglu(x, w_gate, w_up, w_down):
    ff = SwiGLU(x.shape[-1], w_gate.shape[0])
    for lin, w in ((ff.gate_proj, w_gate), (ff.up_proj, w_up), (ff.down_proj, w_down)):
        lin.weight.data.copy_(w)
    return ff(x).detach()


def test_swiglu_check(quiet_check):
    assert quiet_check(check_swiglu, library_swiglu) is True
    with pytest.raises(CheckError, match="swapped"):
        check_swiglu.strict(lambda x, g, u, d: library_swiglu(x, u, g, d))
    with pytest.raises(CheckError, match="sigmoid"):
        check_swiglu.strict(
            lambda x, g, u, d: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T
        )
    with pytest.raises(CheckError, match="no gate"):
        check_swiglu.strict(lambda x, g, u, d: F.silu(x @ g.T) @ d.T)
    with pytest.raises(CheckError, match="differs"):
        check_swiglu.strict(lambda x, g, u, d: (F.relu(x @ g.T) * (x @ u.T)) @ d.T)
    with pytest.raises(ShapeError):
        check_swiglu.strict(lambda x, g, u, d: F.silu(x @ g.T) * (x @ u.T))
    assert quiet_check(check_swiglu, lambda x, g, u, d: x) is False


def library_cache_bytes(n_layers, n_heads, n_kv_heads, d_k, nbytes, n_tokens):
    dtype = {2: torch.bfloat16, 4: torch.float32}[nbytes]
    return kv_cache_bytes_per_token(n_layers, n_kv_heads, d_k, dtype) * n_tokens


def test_gqa_cache_bytes_check(quiet_check):
    assert quiet_check(check_gqa_cache_bytes, library_cache_bytes) is True
    with pytest.raises(CheckError, match="n_heads=9 heads are counted"):
        check_gqa_cache_bytes.strict(lambda L, H, Hkv, d, b, n: 2 * L * H * d * b * n)
    with pytest.raises(CheckError, match="keys or values"):
        check_gqa_cache_bytes.strict(lambda L, H, Hkv, d, b, n: L * Hkv * d * b * n)
    with pytest.raises(CheckError, match="expected"):
        check_gqa_cache_bytes.strict(lambda L, H, Hkv, d, b, n: 2 * Hkv * d * b * n)
    with pytest.raises(ShapeError, match="int"):
        check_gqa_cache_bytes.strict(
            lambda L, H, Hkv, d, b, n: 2.0 * L * Hkv * d * b * n
        )
    assert quiet_check(check_gqa_cache_bytes, lambda *a: 0) is False


def test_unpermute_rows_check(quiet_check):
    def library(w, n_heads):
        return permute_rotary_rows(w, n_heads, "half")

    assert quiet_check(check_unpermute_rows, library) is True
    with pytest.raises(CheckError, match="unchanged"):
        check_unpermute_rows.strict(lambda w, n: w.clone())
    with pytest.raises(CheckError, match="applied again"):
        check_unpermute_rows.strict(
            lambda w, n: permute_rotary_rows(w, n, "interleaved")
        )
    with pytest.raises(CheckError, match="one head"):
        check_unpermute_rows.strict(lambda w, n: permute_rotary_rows(w, 1, "half"))
    with pytest.raises(CheckError, match="differ"):
        check_unpermute_rows.strict(lambda w, n: w.flip(0))
    with pytest.raises(ShapeError):
        check_unpermute_rows.strict(lambda w, n: w.T)
    assert quiet_check(check_unpermute_rows, lambda w, n: w) is False
