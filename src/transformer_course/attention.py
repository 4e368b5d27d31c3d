"""Attention: scaled dot-product, the backend registry, and multi-head attention.

Derived in chapters 2 and 3; biases, grouped-query heads and head gates serve
chapters 4, 7 and 9. Shape letters: B batch, H query heads, H_kv key/value heads,
T query length, S key length, D d_model, d_k query/key size, d_v value size.

Masks are bool with True = may attend (see ``masks.py``). A query whose keys are all
masked gets an all-zero weight row and a zero output, never NaN (forward and backward).
Float offsets of the scores (ALiBi, relative positions) go through ``bias``, never
through the mask (pitfall P4).

Sources:
    Vaswani et al. 2017, "Attention Is All You Need", sections 3.2.1 and 3.2.2.
    Shazeer 2019 (multi-query attention); Ainslie et al. 2023, "GQA", section 2.
    Michel et al. 2019, "Are Sixteen Heads Really Better than One?", section 2.2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course import _validation
from transformer_course.flash import tiled_attention

if TYPE_CHECKING:
    from transformer_course.positional import RotaryEmbedding

Tensor = torch.Tensor


def masked_softmax(scores: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Numerically stable softmax over ``dim`` that gives exact zeros where masked.

    Subtracts the row maximum (so large scores cannot overflow), sets masked entries to
    exp(-inf) = 0, and divides by the row sum only where the row has a visible key: a
    fully masked row is all zero with zero gradients, not NaN (P1) nor uniform (P6).
    Half-precision scores are exponentiated in float32 and the result cast back.

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


# -------------------------------------------------------------- dot-product attention


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k) + bias) v, written out step by step ("naive" backend).

    Args:
        q: queries (..., T, d_k), floating point.
        k: keys (..., S, d_k), same dtype and leading dimensions as ``q``.
        v: values (..., S, d_v).
        mask: optional bool mask broadcastable to (..., T, S), True = may attend,
            e.g. (T, S), (B, 1, 1, S), (B, H, T, S).
        bias: optional float offsets of the scaled scores, broadcastable to
            (..., T, S), e.g. ALiBi's (H, T, S).
        dropout_p: probability of zeroing a weight (training only; survivors are
            scaled by 1 / (1 - dropout_p)).
        scale: multiplier of the scores; default 1 / sqrt(d_k).

    Returns:
        ``(out, weights)``: ``out`` (..., T, d_v) and the softmax ``weights``
        (..., T, S) before dropout, each row summing to 1, or to 0 for a query with no
        visible key.

    Raises:
        TypeError: non-tensor or non-float inputs, mixed dtypes, a non-bool mask (P4),
            a non-float bias.
        ValueError: mismatched d_k or S, different leading dimensions, a mask or bias
            that does not broadcast to (..., T, S), ``dropout_p`` outside [0, 1).

    Source: Vaswani et al. 2017, section 3.2.1, equation (1).
    """
    _validation.qkv(q, k, v)
    _validation.probability("dropout_p", dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    _validation.bool_mask(mask, scores.shape)
    _validation.score_bias(bias, scores.shape)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    weights = masked_softmax(scores, mask)  # (..., T, S)
    used = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return used @ v, weights  # (..., T, d_v), (..., T, S)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, None]:
    """PyTorch's fused ``F.scaled_dot_product_attention`` behind this signature.

    Same arguments, checks and mask convention (True = may attend) as
    ``scaled_dot_product_attention``; fused kernels do not materialise the weights, so
    the second return value is ``None``. Queries with no visible key get a zero output
    on every backend: PyTorch's SDPA returns zeros for them on CPU and CUDA since 2.5
    (pytorch/pytorch PR 133882) but NaN on MPS and in older versions, so their mask row
    is opened before the call and their output zeroed after, and no NaN reaches the
    gradients either (pitfall P1). A ``bias`` goes to PyTorch as a float
    ``attn_mask``, -inf where ``mask`` is False.

    Grouped-query keys and values may come as they are: q (B, H, T, d_k) with k, v
    (B, H_kv, S, d) for H_kv a divisor of H, query head h reading key/value head
    h // (H / H_kv) without a copy of it per query head (PyTorch's ``enable_gqa``).
    """
    _validation.qkv(q, k, v, grouped=True)
    _validation.probability("dropout_p", dropout_p)
    scores_shape = (*q.shape[:-1], k.shape[-2])  # (..., T, S)
    _validation.bool_mask(mask, scores_shape)
    _validation.score_bias(bias, scores_shape)
    has_key = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        mask = mask | ~has_key  # an empty row attends everywhere, then is zeroed
    attn_mask = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = torch.where(mask, attn_mask, float("-inf"))  # (..., T, S)
    gqa = q.shape[:-2] != k.shape[:-2]  # H_kv < H key/value heads
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )  # (..., T, d_v)
    if has_key is not None:
        out = torch.where(has_key, out, torch.zeros_like(out))
    return out, None


