"""Chapter 10's self-checks: a learner's own right answer passes, the library's own
version is refused (the exercise asks for the computation), each known-wrong variant
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
    pitfalls,
)
from transformer_course.interop import permute_rotary_rows
from transformer_course.layers import RMSNorm, SwiGLU
from transformer_course.measure import kv_cache_bytes_per_token


def library_rms_norm(x, weight, eps):
    norm = RMSNorm(x.shape[-1], eps)
    norm.weight.data.copy_(weight)
    return norm(x).detach()


def own_rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_rms_norm_check(quiet_check):
    assert quiet_check(check_rms_norm, own_rms_norm) is True
    assert quiet_check(check_rms_norm, F.rms_norm) is False  # wrong signature: crash
    assert quiet_check(
        check_rms_norm, lambda x, w, eps: F.rms_norm(x, x.shape[-1:], w, eps)
    )
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
            lambda x, w, eps: own_rms_norm(x, torch.ones_like(w), eps)
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


def own_swiglu(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def test_swiglu_check(quiet_check):
    assert quiet_check(check_swiglu, own_swiglu) is True
    with pytest.raises(CheckError, match="swapped"):
        check_swiglu.strict(lambda x, g, u, d: own_swiglu(x, u, g, d))
    with pytest.raises(CheckError, match="sigmoid"):
        check_swiglu.strict(
            lambda x, g, u, d: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T
        )
    with pytest.raises(CheckError, match="no gate"):
        check_swiglu.strict(lambda x, g, u, d: F.silu(x @ g.T) @ d.T)
    with pytest.raises(CheckError, match="differs"):
        check_swiglu.strict(lambda x, g, u, d: (F.relu(x @ g.T) * (x @ u.T)) @ d.T)
    with pytest.raises(CheckError, match="differs"):
        check_swiglu.strict(lambda x, g, u, d: own_swiglu(x, g, u, d) * 1.01)
    with pytest.raises(ShapeError):
        check_swiglu.strict(lambda x, g, u, d: F.silu(x @ g.T) * (x @ u.T))
    assert quiet_check(check_swiglu, lambda x, g, u, d: x) is False


def library_cache_bytes(n_layers, n_heads, n_kv_heads, d_k, nbytes, n_tokens):
    dtype = {2: torch.bfloat16, 4: torch.float32}[nbytes]
    return kv_cache_bytes_per_token(n_layers, n_kv_heads, d_k, dtype) * n_tokens


def own_cache_bytes(n_layers, n_heads, n_kv_heads, d_k, nbytes, n_tokens):
    return 2 * n_layers * n_kv_heads * d_k * nbytes * n_tokens


def test_gqa_cache_bytes_check(quiet_check):
    assert quiet_check(check_gqa_cache_bytes, own_cache_bytes) is True
    with pytest.raises(CheckError, match="n_heads=9 heads are counted"):
        check_gqa_cache_bytes.strict(lambda L, H, Hkv, d, b, n: 2 * L * H * d * b * n)
    with pytest.raises(CheckError, match="keys or values"):
        check_gqa_cache_bytes.strict(lambda L, H, Hkv, d, b, n: L * Hkv * d * b * n)
    with pytest.raises(CheckError, match="expected") as err:
        check_gqa_cache_bytes.strict(lambda L, H, Hkv, d, b, n: 2 * Hkv * d * b * n)
    assert "multiply: 2 x layers" in err.value.hint
    with pytest.raises(ShapeError, match="int"):
        check_gqa_cache_bytes.strict(
            lambda L, H, Hkv, d, b, n: 2.0 * L * Hkv * d * b * n
        )
    assert quiet_check(check_gqa_cache_bytes, lambda *a: 0) is False


def own_unpermute(w, n_heads):
    d = w.shape[0] // n_heads
    heads = w.reshape(n_heads, d // 2, 2, -1)  # each head: (pairs, 2, D)
    return heads.transpose(1, 2).reshape(w.shape)


def own_interleave(w, n_heads):  # llama.cpp's permutation: applies it again
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, -1).transpose(1, 2).reshape(w.shape)


def test_unpermute_rows_check(quiet_check):
    assert quiet_check(check_unpermute_rows, own_unpermute) is True
    with pytest.raises(CheckError, match="unchanged"):
        check_unpermute_rows.strict(lambda w, n: w.clone())
    with pytest.raises(CheckError, match="applied again"):
        check_unpermute_rows.strict(lambda w, n: own_interleave(w, n))
    with pytest.raises(CheckError, match="one head"):
        check_unpermute_rows.strict(lambda w, n: own_unpermute(w, 1))
    with pytest.raises(CheckError, match="differ"):
        check_unpermute_rows.strict(lambda w, n: w.flip(0))
    with pytest.raises(ShapeError):
        check_unpermute_rows.strict(lambda w, n: w.T)
    assert quiet_check(check_unpermute_rows, lambda w, n: w) is False


# ------------------------------------------------ learner trial 2026-12-03 (issue 39)


@pytest.mark.parametrize(
    "check, answer",
    [
        (check_rms_norm, library_rms_norm),
        (check_swiglu, library_swiglu),
        (check_gqa_cache_bytes, library_cache_bytes),
        (check_unpermute_rows, lambda w, n: permute_rotary_rows(w, n, "half")),
    ],
    ids=["RMSNorm", "SwiGLU", "kv_cache_bytes_per_token", "permute_rotary_rows"],
)
def test_the_librarys_own_version_is_refused(check, answer, capsys):
    """Finding 2: all four passed, three of them imported by the chapter's first cell."""
    assert check(answer) is False
    assert "calls the library's transformer_course." in capsys.readouterr().out


