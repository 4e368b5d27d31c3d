"""FlashAttention's idea: exact attention computed tile by tile with an online softmax,
forward and backward.

Derived in chapter 7 ("Making attention fast"). Shape letters:

    B batch, H heads, T query length, S key length, d_k query/key size, d_v value size.

Masks are bool with True = may attend (see ``masks.py``); a query with no visible key
gets a zero output and zero gradients, never NaN. ``tiled_attention`` has the signature
of the backends in ``attention.ATTENTION_BACKENDS``, which registers it as ``"tiled"``.
It runs through ``TiledAttention``, a ``torch.autograd.Function``: the forward keeps the
output and one log-sum-exp per query row, and the backward recomputes each tile's
probabilities from them, so training stores no (T, S) matrix either.

Sources:
    Milakov and Gimelshein 2018, "Online normalizer calculation for softmax",
    algorithm 3 (the running max and running sum).
    Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
    IO-Awareness", section 3.1, algorithm 1 (tiling), appendix B.2 (the backward).
    Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
    Partitioning", algorithm 1 (forward saving the log-sum-exp), algorithm 2
    (backward with D = rowsum(dO * O)).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from transformer_course import _validation

Tensor = torch.Tensor


class Tiles(NamedTuple):
    """How the (T, S) scores are cut and masked; shared by forward and backward."""

    block_q: int  # query rows per tile
    block_k: int  # keys per tile
    causal: bool  # the bottom-right causal mask on top of ``mask``
    scale: float  # multiplier of q k^T


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
    O(T * d) for the scaled queries and the output, instead of O(T * S). The
    gradient goes through ``TiledAttention``, whose backward (``tiled_backward``)
    recomputes the tiles and also stores no (T, S) matrix. The default
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
            relative positions), added after scaling, one tile at a time; it gets
            a gradient if it requires one (that gradient is as large as ``bias``).
        block_q: rows of queries per tile (>= 1; need not divide T), or ``None`` for
            all T rows at once (memory T * block_k per head, still linear in T).
        block_k: keys per tile (>= 1; need not divide S).
        causal: also apply ``causal_mask(T, S)`` (bottom-right aligned) and skip the
            tiles that lie wholly above the diagonal.
        scale: multiplier of the scores; default 1 / sqrt(d_k).
        dropout_p: must be 0.0 (accepted so the function fits the backend registry).

    Returns:
        ``(out, None)``: ``out`` (..., T, d_v) in the dtype of ``q``; no weights are
        materialised. A query with no visible key gets a zero row, and zero
        gradients flow through it.

    Raises:
        TypeError: non-float inputs, mixed dtypes, a non-bool mask (P4), a non-float
            bias, a non-int block (``block_q`` may also be None).
        ValueError: a block size < 1, mismatched d_k or S, a mask or bias that does
            not broadcast to (..., T, S), ``dropout_p != 0``.

    Source: Dao et al. 2022, algorithm 1; Milakov and Gimelshein 2018, algorithm 3;
    the backward: Dao 2023, algorithm 2.
    """
    _validation.qkv(q, k, v)
    if block_q is not None:
        _validation.positive_int("block_q", block_q)
    _validation.positive_int("block_k", block_k)
    _no_dropout(dropout_p)
    *lead, t, d_k = q.shape
    s = k.shape[-2]
    if mask is not None:
        _validation.bool_mask(mask, (*lead, t, s))
        mask = mask.expand(*lead, t, s)  # a view: no (T, S) copy is made
    if bias is not None:
        _validation.score_bias(bias, (*lead, t, s))
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    tiles = Tiles(t if block_q is None else block_q, block_k, bool(causal), scale)
    return TiledAttention.apply(q, k, v, mask, bias, tiles), None


