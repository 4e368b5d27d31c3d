"""Attention functions: scaled dot-product, additive (Bahdanau), and the backend registry.

Derived in chapter 1 (queries, keys and values) and chapter 2 (scaled dot-product
attention). Shape letters used throughout:

    B batch, H heads, T query length, S key length, d_k query/key size, d_v value size.

Masks are bool with True = may attend (see ``masks.py``). A query whose keys are all
masked gets an all-zero weight row and a zero output, never NaN, in forward and backward.

Sources:
    Vaswani et al. 2017, "Attention Is All You Need", section 3.2.1, equation (1).
    Bahdanau, Cho and Bengio 2014, "Neural Machine Translation by Jointly Learning to
    Align and Translate", section 3.1 and appendix A.1.1 (additive attention).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- checks


def _check_tensor(name: str, x, min_dim: int = 2) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name}: expected at least {min_dim} dimensions (..., length, features), "
            f"got shape {tuple(x.shape)}"
        )


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Validate query, key and value tensors for attention.

    Raises:
        TypeError: if one is not a floating-point tensor, or dtypes differ.
        ValueError: if q and k disagree on d_k, k and v on the number of keys S, or
            the leading (batch/head) dimensions differ. The message names the
            argument and both shapes.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected d_k = {q.shape[-1]} to match q (..., T, d_k) = "
            f"{tuple(q.shape)}, got k shape {tuple(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: expected S = {k.shape[-2]} keys to match k (..., S, d_k) = "
            f"{tuple(k.shape)}, got v shape {tuple(v.shape)}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "q, k, v: expected the same leading (batch, head) dimensions, got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


def _check_dropout_p(dropout_p: float) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: expected a probability in [0, 1), got {dropout_p}")


def check_mask(mask, scores_shape: tuple[int, ...]) -> None:
    """Validate a bool mask against the shape of the scores (..., T, S) it will hide.

    Raises:
        TypeError: if the mask is not a bool tensor (float additive masks included,
            pitfall P4).
        ValueError: if it does not broadcast to ``scores_shape`` without growing it.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask: expected a bool torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask: expected a bool mask (True = may attend), got dtype {mask.dtype}. "
            "Float additive masks are rejected so they cannot be silently mixed with "
            "bool ones (pitfall P4); convert with `mask = float_mask == 0`."
        )
    try:
        ok = torch.broadcast_shapes(mask.shape, scores_shape) == tuple(scores_shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask: expected a shape that broadcasts to the scores (..., T, S) = "
            f"{tuple(scores_shape)}, e.g. (T, S), (B, 1, 1, S) or (B, H, T, S); "
            f"got {tuple(mask.shape)}"
        )


# ---------------------------------------------------------------------------- softmax


def masked_softmax(scores: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Numerically stable softmax over ``dim`` that gives exact zeros where masked.

    Subtracts the row maximum before exponentiating (so large scores cannot overflow),
    sets masked entries to exp(-inf) = 0, and divides by the row sum only where the row
    has a visible key: a fully masked row comes out all zero, with zero gradients, not
    NaN (pitfall P1) and not uniform (pitfall P6). Half-precision scores are
    exponentiated in float32 and the result cast back.

    Shapes: ``scores`` (..., T, S); ``mask`` bool, broadcastable to it, True = keep.
    Returns: weights with the shape and dtype of ``scores``.
    """
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if mask is not None:
        work = work.masked_fill(~mask, float("-inf"))
    row_max = work.amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(work - row_max)  # masked entries: exp(-inf) = 0
    denom = exp.sum(dim=dim, keepdim=True)
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))  # empty rows stay 0
    return (exp / denom).to(scores.dtype)


# ------------------------------------------------------------------ dot-product attention


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k)) v, written out step by step ("naive" backend).

    Args:
        q: queries (..., T, d_k), floating point.
        k: keys (..., S, d_k), same dtype and leading dimensions as ``q``.
        v: values (..., S, d_v).
        mask: optional bool mask broadcastable to (..., T, S), True = may attend.
            Typical shapes: (T, S), (B, 1, 1, S), (B, H, T, S).
        dropout_p: probability of zeroing a weight (training only; the survivors are
            scaled by 1 / (1 - dropout_p)). Pass 0.0 in evaluation.
        scale: multiplier of the scores; default 1 / sqrt(d_k).

    Returns:
        ``(out, weights)``: ``out`` (..., T, d_v) and the softmax ``weights``
        (..., T, S) before dropout, each row summing to 1, or to 0 for a query with no
        visible key.

    Raises:
        TypeError: non-tensor or non-float inputs, mixed dtypes, a non-bool mask.
        ValueError: mismatched d_k or S, different leading dimensions, a mask that does
            not broadcast to (..., T, S), ``dropout_p`` outside [0, 1).

    Source: Vaswani et al. 2017, section 3.2.1, equation (1).
    """
    check_qkv(q, k, v)
    _check_dropout_p(dropout_p)
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if mask is not None:
        check_mask(mask, scores.shape)
    weights = masked_softmax(scores, mask)  # (..., T, S)
    used = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return used @ v, weights  # (..., T, d_v), (..., T, S)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, None]:
    """PyTorch's fused ``F.scaled_dot_product_attention`` behind this library's signature.

    Same arguments, checks and mask convention (True = may attend) as
    ``scaled_dot_product_attention``. Fused kernels do not materialise the weights, so
    the second return value is ``None``. Queries with no visible key get a zero output
    on every backend: PyTorch's SDPA returns zeros for them on CPU and CUDA since 2.5
    (pytorch/pytorch PR 133882) but NaN on MPS and in older versions, so their mask row
    is opened before the call and their output zeroed after, and no NaN reaches the
    gradients either (pitfall P1).
    """
    check_qkv(q, k, v)
    _check_dropout_p(dropout_p)
    has_key = None
    if mask is not None:
        check_mask(mask, (*q.shape[:-1], k.shape[-2]))
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        mask = mask | ~has_key  # an empty row attends everywhere, then is zeroed
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale
    )
    if has_key is not None:
        out = torch.where(has_key, out, torch.zeros_like(out))
    return out, None