def _unpermute_halves_swapped(w, n_heads):
    return (
        own_unpermute(w, n_heads)
        .reshape(n_heads, 2, -1, w.shape[1])
        .flip(1)
        .reshape(w.shape)
    )


def _unpermute_no_head_offset(w, n_heads):
    d = w.shape[0] // n_heads
    return own_unpermute(w[:d], 1).repeat(n_heads, 1)


def _cache(factor):
    return lambda L, H, Hkv, d, b, n: 2 * L * Hkv * d * b * factor(n)


TRIAL_2026_12_03 = [
    # finding 3c: all three got the axis hint
    (check_rms_norm, pitfalls.rms_norm_no_eps, "eps is left out"),
    (check_rms_norm, pitfalls.rms_norm_mean_of_x, "mean of x, not of the mean of"),
    (check_rms_norm, pitfalls.rms_norm_root_of_sum, "sum of the squares"),
    # finding 3d: "half the expected size"
    (check_gqa_cache_bytes, pitfalls.cache_bytes_group_ratio, "the group size"),
    # finding 5: generic in the trial
    (
        check_swiglu,
        lambda x, g, u, d: (F.gelu(x @ g.T) * (x @ u.T)) @ d.T,
        "GELU (GeGLU)",
    ),
    (
        check_swiglu,
        lambda x, g, u, d: (F.silu(x @ g.T) * F.silu(x @ u.T)) @ d.T,
        "both projections",
    ),
    (
        check_swiglu,
        lambda x, g, u, d: F.silu((x @ g.T) * (x @ u.T)) @ d.T,
        "after the product",
    ),
    (
        check_swiglu,
        lambda x, g, u, d: (F.silu(x @ g.T) + (x @ u.T)) @ d.T,
        "added, not multiplied",
    ),
    (check_gqa_cache_bytes, _cache(lambda n: 1), "n_tokens is not multiplied in"),
    (check_gqa_cache_bytes, _cache(lambda n: 8 * n), "bits, not bytes"),
    (check_gqa_cache_bytes, _cache(lambda n: n + 1), "one token too many"),
    (check_gqa_cache_bytes, _cache(lambda n: n - 1), "one token too few"),
    (
        check_gqa_cache_bytes,
        lambda L, H, Hkv, d, b, n: 2 * L * H * Hkv * d * b * n,
        "n_heads * n_kv_heads",
    ),
    (check_unpermute_rows, _unpermute_halves_swapped, "halves are swapped"),
    (check_unpermute_rows, _unpermute_no_head_offset, "head offset"),
]


@pytest.mark.parametrize(
    "check, wrong, message",
    TRIAL_2026_12_03,
    ids=[str(i) for i in range(len(TRIAL_2026_12_03))],
)
def test_each_mistake_of_the_2026_12_03_trial_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert len(printed.strip().splitlines()) == 2, printed