AttentionFn = Callable[..., tuple[Tensor, "Tensor | None"]]

#: Interchangeable attention with one signature ``fn(q, k, v, mask=None, *, bias=None,
#: dropout_p=0.0, scale=None) -> (out, weights or None)``: the step-by-step reference,
#: PyTorch's fused kernels, and chapter 7's tiled FlashAttention (``flash.py``).
ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "naive": scaled_dot_product_attention,
    "sdpa": sdpa_attention,
    "tiled": tiled_attention,
}
#: The backends that take grouped-query keys and values as they are (H_kv heads).
GROUPED_KV_BACKENDS = frozenset({sdpa_attention})


# --------------------------------------------------------------- multi-head attention


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Repeat each key/value head ``n_rep`` times so H_kv heads serve H = H_kv * n_rep
    query heads: head h of the result is head h // n_rep of ``x``.

    Shapes: x (B, H_kv, S, d) -> (B, H_kv * n_rep, S, d); ``x`` itself if n_rep is 1.
    Raises ValueError if ``x`` is not 4-D or ``n_rep`` < 1. Source: Ainslie et al. 2023.
    """
    _validation.positive_int("n_rep", n_rep)
    if x.dim() != 4:
        raise ValueError(f"x: expected shape (B, H_kv, S, d), got {tuple(x.shape)}")
    if n_rep == 1:
        return x
    b, h_kv, s, d = x.shape
    x = x[:, :, None, :, :].expand(b, h_kv, n_rep, s, d)  # (B, H_kv, n_rep, S, d)
    return x.reshape(b, h_kv * n_rep, s, d)  # (B, H, S, d)


class KVCacheLike(Protocol):
    """A KV cache (``decoding.KVCache`` is one): ``update(k, v)`` appends this step's
    keys and values (B, H_kv, S_new, d_k) and returns all so far (B, H_kv, S_past +
    S_new, d_k); ``length`` (S_past) is read by rotary attention without positions."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


@torch.no_grad()
def keep_features(linear: nn.Linear, index: Tensor, dim: int) -> nn.Linear:
    """A new ``nn.Linear`` with the output rows (``dim`` 0) or the input columns
    (``dim`` 1) ``index`` (1-d integer) of ``linear``'s weight (out, in), on its device
    and dtype; the bias follows the output rows. Removing heads (``prune_heads``) and
    feed-forward neurons (``prune.remove_ffn_neurons``) both come down to this."""
    w = linear.weight.index_select(dim, index)
    new = nn.Linear(w.shape[1], w.shape[0], bias=linear.bias is not None)
    new = new.to(w.device, w.dtype)
    new.weight.copy_(w)
    if linear.bias is not None:
        new.bias.copy_(linear.bias if dim == 1 else linear.bias[index])
    return new


