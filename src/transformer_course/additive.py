"""Additive (Bahdanau) attention: the score of a query and a key is a small neural
network, w . tanh(W_q q + W_k k), the attention that came before dot products.

Derived in chapter 1 (queries, keys and values). Shape letters: T query length, S key
length, d_q / d_k / d_v query, key and value sizes, d_hidden the tanh layer's width.
Masks are bool with True = may attend.

Source: Bahdanau, Cho and Bengio 2014, "Neural Machine Translation by Jointly Learning
to Align and Translate", section 3.1 and appendix A.1.1.
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.attention import masked_softmax

Tensor = torch.Tensor


def additive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_score: Tensor,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Additive (Bahdanau) attention: score(q, k) = w_score . tanh(W_q q + W_k k).

    Args:
        q: queries (..., T, d_q).
        k: keys (..., S, d_k); q and k may have different sizes.
        v: values (..., S, d_v).
        w_q: (d_hidden, d_q) projection of the queries.
        w_k: (d_hidden, d_k) projection of the keys.
        w_score: (d_hidden,) vector that turns each hidden feature into a score.
        mask: optional bool mask broadcastable to (..., T, S), True = may attend.

    Returns:
        ``(out, weights)``: (..., T, d_v) and (..., T, S).

    Raises:
        TypeError / ValueError: as ``scaled_dot_product_attention``, plus projection
        shapes that do not match ``q``, ``k`` or each other.

    Cost: it builds a (..., T, S, d_hidden) tensor, where dot-product attention needs
    only the (..., T, S) scores; that is why Vaswani et al. (2017, section 3.2.1) chose
    dot products.

    Source: Bahdanau et al. 2014, section 3.1 and appendix A.1.1.
    """
    _validation.float_tensor("q", q)
    _validation.float_tensor("k", k)
    _validation.float_tensor("v", v)
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: expected S = {k.shape[-2]} keys to match k {tuple(k.shape)}, "
            f"got v shape {tuple(v.shape)}"
        )
    d_hidden = w_score.shape[-1]
    if w_score.dim() != 1:
        raise ValueError(
            f"w_score: expected shape (d_hidden,), got {tuple(w_score.shape)}"
        )
    if tuple(w_q.shape) != (d_hidden, q.shape[-1]):
        raise ValueError(
            f"w_q: expected shape (d_hidden, d_q) = {(d_hidden, q.shape[-1])}, "
            f"got {tuple(w_q.shape)}"
        )
    if tuple(w_k.shape) != (d_hidden, k.shape[-1]):
        raise ValueError(
            f"w_k: expected shape (d_hidden, d_k) = {(d_hidden, k.shape[-1])}, "
            f"got {tuple(w_k.shape)}"
        )
    features = torch.tanh(
        (q @ w_q.T).unsqueeze(-2)  # (..., T, 1, d_hidden)
        + (k @ w_k.T).unsqueeze(-3)  # (..., 1, S, d_hidden)
    )  # (..., T, S, d_hidden)
    scores = features @ w_score  # (..., T, S)
    _validation.bool_mask(mask, scores.shape)
    weights = masked_softmax(scores, mask)
    return weights @ v, weights


class AdditiveAttention(nn.Module):
    """Additive attention with learned projections (Bahdanau et al. 2014, section 3.1).

    Args:
        d_q: query size; d_k: key size; d_hidden: size of the tanh layer.

    ``forward(q, k, v, mask=None)`` takes and returns what ``additive_attention`` does.
    """

    def __init__(self, d_q: int, d_k: int, d_hidden: int):
        super().__init__()
        self.w_q = nn.Linear(d_q, d_hidden, bias=False)
        self.w_k = nn.Linear(d_k, d_hidden, bias=False)
        self.w_score = nn.Linear(d_hidden, 1, bias=False)

    def forward(self, q, k, v, mask=None):
        return additive_attention(
            q, k, v, self.w_q.weight, self.w_k.weight, self.w_score.weight[0], mask
        )
