"""The FlashAttention backward pass as two Triton kernels (FlashAttention-2).

Derived in chapter 7 ("Making attention fast"), after ``flash.tiled_backward``, which
does the same computation in PyTorch. The forward kernel (``triton_kernels.py``) saves
one log-sum-exp L per query row; D = rowsum(dO * O) is computed once before these
kernels. Both kernels recompute a tile's probabilities P = exp(q k^T * scale - L):

- ``flash_bwd_dkdv``: one program per block of BLOCK_N keys of one (batch, head)
  pair; it keeps its keys and values on chip, visits the query blocks that can see
  them, and accumulates dV += P^T dO and dK += scale * dS^T Q, dS = P * (dP - D);
- ``flash_bwd_dq``: one program per block of BLOCK_M queries, visiting the key blocks
  they can see, accumulating dQ += scale * dS K.

Two kernels instead of one with atomic additions to dQ (the paper's version): each
program then writes only its own rows, so the result is the same on every run.
This module imports triton: ``triton_kernels`` imports it only when a gradient is
asked for, so ``TRITON_INTERPRET=1`` must be set before, as for the forward kernel.

Shape letters: B batch, H heads, T query length, S key length, d head size.
Sources: Dao 2023, "FlashAttention-2", algorithm 2; the Triton tutorial "Fused
Attention" (triton-lang/triton, python/tutorials/06-fused-attention.py), which also
splits dQ from dK and dV.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Pointers are to contiguous (B*H, len, d) tensors; L and D are (B*H, T) float32 and
# KEEP is (B, S) int8 (True = key may be attended).


@triton.jit
def _tile_grads(
    q, k, v, do, lse, delta, m, n, key_ok, scale, T, S,
    CAUSAL: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """P and dS of one (BLOCK_M, BLOCK_N) tile, recomputed from L and D."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # (BM, BN)
    keep = key_ok[None, :] & (m[:, None] < T)
    if CAUSAL:  # query i sees keys j <= i + S - T
        keep = keep & (n[None, :] <= m[:, None] + S - T)
    s = tl.where(keep, s, float("-inf"))
    p = tl.exp(s - lse[:, None])  # hidden keys and rows without a key: 0
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # (BM, BN)
    return p, p * (dp - delta[:, None])  # P, dS = P * (dP - D)


@triton.jit
def flash_bwd_dkdv(
    Q, K, V, DO, L, DELTA, DK, DV, KEEP,  # pointers
    scale, T, S, H, D,  # runtime sizes
    HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)  # which block of keys
    bh = tl.program_id(1)  # which (batch, head) pair
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < D
    kv_at = bh * S * D + n[:, None] * D + offs_d[None, :]
    kv_ok = (n[:, None] < S) & d_ok
    k = tl.load(K + kv_at, mask=kv_ok, other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(V + kv_at, mask=kv_ok, other=0.0)
    key_ok = n < S
    if HAS_KEEP:
        keep = tl.load(KEEP + (bh // H) * S + n, mask=n < S, other=0)
        key_ok = key_ok & (keep != 0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo = 0
    if CAUSAL:  # the first query that sees key j is i = j - (S - T)
        lo = tl.maximum(0, pid_n * BLOCK_N - (S - T)) // BLOCK_M * BLOCK_M
    for start_m in range(lo, T, BLOCK_M):
        m = start_m + tl.arange(0, BLOCK_M)
        q_at = bh * T * D + m[:, None] * D + offs_d[None, :]
        q_ok = (m[:, None] < T) & d_ok
        q = tl.load(Q + q_at, mask=q_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
        do = tl.load(DO + q_at, mask=q_ok, other=0.0)
        lse = tl.load(L + bh * T + m, mask=m < T, other=float("inf"))
        delta = tl.load(DELTA + bh * T + m, mask=m < T, other=0.0)
        p, ds = _tile_grads(
            q, k, v, do, lse, delta, m, n, key_ok, scale, T, S, CAUSAL, PRECISION
        )
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    tl.store(DK + kv_at, (dk * scale).to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + kv_at, dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def flash_bwd_dq(
    Q, K, V, DO, L, DELTA, DQ, KEEP,  # pointers
    scale, T, S, H, D,  # runtime sizes
    HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)  # which block of queries
    bh = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < D
    q_at = bh * T * D + m[:, None] * D + offs_d[None, :]
    q_ok = (m[:, None] < T) & d_ok
    q = tl.load(Q + q_at, mask=q_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
    do = tl.load(DO + q_at, mask=q_ok, other=0.0)
    lse = tl.load(L + bh * T + m, mask=m < T, other=float("inf"))
    delta = tl.load(DELTA + bh * T + m, mask=m < T, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = S
    if CAUSAL:  # skip the key blocks past the diagonal, as the forward does
        end = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    for start_n in range(0, end, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        kv_at = bh * S * D + n[:, None] * D + offs_d[None, :]
        kv_ok = (n[:, None] < S) & d_ok
        k = tl.load(K + kv_at, mask=kv_ok, other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(V + kv_at, mask=kv_ok, other=0.0)
        key_ok = n < S
        if HAS_KEEP:
            keep = tl.load(KEEP + (bh // H) * S + n, mask=n < S, other=0)
            key_ok = key_ok & (keep != 0)
        _, ds = _tile_grads(
            q, k, v, do, lse, delta, m, n, key_ok, scale, T, S, CAUSAL, PRECISION
        )
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + q_at, (dq * scale).to(DQ.dtype.element_ty), mask=q_ok)
