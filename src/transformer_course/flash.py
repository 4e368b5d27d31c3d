"""FlashAttention's idea: exact attention computed tile by tile with an online softmax.

Derived in chapter 7 ("Making attention fast"). Shape letters:

    B batch, H heads, T query length, S key length, d_k query/key size, d_v value size.

Masks are bool with True = may attend (see ``masks.py``); a query with no visible key
gets a zero output, never NaN. ``tiled_attention`` has the signature of the backends in
``attention.ATTENTION_BACKENDS``, which registers it as ``"tiled"``.

Sources:
    Milakov and Gimelshein 2018, "Online normalizer calculation for softmax",
    algorithm 3 (the running max and running sum).
    Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
    IO-Awareness", section 3.1, algorithm 1 (tiling).
"""

from __future__ import annotations

import math

import torch

from transformer_course import _validation

Tensor = torch.Tensor


def _no_dropout(dropout_p: float) -> None:
    if dropout_p != 0.0:
        raise ValueError(
            f"dropout_p: the tiled path supports only 0.0, got {dropout_p}; "
            "use the 'naive' backend to train with attention dropout"
        )


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    block_q: int | None = 256,
    block_k: int = 256,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, None]:
    """Exact attention computed tile by tile with an online softmax (FlashAttention).

    Queries are split into blocks of ``block_q`` rows (``None``: all T rows in one
    block); for each block the keys and values are visited in blocks of ``block_k``.
    A running row maximum ``m`` and a running sum ``l`` of exponentials rescale the
    partial output whenever a larger score turns up, so the (T, S) score matrix is
    never stored: the extra memory is one (block_q, block_k) tile per head plus
    O(T * d) for the scaled queries and the output, instead of O(T * S). The default
    tile, 256 x 256, is among the fastest of the sizes ``benchmarks/run.py`` sweeps
    on a CPU (table "tile-size sweep" in ``benchmarks/results.md``); much smaller
    tiles pay the Python loop's overhead per tile many times. Arithmetic is in
    float32 even for float16/bfloat16 inputs; the output is cast back to the input
    dtype.

    Args:
        q: queries (..., T, d_k), floating point.
        k: keys (..., S, d_k), same dtype and leading dimensions.
        v: values (..., S, d_v).
        mask: optional bool mask broadcastable to (..., T, S), True = may attend.
        bias: optional float scores offset broadcastable to (..., T, S) (ALiBi,
            relative positions), added after scaling, one tile at a time.
        block_q: rows of queries per tile (>= 1; need not divide T), or ``None`` for
            all T rows at once (memory T * block_k per head, still linear in T).
        block_k: keys per tile (>= 1; need not divide S).
        causal: also apply ``causal_mask(T, S)`` (bottom-right aligned) and skip the
            tiles that lie wholly above the diagonal.
        scale: multiplier of the scores; default 1 / sqrt(d_k).
        dropout_p: must be 0.0 (accepted so the function fits the backend registry).

    Returns:
        ``(out, None)``: ``out`` (..., T, d_v) in the dtype of ``q``; no weights are
        materialised. A query with no visible key gets a zero row.

    Raises:
        TypeError: non-float inputs, mixed dtypes, a non-bool mask (P4), a non-float
            bias, a non-int block (``block_q`` may also be None).
        ValueError: a block size < 1, mismatched d_k or S, a mask or bias that does
            not broadcast to (..., T, S), ``dropout_p != 0``.

    Source: Dao et al. 2022, algorithm 1; Milakov and Gimelshein 2018, algorithm 3.
    """
    _validation.qkv(q, k, v)
    if block_q is not None:
        _validation.positive_int("block_q", block_q)
    _validation.positive_int("block_k", block_k)
    _no_dropout(dropout_p)
    *lead, t, d_k = q.shape
    s, q_dtype = k.shape[-2], q.dtype
    if mask is not None:
        _validation.bool_mask(mask, (*lead, t, s))
        mask = mask.expand(*lead, t, s)  # a view: no (T, S) copy is made
    if bias is not None:
        _validation.score_bias(bias, (*lead, t, s))
        bias = bias.expand(*lead, t, s)  # a view as well
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q = q.to(work) * scale  # scaled once, not once per tile
    k, v = k.to(work), v.to(work)
    block_q = t if block_q is None else block_q
    outs = []
    for q0 in range(0, t, block_q):
        q1 = min(q0 + block_q, t)
        q_blk = q[..., q0:q1, :]  # (..., bq, d_k)
        m = q_blk.new_full((*lead, q1 - q0, 1), float("-inf"))  # running max
        l = q_blk.new_zeros((*lead, q1 - q0, 1))  # running sum of exp
        acc = q_blk.new_zeros((*lead, q1 - q0, v.shape[-1]))  # (..., bq, d_v)
        # causal: query i sees key j <= i + S - T, so tiles past that are skipped
        k_end = min(s, q1 + s - t) if causal else s
        for k0 in range(0, max(k_end, 0), block_k):
            k1 = min(k0 + block_k, s)
            scores = q_blk @ k[..., k0:k1, :].transpose(-2, -1)  # (..., bq, bk)
            if bias is not None:
                scores = scores + bias[..., q0:q1, k0:k1].to(work)
            keep = None
            if mask is not None:
                keep = mask[..., q0:q1, k0:k1]  # (..., bq, bk)
            if causal:
                i = torch.arange(q0, q1, device=q.device)[:, None] + (s - t)
                j = torch.arange(k0, k1, device=q.device)[None, :]
                keep = j <= i if keep is None else keep & (j <= i)  # (bq, bk)
            if keep is not None:
                scores = scores.masked_fill_(~keep, float("-inf"))
            # The output does not depend on the shift m (it cancels between numerator
            # and denominator), so m is computed without gradient. Rows that have
            # seen no visible key yet keep m = -inf and are shifted by 0 instead.
            with torch.no_grad():
                m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
                shift = torch.where(m_new.isfinite(), m_new, torch.zeros_like(m_new))
                alpha = torch.exp(m - shift)  # rescales what was accumulated so far
            # p = exp(scores - shift), computed in place: no second (bq, bk) tile
            p = scores.sub_(shift).exp_()  # masked: exp(-inf) = 0
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v[..., k0:k1, :]  # (..., bq, d_v)
            m = m_new
        has_key = l > 0  # a query with no visible key keeps l = 0 and gets zeros
        blk = torch.where(has_key, acc / torch.where(has_key, l, 1.0), 0.0)
        outs.append(blk.to(q_dtype))  # (..., bq, d_v)
    return torch.cat(outs, dim=-2), None  # (..., T, d_v)


