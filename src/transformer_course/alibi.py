"""ALiBi: attention with linear biases instead of position embeddings.

Each head h adds -m_h * distance to its attention scores, with a fixed geometric slope
m_h per head; nothing is added to the token vectors. Derived in chapter 4 ("Positional
encoding"); ``model.py`` uses it for ``TransformerConfig(positional="alibi")``.
Shape letters: B batch, H heads, T query length, S key length.

Source: Press, Smith and Lewis 2022, "Train Short, Test Long: Attention with Linear
Biases Enables Input Length Extrapolation", section 3.
"""

from __future__ import annotations

import math

import torch

from transformer_course import _validation

Tensor = torch.Tensor


def alibi_slopes(n_heads: int) -> Tensor:
    """Head-specific slopes m_h: the geometric sequence 2^(-8/n), 2^(-16/n), ... for a
    power-of-two ``n_heads``; otherwise the slopes of the nearest lower power of two
    followed by every other slope of the next one (the paper's recipe).

    Returns:
        Float tensor (H,). Raises TypeError / ValueError for a bad ``n_heads``.

    Source: Press et al. 2022, section 3.
    """
    _validation.positive_int("n_heads", n_heads)
    p = 2 ** math.floor(math.log2(n_heads))

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    slopes = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes)


def alibi_bias(
    n_heads: int,
    q_len: int,
    k_len: int | None = None,
    *,
    positions: Tensor | None = None,
    device=None,
) -> Tensor:
    """ALiBi: a bias -m_h * |i - j| added to the attention scores, no embedding at all.

    Queries are the last ``q_len`` of the ``k_len`` tokens (bottom-right aligned like
    ``masks.causal_mask``): query i sits at position i + k_len - q_len. Under a causal
    mask only j <= i is used, where the bias is the paper's -m_h * (i - j); the absolute
    value makes it usable without a causal mask too.

    Args:
        n_heads: number of heads H (one slope each).
        q_len: queries T; k_len: keys S (default T).
        positions: optional positions of the S keys, (S,) or (B, S), e.g.
            ``position_ids(S, keep=attention_mask)`` for left-padded rows; default
            0, ..., S - 1. The distance is taken between positions.
        device: where to build it (default: that of ``positions``).

    Returns:
        Float tensor (H, T, S), or (B, H, T, S) for (B, S) positions: 0 on the
        (aligned) diagonal, negative elsewhere. Add it to the (B, H, T, S) scores
        before the softmax (``bias=`` of the attention functions).

    Raises:
        TypeError / ValueError: for non-int or non-positive sizes, positions that are
        not integers of length S, or T > S.

    Source: Press et al. 2022, section 3, figure 3.
    """
    k_len = q_len if k_len is None else k_len
    _validation.positive_int("q_len", q_len)
    _validation.positive_int("k_len", k_len, q_len)
    if positions is None:
        positions = torch.arange(k_len, device=device)
    _validation.positions(positions, k_len, allow_negative=True)
    i = positions[..., -q_len:, None]  # (..., T, 1): the queries are the last T
    j = positions[..., None, :]  # (..., 1, S)
    distance = (i - j).abs().float()  # (..., T, S)
    slopes = alibi_slopes(n_heads).to(distance.device)[:, None, None]  # (H, 1, 1)
    if distance.dim() == 3:
        return -slopes * distance[:, None]  # (B, H, T, S)
    return -slopes * distance  # (H, T, S)