AttentionFn = Callable[..., tuple[Tensor, "Tensor | None"]]

#: Interchangeable attention implementations with one signature
#: ``fn(q, k, v, mask=None, *, dropout_p=0.0, scale=None) -> (out, weights or None)``.
ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "naive": scaled_dot_product_attention,
    "sdpa": sdpa_attention,
}


# -------------------------------------------------------------------- additive attention


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
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: expected S = {k.shape[-2]} keys to match k {tuple(k.shape)}, "
            f"got v shape {tuple(v.shape)}"
        )
    d_hidden = w_score.shape[-1]
    if w_score.dim() != 1:
        raise ValueError(f"w_score: expected shape (d_hidden,), got {tuple(w_score.shape)}")
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
    if mask is not None:
        check_mask(mask, scores.shape)
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


# ------------------------------------------------------------------ multi-head attention


class KVCacheLike(Protocol):
    """What ``MultiHeadAttention.forward(..., cache=...)`` needs from a KV cache
    (``decoding.KVCache`` is one): ``update(k, v)`` appends this step's projected keys
    and values, each (B, H, S_new, d_k), and returns all of them so far,
    ``(k_all, v_all)``, each (B, H, S_past + S_new, d_k)."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


def _check_sequence(name: str, x, d_model: int) -> None:
    _check_tensor(name, x, min_dim=3)
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name}: expected shape (B, length, d_model) with d_model = {d_model}, "
            f"got {tuple(x.shape)}"
        )


class MultiHeadAttention(nn.Module):
    """Multi-head attention: H scaled dot-product attentions in learned subspaces.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O with
    head_h = Attention(Q W^Q_h, K W^K_h, V W^V_h), d_k = d_v = d_model / H.
    The H projections W^Q_h are stored as one (d_model, d_model) ``nn.Linear`` whose
    output rows h*d_k:(h+1)*d_k belong to head h (likewise for keys and values), so the
    cost equals one head of width d_model. Derived in chapter 3.

    Args:
        d_model: model width D (> 0), divisible by ``n_heads``.
        n_heads: number of heads H (> 0).
        dropout: dropout probability on the attention weights, used in training only.
        bias: whether the four projections have a bias.
        backend: name of an entry of ``ATTENTION_BACKENDS`` ("naive", "sdpa", ...),
            looked up at every call, so backends registered later can be chosen.

    Shapes (forward):
        query (B, T, D), key and value (B, S, D), floating point, one dtype.
        mask: bool, True = may attend, broadcastable to (B, H, T, S): e.g. a causal
            (T, S) mask, a padding (B, 1, 1, S) mask, a per-head (B, H, T, S) mask.
        Returns ``(out, weights)``: out (B, T, D); weights (B, H, T, S) per head, each
        row summing to 1 (0 for a query with no visible key), taken before dropout.
        ``weights`` is None when ``need_weights=False`` or the backend does not
        compute them (e.g. "sdpa"). Average over dim 1 for a per-layer view (P13).

    Raises:
        TypeError: non-int sizes, non-tensor or non-float inputs, a non-bool mask.
        ValueError: d_model not divisible by n_heads, a dropout outside [0, 1), an
            unknown backend, inputs whose shapes do not match (B, T, D) / (B, S, D),
            a mask that does not broadcast to (B, H, T, S).

    Source: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.2.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "naive",
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value}")
        if d_model % n_heads:
            raise ValueError(
                f"d_model: expected a multiple of n_heads = {n_heads}, got {d_model}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.backend = backend
        self._backend_fn()  # fail early on an unknown name
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q of all heads
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W^K of all heads
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W^V of all heads
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O

    def _backend_fn(self) -> AttentionFn:
        if self.backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"backend: expected one of {sorted(ATTENTION_BACKENDS)}, "
                f"got {self.backend!r}"
            )
        return ATTENTION_BACKENDS[self.backend]

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, d_k): head h gets features h*d_k:(h+1)*d_k (P8)."""
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, L, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, d_k) -> (B, L, D): token t = [head 0 | head 1 | ...] (P9, P10)."""
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.d_model)  # (B, L, D)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        cache: KVCacheLike | None = None,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, T, D) to ``key``/``value`` (B, S, D).

        With ``cache``, this call's projected keys and values are appended to it with
        ``cache.update(k, v)`` and the queries attend to everything it returns, so
        ``mask`` must then broadcast to (B, H, T, S_past + S).
        """
        for name, x in (("query", query), ("key", key), ("value", value)):
            _check_sequence(name, x, self.d_model)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                "query, key, value: expected (B, T, D), (B, S, D), (B, S, D), got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        attend = self._backend_fn()
        q = self.split_heads(self.q_proj(query))  # (B, H, T, d_k)
        k = self.split_heads(self.k_proj(key))  # (B, H, S, d_k)
        v = self.split_heads(self.v_proj(value))  # (B, H, S, d_k)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H, S_past + S, d_k) each
        if mask is not None:
            B, H, T, S = (*q.shape[:3], k.shape[2])
            if isinstance(mask, Tensor) and mask.dim() > 4:
                raise ValueError(
                    f"mask: expected at most 4 dimensions (B, H, T, S) = "
                    f"{(B, H, T, S)}, got {tuple(mask.shape)}"
                )
            check_mask(mask, (B, H, T, S))
        p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, mask, dropout_p=p)  # (B, H, T, d_k), (B, H, T, S)
        out = self.out_proj(self.merge_heads(out))  # (B, T, D)
        return out, (weights if need_weights else None)

    @torch.no_grad()
    def load_from_torch_mha(self, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` into this module (used
        by the parity tests). PyTorch stacks W^Q, W^K, W^V in ``in_proj_weight``
        (3D, D) in that order. Returns ``self``.

        Raises:
            TypeError: if ``mha`` is not an ``nn.MultiheadAttention``.
            ValueError: if its d_model, n_heads or bias differ from this module's, or it
                uses features this module does not have (kdim/vdim != embed_dim,
                add_bias_kv).
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(
                f"mha: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}"
            )
        theirs = (mha.embed_dim, mha.num_heads, mha.in_proj_bias is not None)
        ours = (self.d_model, self.n_heads, self.q_proj.bias is not None)
        if theirs != ours:
            raise ValueError(
                f"mha: expected (d_model, n_heads, bias) = {ours}, got {theirs}"
            )
        if not mha._qkv_same_embed_dim or mha.bias_k is not None:
            raise ValueError(
                "mha: kdim/vdim != embed_dim and add_bias_kv are not supported"
            )
        projections = (self.q_proj, self.k_proj, self.v_proj)
        for proj, w in zip(projections, mha.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        if mha.in_proj_bias is not None:
            for proj, b in zip(projections, mha.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            self.out_proj.bias.copy_(mha.out_proj.bias)
        self.out_proj.weight.copy_(mha.out_proj.weight)
        return self

    @classmethod
    def from_torch_mha(cls, mha: nn.MultiheadAttention, **kwargs) -> MultiHeadAttention:
        """A new module with the sizes, dropout and weights of ``mha`` (see
        ``load_from_torch_mha``); ``kwargs`` (e.g. ``backend``) go to the constructor."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(
                f"mha: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}"
            )
        kwargs.setdefault("dropout", mha.dropout)
        module = cls(
            mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None, **kwargs
        )
        module = module.to(mha.in_proj_weight.device, mha.in_proj_weight.dtype)
        return module.load_from_torch_mha(mha)
