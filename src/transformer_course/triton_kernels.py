"""The FlashAttention forward pass as a Triton kernel, differentiable through the
backward kernels of ``triton_backward.py``.

Derived in chapter 7 ("Making attention fast"), after ``flash.tiled_attention``,
which does the same computation in PyTorch. Each Triton program owns one block of
BLOCK_M queries of one (batch, head) pair, keeps them in fast on-chip memory, streams
the keys and values past them BLOCK_N at a time and keeps the running max ``m_i`` and
running sum ``l_i`` of the online softmax, so the (T, S) scores never reach the GPU's
main memory.

Triton is imported lazily: the rest of the library works without it. On a machine
without a GPU the kernel runs in Triton's interpreter when the environment variable
``TRITON_INTERPRET=1`` is set (slow; for small correctness tests only).

Shape letters: B batch, H heads, T query length, S key length, d head size.

Sources: Dao et al. 2022, "FlashAttention", algorithm 1; Dao 2023, "FlashAttention-2",
section 3.1 (queries in the outer loop, one program per query block); the Triton
tutorial "Fused Attention" (triton-lang/triton, python/tutorials/06-fused-attention.py).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

Tensor = torch.Tensor

_KERNELS: dict[tuple[bool, bool], object] = {}  # (interpreter?, backward?) -> kernels


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks Triton to run kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in {"1", "true", "yes", "on"}


def _imported_compiled() -> bool:
    """True if triton was imported before ``TRITON_INTERPRET=1`` was set: its language
    functions were then built for the GPU compiler and the interpreter cannot run
    them."""
    tl = sys.modules.get("triton.language")
    return tl is not None and type(tl.zeros).__name__ != "InterpretedFunction"


def is_available(device: torch.device | str | None = None) -> bool:
    """Whether ``flash_attention`` can run on ``device`` here: Triton is installed and
    either the device is a CUDA GPU, or it is the CPU and the interpreter is enabled
    (``TRITON_INTERPRET=1`` set before triton is first imported)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if interpreter_enabled():
        return kind == "cpu" and not _imported_compiled()
    return kind == "cuda" and torch.cuda.is_available()