def tile_scores(q_blk, k_blk, mask, bias, tiles: Tiles, rows, cols, offset: int):
    """One tile of scores ``q_blk k_blk^T + bias``, -inf wherever a key is hidden.

    ``q_blk`` (..., bq, d_k) is already scaled; ``k_blk`` is (..., bk, d_k). The
    slices ``rows`` and ``cols`` place the tile in the (T, S) scores, which ``mask``
    and ``bias`` (None or expanded to (..., T, S)) cover; ``offset`` is S - T, for the
    bottom-right causal mask (query i sees key j <= i + S - T). Returns (..., bq, bk).
    """
    scores = q_blk @ k_blk.transpose(-2, -1)  # (..., bq, bk)
    if bias is not None:
        scores = scores + bias[..., rows, cols].to(scores.dtype)
    keep = None if mask is None else mask[..., rows, cols]  # (..., bq, bk)
    if tiles.causal:
        i = torch.arange(rows.start, rows.stop, device=scores.device)[:, None]
        j = torch.arange(cols.start, cols.stop, device=scores.device)[None, :]
        keep = j <= i + offset if keep is None else keep & (j <= i + offset)
    if keep is not None:
        scores = scores.masked_fill_(~keep, float("-inf"))
    return scores


def tiled_forward(q, k, v, mask, bias, tiles: Tiles) -> tuple[Tensor, Tensor]:
    """The forward loop of ``tiled_attention`` on validated inputs of one dtype.

    Returns ``(out, lse)``: out (..., T, d_v) and the log-sum-exp of each query's
    scores, lse (..., T, 1) = m + log(l), +inf for a query with no visible key (so
    that exp(score - lse) is 0 there). Source: Dao 2023, algorithm 1.
    """
    *lead, t, _ = q.shape
    s = k.shape[-2]
    bias = None if bias is None else bias.expand(*lead, t, s)  # a view
    q = q * tiles.scale  # scaled once, not once per tile
    outs, lses = [], []
    for q0 in range(0, t, tiles.block_q):
        q1 = min(q0 + tiles.block_q, t)
        q_blk = q[..., q0:q1, :]  # (..., bq, d_k)
        m = q_blk.new_full((*lead, q1 - q0, 1), float("-inf"))  # running max
        l = q_blk.new_zeros((*lead, q1 - q0, 1))  # running sum of exp
        acc = q_blk.new_zeros((*lead, q1 - q0, v.shape[-1]))  # (..., bq, d_v)
        # causal: query i sees key j <= i + S - T, so tiles past that are skipped
        k_end = min(s, q1 + s - t) if tiles.causal else s
        for k0 in range(0, max(k_end, 0), tiles.block_k):
            k1 = min(k0 + tiles.block_k, s)
            rows, cols = slice(q0, q1), slice(k0, k1)
            scores = tile_scores(
                q_blk, k[..., cols, :], mask, bias, tiles, rows, cols, s - t
            )
            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
            # rows that have seen no visible key yet keep m = -inf: shift by 0
            shift = torch.where(m_new.isfinite(), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - shift)  # rescales what was accumulated so far
            # p = exp(scores - shift), computed in place: no second (bq, bk) tile
            p = scores.sub_(shift).exp_()  # masked: exp(-inf) = 0
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v[..., cols, :]  # (..., bq, d_v)
            m = m_new
        has_key = l > 0  # a query with no visible key keeps l = 0 and gets zeros
        outs.append(torch.where(has_key, acc / torch.where(has_key, l, 1.0), 0.0))
        lses.append(torch.where(has_key, m + torch.log(l), float("inf")))
    out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
    return out, lse  # (..., T, d_v), (..., T, 1)