class MultiHeadAttention(nn.Module):
    """Multi-head attention: H scaled dot-product attentions in learned subspaces.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, head_h = Attention(Q W^Q_h,
    K W^K_h, V W^V_h), d_k = d_v = d_model / H unless ``head_dim`` sets it. The H
    matrices W^Q_h are one ``nn.Linear`` whose output rows h*d_k:(h+1)*d_k belong to
    head h (so are W^K, W^V).
    With ``n_kv_heads`` < H, groups of H / n_kv_heads query heads share a key/value head
    (grouped-query attention; 1 = multi-query): W^K, W^V and a KV cache shrink by that
    factor, and each key/value head is repeated for its group (``repeat_kv``), except
    where the backend shares it without a copy: "sdpa" without ``mask`` and ``bias``
    (``GROUPED_KV_BACKENDS``), as in every step of cached decoding of one sequence.

    Args:
        d_model: model width D, divisible by ``n_heads`` H (query heads) unless
            ``head_dim`` is given.
        n_kv_heads: key/value heads H_kv, a divisor of H (default H).
        head_dim: d_k of every head (default D / H; Gemma's and Qwen3's differ).
        dropout: dropout probability on the attention weights, used in training only.
        bias: whether the four projections have a bias.
        backend: name of an entry of ``ATTENTION_BACKENDS``, looked up at every call.
        rotary: optional ``positional.RotaryEmbedding`` of size d_k, applied to the
            queries and keys of self-attention at their absolute positions.

    Shapes (forward): query (B, T, D), key and value (B, S, D), one float dtype.
        mask: bool, True = may attend, broadcastable to (B, H, T, S).
        bias: float offsets added to the scores, broadcastable to (B, H, T, S).
        cache: a ``KVCacheLike``; the queries then attend to S_past + S keys.
        head_mask: float gates (H,) or (B, H) multiplying each head's output.
        positions: absolute positions (T,) or (B, T) of the new tokens, for ``rotary``
            (default: S_past, ..., S_past + T - 1; pitfall P16).
        Returns ``(out, weights)``: out (B, T, D); per-head weights (B, H, T, S) before
        dropout and gates (P13), or None (``need_weights=False``, fused backends).

    Raises:
        TypeError: non-int sizes, non-float inputs, bias or head_mask, a non-bool mask.
        ValueError: sizes that do not divide, a dropout outside [0, 1), an unknown
            backend, inputs not (B, T, D) / (B, S, D), a mask or bias that does not
            broadcast to (B, H, T, S), a head_mask not (H,) or (B, H).

    Source: Vaswani et al. 2017, section 3.2.2; Ainslie et al. 2023, section 2.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "naive",
        rotary: RotaryEmbedding | None = None,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _validation.positive_int("d_model", d_model)
        _validation.positive_int("n_heads", n_heads)
        _validation.positive_int("n_kv_heads", n_kv_heads)
        _validation.probability("dropout", dropout)
        if head_dim is None:
            _validation.multiple("d_model", d_model, "n_heads", n_heads)
            head_dim = d_model // n_heads
        _validation.positive_int("head_dim", head_dim)
        _validation.divisor("n_kv_heads", n_kv_heads, "n_heads", n_heads)
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, head_dim
        self.n_kv_heads, self.dropout, self.backend = n_kv_heads, dropout, backend
        self.pruned_heads: set[int] = set()  # removed heads, original indices
        self._backend_fn()  # fail early on an unknown name
        self.rotary = rotary
        d_q, d_kv = n_heads * head_dim, n_kv_heads * head_dim
        self.q_proj = nn.Linear(d_model, d_q, bias=bias)  # W^Q of all heads
        self.k_proj = nn.Linear(d_model, d_kv, bias=bias)  # W^K of the H_kv heads
        self.v_proj = nn.Linear(d_model, d_kv, bias=bias)  # W^V of the H_kv heads
        self.out_proj = nn.Linear(d_q, d_model, bias=bias)  # W^O

    def _backend_fn(self) -> AttentionFn:
        _validation.one_of("backend", self.backend, ATTENTION_BACKENDS)
        return ATTENTION_BACKENDS[self.backend]

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, n * d_k) -> (B, n, L, d_k) for n = H or H_kv heads: head h gets
        features h*d_k:(h+1)*d_k of every token (P8)."""
        B, L, _ = x.shape
        return x.view(B, L, -1, self.d_k).transpose(1, 2)  # (B, n, L, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, d_k) -> (B, L, H * d_k): token t = [head 0 | head 1 | ...] (P9)."""
        B, H, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, H * self.d_k)  # (B, L, H * d_k)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        bias: Tensor | None = None,
        cache: KVCacheLike | None = None,
        head_mask: Tensor | None = None,
        positions: Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, T, D) to ``key``/``value`` (B, S, D)."""
        _validation.query_key_value(query, key, value, self.d_model)
        attend = self._backend_fn()
        q = self.split_heads(self.q_proj(query))  # (B, H, T, d_k)
        k = self.split_heads(self.k_proj(key))  # (B, H_kv, S, d_k)
        v = self.split_heads(self.v_proj(value))  # (B, H_kv, S, d_k)
        if self.rotary is not None:  # new keys sit at the new queries' positions
            if positions is None:
                past = 0 if cache is None else cache.length
                positions = torch.arange(past, past + q.shape[2], device=q.device)
            q, k = self.rotary(q, k, positions, positions)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H_kv, S_past + S, d_k) each
        B, H, T, S = (*q.shape[:3], k.shape[2])
        _validation.bool_mask(mask, (B, H, T, S))
        _validation.score_bias(bias, (B, H, T, S))
        _validation.head_gates(head_mask, B, H)
        # Masked or biased, PyTorch's CUDA kernels take no grouped heads (they fall back
        # to the slow one; Hugging Face's use_gqa_in_sdpa): repeat the heads then.
        shared = attend in GROUPED_KV_BACKENDS and mask is None and bias is None
        if not shared:
            k = repeat_kv(k, H // k.shape[1])  # (B, H, S, d_k)
            v = repeat_kv(v, H // v.shape[1])  # (B, H, S, d_k)
        p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, mask, bias=bias, dropout_p=p)  # (B, H, T, d_k)
        if head_mask is not None:
            out = out * head_mask.reshape(-1, H, 1, 1).to(out.dtype)  # gate each head
        out = self.out_proj(self.merge_heads(out))  # (B, T, D)
        return out, (weights if need_weights else None)

    def prune_heads(self, heads: Iterable[int]) -> MultiHeadAttention:
        """Remove query heads ``heads`` (indices of the unpruned module, as Hugging
        Face's ``pruned_heads``) physically: W^Q, W^K, W^V lose their rows and W^O its
        columns, so the module gets smaller and faster. Equals gating those heads with
        0 (``head_mask``). A head already removed is ignored, so two calls equal one
        with both lists; ``pruned_heads`` keeps the removed indices. Returns self.

        Raises ValueError for an index outside [0, H) of the unpruned module, removing
        every head, or a grouped-query module (its key/value heads are shared).
        Source: Michel et al. 2019, section 2.2; Hugging Face ``prune_heads``.
        """
        heads, n_original = set(heads), self.n_heads + len(self.pruned_heads)
        if self.n_kv_heads != self.n_heads:
            raise ValueError("prune_heads: grouped-query heads cannot be removed")
        current = [h for h in range(n_original) if h not in self.pruned_heads]
        keep = [i for i, h in enumerate(current) if h not in heads]  # current indices
        if not heads <= set(range(n_original)) or not keep:
            raise ValueError(
                f"heads: expected indices in [0, {n_original}) that leave at least "
                f"one head (removed: {sorted(self.pruned_heads)}), got {sorted(heads)}"
            )
        rows = torch.arange(self.n_heads * self.d_k, device=self.q_proj.weight.device)
        index = rows.view(self.n_heads, self.d_k)[keep].flatten()  # (H' * d_k,)
        self.q_proj = keep_features(self.q_proj, index, 0)
        self.k_proj = keep_features(self.k_proj, index, 0)
        self.v_proj = keep_features(self.v_proj, index, 0)
        self.out_proj = keep_features(self.out_proj, index, 1)
        self.n_heads = self.n_kv_heads = len(keep)
        self.pruned_heads |= heads
        return self