def online_softmax(scores: Tensor, block: int = 4) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax of one row of scores, read ``block`` entries at a time in a single pass.

    Keeps a running maximum m and a running sum l = sum exp(x_j - m); when a block
    raises the maximum from m to m', the sum is rescaled by exp(m - m').

    Args:
        scores: (S,) one row of scores; ``-inf`` marks a masked key.
        block: entries read per step (>= 1).

    Returns:
        ``(weights, m, l)``: weights (S,) equal to ``torch.softmax(scores, 0)`` (all
        zero if every entry is -inf), and the final running max and sum (0-d tensors).

    Raises:
        ValueError: if ``scores`` is not 1-D or ``block`` < 1.

    Source: Milakov and Gimelshein 2018, algorithm 3.
    """
    _validation.positive_int("block", block)
    if scores.dim() != 1:
        raise ValueError(f"scores: expected shape (S,), got {tuple(scores.shape)}")
    m = scores.new_tensor(float("-inf"))
    l = scores.new_tensor(0.0)
    for j0 in range(0, scores.shape[0], block):
        x = scores[j0 : j0 + block]
        m_new = torch.maximum(m, x.max())
        if torch.isinf(m_new):  # nothing visible yet
            continue
        l = l * torch.exp(m - m_new) + torch.exp(x - m_new).sum()
        m = m_new
    if l == 0:
        return torch.zeros_like(scores), m, l
    return torch.exp(scores - m) / l, m, l