def tiled_backward(d_out, q, k, v, out, lse, mask, bias, tiles: Tiles, bias_grad=False):
    """Gradients of tiled attention, recomputed tile by tile (FlashAttention-2).

    With P = exp(S - lse) recomputed per tile from the saved log-sum-exp, and
    D = rowsum(dO * O) computed once: dV += P^T dO, dP = dO V^T, dS = P * (dP - D),
    dQ += scale * dS K, dK += scale * dS^T Q. The outer loop runs over key blocks,
    the inner over query blocks (skipping, if causal, those that see none of the
    keys); no (T, S) matrix is stored unless ``bias_grad`` asks for the gradient of
    the bias, which is itself as large as the bias.

    Args: as ``tiled_forward`` received them (``q, k, v`` in their own dtype), plus
        ``d_out`` (..., T, d_v), ``out`` and ``lse`` as it returned them.

    Returns:
        ``(dq, dk, dv, dbias)`` in the dtypes and shapes of q, k, v and bias (dbias
        None unless ``bias_grad``). Arithmetic in the dtype of ``lse``.

    Source: Dao 2023, algorithm 2; Dao et al. 2022, appendix B.2 (dS = P * (dP - D)).
    """
    *lead, t, _ = q.shape
    s = k.shape[-2]
    work = lse.dtype
    q_s = q.to(work) * tiles.scale  # (..., T, d_k), as the forward scaled it
    k, v, d_out = k.to(work), v.to(work), d_out.to(work)
    delta = (d_out * out.to(work)).sum(dim=-1, keepdim=True)  # D (..., T, 1)
    dq, dk, dv = torch.zeros_like(q_s), torch.zeros_like(k), torch.zeros_like(v)
    bias_full = None if bias is None else bias.expand(*lead, t, s)  # a view
    dbias = q_s.new_zeros((*lead, t, s)) if bias_grad else None
    for k0 in range(0, s, tiles.block_k):
        cols = slice(k0, min(k0 + tiles.block_k, s))
        k_blk, v_blk = k[..., cols, :], v[..., cols, :]  # (..., bk, d)
        first = max(0, k0 - (s - t)) if tiles.causal else 0  # first query to see k0
        for q0 in range(first - first % tiles.block_q, t, tiles.block_q):
            rows = slice(q0, min(q0 + tiles.block_q, t))
            q_blk, do_blk = q_s[..., rows, :], d_out[..., rows, :]  # (..., bq, d)
            scores = tile_scores(
                q_blk, k_blk, mask, bias_full, tiles, rows, cols, s - t
            )
            p = scores.sub_(lse[..., rows, :]).exp_()  # P again; hidden keys: 0
            dv[..., cols, :] += p.transpose(-2, -1) @ do_blk  # (..., bk, d_v)
            dp = do_blk @ v_blk.transpose(-2, -1)  # (..., bq, bk)
            ds = dp.sub_(delta[..., rows, :]).mul_(p)  # dS = P * (dP - D), in place
            if dbias is not None:
                dbias[..., rows, cols] = ds
            dq[..., rows, :] += ds @ k_blk  # (..., bq, d_k)
            dk[..., cols, :] += ds.transpose(-2, -1) @ q_blk  # already scaled
    dq = (dq * tiles.scale).to(q.dtype)
    if dbias is not None:
        dbias = dbias.sum_to_size(bias.shape).to(bias.dtype)
    return dq, dk.to(k.dtype), dv.to(v.dtype), dbias


class TiledAttention(torch.autograd.Function):
    """``tiled_forward`` with ``tiled_backward`` as its gradient.

    ``TiledAttention.apply(q, k, v, mask, bias, tiles)`` returns out (..., T, d_v)
    in the dtype of ``q`` (arithmetic in float32 for float16/bfloat16 inputs); it
    saves the inputs, the output and the (..., T, 1) log-sum-exp, never a tile.
    Inputs are validated by ``tiled_attention``, which is what to call.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, bias, tiles: Tiles):
        low = q.dtype in (torch.float16, torch.bfloat16)
        work = torch.float32 if low else q.dtype
        out, lse = tiled_forward(q.to(work), k.to(work), v.to(work), mask, bias, tiles)
        out = out.to(q.dtype)
        ctx.tiles = tiles
        ctx.save_for_backward(q, k, v, out, lse, mask, bias)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse, mask, bias = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[4]
        dq, dk, dv, dbias = tiled_backward(
            d_out, q, k, v, out, lse, mask, bias, ctx.tiles, bias_grad
        )
        return dq, dk, dv, None, dbias, None


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
