"""Sliding-window (banded, local) attention, computed band by band in O(T * window).

Derived in chapter 7 ("Making attention fast"). Shape letters: T query length,
S key length, d_k query/key size, d_v value size. Masks are bool with True = may attend.

Sources:
    Beltagy et al. 2020, "Longformer: The Long-Document Transformer", section 3.1;
    Jiang et al. 2023, "Mistral 7B", section 2 (sliding-window attention).
"""

from __future__ import annotations

import torch

from transformer_course import _validation
from transformer_course.attention import scaled_dot_product_attention
from transformer_course.masks import sliding_window_mask

Tensor = torch.Tensor


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    mask: Tensor | None = None,
    *,
    block: int | None = None,
    scale: float | None = None,
) -> tuple[Tensor, None]:
    """Causal sliding-window attention computed band by band, in O(T * window) time.

    Query i (aligned to the last T keys, like ``causal_mask``) sees the ``window``
    keys ending at its own position. Queries are taken ``block`` at a time; a block
    [q0, q1) only needs the keys from q0 - window + 1 to q1 - 1, so each block costs
    block * (block + window) scores and the total grows linearly with T. The result
    equals full attention with ``sliding_window_mask(T, window, S)``.

    Args:
        q: queries (..., T, d_k); k: keys (..., S, d_k) with S >= T; v: (..., S, d_v).
        window: keys each query sees, itself included (>= 1). ``window >= S`` gives
            full causal attention.
        mask: optional extra bool mask broadcastable to (..., T, S) (e.g. padding).
        block: queries per band (default: ``window``, capped at 256).
        scale: multiplier of the scores; default 1 / sqrt(d_k).

    Returns:
        ``(out, None)``: ``out`` (..., T, d_v).

    Raises:
        TypeError / ValueError: as ``scaled_dot_product_attention``, plus a window or
        block < 1, or fewer keys than queries.

    Source: Beltagy et al. 2020, section 3.1; Jiang et al. 2023, section 2.
    """
    _validation.qkv(q, k, v)
    _validation.positive_int("window", window)
    block = min(window, 256) if block is None else block
    _validation.positive_int("block", block)
    *lead, t, _ = q.shape
    s = k.shape[-2]
    if s < t:
        raise ValueError(
            f"k: expected at least as many keys as queries (S >= T = {t}), "
            f"got k shape {tuple(k.shape)}"
        )
    if mask is not None:
        _validation.bool_mask(mask, (*lead, t, s))
        mask = mask.expand(*lead, t, s)
    offset = s - t  # query i sits at key position i + offset
    outs = []
    for q0 in range(0, t, block):
        q1 = min(q0 + block, t)
        k0 = max(0, q0 + offset - window + 1)  # first key any query in the band sees
        k1 = q1 + offset  # one past the last key it sees
        band = sliding_window_mask(q1 - q0, window, k1 - k0, device=q.device)
        # band: (bq, bk), each query sees its last `window` keys
        if mask is not None:
            band = band & mask[..., q0:q1, k0:k1]  # (..., bq, bk)
        out, _ = scaled_dot_product_attention(
            q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :], band, scale=scale
        )  # (..., bq, d_v)
        outs.append(out)
    return torch.cat(outs, dim=-2), None  # (..., T, d_v)