def _build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def flash_fwd(
        Q,
        K,
        V,
        O,
        L,
        KEEP,  # pointers: q, k, v, out (B*H, len, d); L (B*H, T); keep (B, S) int8
        scale,
        T,
        S,
        H,
        D,  # runtime sizes
        HAS_KEEP: tl.constexpr,
        CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)  # which block of queries
        bh = tl.program_id(1)  # which (batch, head) pair
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this program
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        q = tl.load(
            Q + bh * T * D + offs_m[:, None] * D + offs_d[None, :],
            mask=(offs_m[:, None] < T) & d_ok,
            other=0.0,
        )  # (BLOCK_M, BLOCK_D)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # unnormalised output
        end = S
        if CAUSAL:  # query i sees keys j <= i + S - T: skip tiles past the diagonal
            end = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
        for start_n in range(0, end, BLOCK_N):
            n = start_n + offs_n
            kv_ok = (n[:, None] < S) & d_ok
            k = tl.load(
                K + bh * S * D + n[:, None] * D + offs_d[None, :], mask=kv_ok, other=0.0
            )  # (BLOCK_N, BLOCK_D)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            keep = (n[None, :] < S) & (offs_m[:, None] >= 0)  # (BLOCK_M, BLOCK_N)
            if HAS_KEEP:
                key_ok = tl.load(KEEP + (bh // H) * S + n, mask=n < S, other=0)
                keep = keep & (key_ok[None, :] != 0)
            if CAUSAL:
                keep = keep & (n[None, :] <= offs_m[:, None] + S - T)
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows seen nothing
            p = tl.exp(s - m_safe[:, None])  # masked keys: exp(-inf) = 0
            alpha = tl.exp(m_i - m_safe)  # rescale what was accumulated so far
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                V + bh * S * D + n[:, None] * D + offs_d[None, :], mask=kv_ok, other=0.0
            )  # (BLOCK_N, BLOCK_D)
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # (BM, BD)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # rows with no key stay 0
        tl.store(
            O + bh * T * D + offs_m[:, None] * D + offs_d[None, :],
            out.to(O.dtype.element_ty),
            mask=(offs_m[:, None] < T) & d_ok,
        )
        # the log-sum-exp for the backward; +inf for a row with no key (P = 0 there)
        lse = m_i + tl.log(tl.where(l_i > 0, l_i, 1.0))
        lse = tl.where(l_i > 0, lse, float("inf"))
        tl.store(L + bh * T + offs_m, lse, mask=offs_m < T)

    return triton, flash_fwd


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> Tensor:
    """FlashAttention in Triton: softmax(q k^T * scale) v, tile by tile, forward and
    backward.

    Differentiable with respect to q, k and v: the forward kernel also saves one
    log-sum-exp per query row, and the backward runs the two kernels of
    ``triton_backward`` (dK and dV per key block, dQ per query block), which recompute
    each tile's probabilities instead of storing them.

    Args:
        q: queries (B, H, T, d); float32, float16 or bfloat16, on a CUDA GPU (or on
            the CPU with ``TRITON_INTERPRET=1``).
        k: keys (B, H, S, d); v: values (B, H, S, d); same dtype and device as ``q``.
        causal: apply the causal mask (bottom-right aligned, as ``causal_mask``).
        key_mask: optional bool (B, S), True = key may be attended (padding mask).
        scale: multiplier of the scores; default 1 / sqrt(d).
        block_m, block_n: queries and keys per tile; powers of two >= 16.

    Returns:
        Output (B, H, T, d) in the dtype of ``q``. Accumulation is in float32; queries
        with no visible key get zeros, and zero gradients. Under
        ``TRITON_INTERPRET=1``, bfloat16 inputs are computed in float32 (the
        interpreter's ``tl.dot`` has no bfloat16) and the output rounded to bfloat16.

    Raises:
        RuntimeError: if Triton is missing or cannot run on this device (no GPU and
            no ``TRITON_INTERPRET=1``).
        TypeError: for non-float inputs, mixed dtypes or a non-bool ``key_mask``.
        ValueError: for wrong shapes (naming the argument, expected and received
            shape) or block sizes that are not powers of two >= 16.

    Source: Dao et al. 2022, algorithm 1; Dao 2023, section 3.1 and algorithm 2.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dtype not in (
            torch.float32,
            torch.float16,
            torch.bfloat16,
        ):
            raise TypeError(f"{name}: expected a float32/float16/bfloat16 tensor")
        if x.dim() != 4:
            raise ValueError(
                f"{name}: expected shape (B, H, len, d), got {tuple(x.shape)}"
            )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    b, h, t, d = q.shape
    s = k.shape[2]
    if tuple(k.shape) != (b, h, s, d):
        raise ValueError(
            f"k: expected shape (B, H, S, d) with (B, H, d) = {(b, h, d)} from q, "
            f"got {tuple(k.shape)}"
        )
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(
            f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}"
        )
    if key_mask is not None:
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            raise TypeError("key_mask: expected a bool tensor (True = may attend)")
        if tuple(key_mask.shape) != (b, s):
            raise ValueError(
                f"key_mask: expected shape (B, S) = {(b, s)}, "
                f"got {tuple(key_mask.shape)}"
            )
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if not isinstance(blk, int) or blk < 16 or blk & (blk - 1):
            raise ValueError(f"{name}: expected a power of two >= 16, got {blk}")
    if not is_available(q.device):
        raise RuntimeError(
            f"flash_attention: Triton cannot run on {q.device} here (needs the triton "
            "package and a CUDA GPU, or CPU tensors with TRITON_INTERPRET=1 set "
            "before triton is first imported: restart the kernel and set it first)"
        )
    interp = interpreter_enabled()
    dtype = q.dtype
    if interp and dtype == torch.bfloat16:
        # The interpreter runs tl.dot in NumPy, which has no bfloat16: it returns
        # garbage (errors near 1e9). Compute in float32 and round the output once.
        q, k, v = q.float(), k.float(), v.float()
    keep = key_mask if key_mask is not None else torch.ones(1, 1, dtype=torch.bool)
    keep = keep.to(device=q.device, dtype=torch.int8).contiguous()  # (B, S)
    config = _Config(
        1.0 / math.sqrt(d) if scale is None else float(scale),
        h,
        key_mask is not None,
        bool(causal),
        "ieee" if q.dtype == torch.float32 else "tf32",
        block_m,
        block_n,
    )
    out = _FlashAttention.apply(
        q.reshape(b * h, t, d),  # (B*H, T, d)
        k.reshape(b * h, s, d),  # (B*H, S, d)
        v.reshape(b * h, s, d),  # (B*H, S, d)
        keep,
        config,
    )
    return out.view(b, h, t, d).to(dtype)  # (B, H, T, d)


class _Config(NamedTuple):
    scale: float
    heads: int  # H, to find the batch item of a (batch, head) program
    has_keep: bool
    causal: bool
    precision: str
    block_m: int
    block_n: int


def _kernels(backward: bool = False):
    """The forward ``(triton, kernel)``, or the two backward kernels."""
    interp = interpreter_enabled()
    if (interp, backward) not in _KERNELS:
        if backward:
            from transformer_course import triton_backward  # imports triton

            kernels = (triton_backward.flash_bwd_dkdv, triton_backward.flash_bwd_dq)
        else:
            kernels = _build_kernel()
        _KERNELS[interp, backward] = kernels
    return _KERNELS[interp, backward]


class _FlashAttention(torch.autograd.Function):
    """The forward kernel, with the two backward kernels of ``triton_backward`` as its
    gradient. Works on contiguous (B*H, len, d) tensors; saves q, k, v, the output
    and the (B*H, T) log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, keep, cfg: _Config):
        triton, kernel = _kernels()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        (bh, t, d), s = q.shape, k.shape[1]
        out = torch.empty_like(q)  # (B*H, T, d)
        lse = torch.empty(bh, t, device=q.device, dtype=torch.float32)  # (B*H, T)
        kernel[(triton.cdiv(t, cfg.block_m), bh)](
            q, k, v, out, lse, keep, cfg.scale, t, s, cfg.heads, d,
            **_constants(cfg, triton, d),
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, keep)
        ctx.cfg = cfg
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        import triton

        q, k, v, out, lse, keep = ctx.saved_tensors
        cfg = ctx.cfg
        (bh, t, d), s = q.shape, k.shape[1]
        d_out = d_out.contiguous()  # (B*H, T, d)
        delta = (d_out.float() * out.float()).sum(-1).contiguous()  # D (B*H, T)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dkdv_kernel, dq_kernel = _kernels(backward=True)
        sizes = (cfg.scale, t, s, cfg.heads, d)
        const = _constants(cfg, triton, d)
        dkdv_kernel[(triton.cdiv(s, cfg.block_n), bh)](
            q, k, v, d_out, lse, delta, dk, dv, keep, *sizes, **const
        )
        dq_kernel[(triton.cdiv(t, cfg.block_m), bh)](
            q, k, v, d_out, lse, delta, dq, keep, *sizes, **const
        )
        return dq, dk, dv, None, None


def _constants(cfg: _Config, triton, d: int) -> dict:
    return {
        "HAS_KEEP": cfg.has_keep,
        "CAUSAL": cfg.causal,
        "PRECISION": cfg.precision,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
    }
