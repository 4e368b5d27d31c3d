"""Known-wrong functions: the mistakes learners (and papers' readers) really make.

The checks run them on their own inputs to recognise a learner's mistake and name it,
the tests feed them to the checks to prove each mistake gets its own message, and the
chapters import them to show what goes wrong. Each one runs without an error: that is
what makes it a pitfall. Codes P1-P16 refer to the pitfall list of the course.

Attention functions take q (..., T, d_k), k (..., S, d_k), v (..., S, d_v) and an
optional bool mask (True = may attend) and return ``(out, weights)`` unless noted.
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor
_INF = float("-inf")


def _scores(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return q @ k.transpose(-2, -1) * scale


def _guarded_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis; a row that is all -inf gives zeros."""
    w = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(w, nan=0.0)


# ------------------------------------------------------------- softmax (chapter 2)


def softmax_no_max_shift(
    scores: Tensor, mask: Tensor | None = None, dim: int = -1
) -> Tensor:
    """exp(s) / sum exp(s) over ``dim``: overflows to NaN for scores around 100 and
    above."""
    if mask is not None:
        scores = scores.masked_fill(~mask, _INF)
    e = torch.exp(scores)
    return e / e.sum(dim, keepdim=True)


def softmax_unguarded(
    scores: Tensor, mask: Tensor | None = None, dim: int = -1
) -> Tensor:
    """-inf fill and torch.softmax: a row with no visible key is 0/0 = NaN (P1)."""
    if mask is not None:
        scores = scores.masked_fill(~mask, _INF)
    return torch.softmax(scores, dim=dim)


def softmax_large_negative(
    scores: Tensor, mask: Tensor | None = None, dim: int = -1
) -> Tensor:
    """-1e9 fill: no NaN, but a row with no visible key becomes uniform (P6)."""
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    return torch.softmax(scores, dim=dim)


def softmax_inverted_mask(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Hides the keys the mask allows: PyTorch's nn.MultiheadAttention polarity (P3)."""
    if mask is not None:
        scores = scores.masked_fill(mask, _INF)
    return _guarded_softmax(scores)


def softmax_then_zero(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax first, then zero the masked weights: the rest no longer sum to 1."""
    w = torch.softmax(scores, dim=-1)
    return w if mask is None else w * mask


def softmax_over_queries(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Normalises each column (dim=-2) instead of each row (P11)."""
    if mask is not None:
        scores = scores.masked_fill(~mask, _INF)
    return torch.nan_to_num(torch.softmax(scores, dim=-2), nan=0.0)


# ------------------------------------------------- attention (chapters 1, 2 and 5)


def attention_unscaled(q, k, v, mask=None):
    """softmax(q k^T) without 1/sqrt(d_k): too sharp, no error (P12)."""
    w = _guarded_softmax(_masked(_scores(q, k, 1.0), mask))
    return w @ v, w


def attention_scaled_by_d_k(q, k, v, mask=None):
    """Divides by d_k instead of sqrt(d_k): too flat."""
    w = _guarded_softmax(_masked(_scores(q, k, 1 / q.shape[-1]), mask))
    return w @ v, w


def attention_softmax_over_queries(q, k, v, mask=None):
    """softmax(dim=-2): each key's column sums to 1, and the future leaks (P11)."""
    w = softmax_over_queries(_scores(q, k), mask)
    return w @ v, w


def attention_softmax_over_batch(q, k, v, mask=None):
    """softmax(dim=0): batch items mix; with one item every weight is 1 (P11)."""
    w = torch.nan_to_num(torch.softmax(_masked(_scores(q, k), mask), dim=0), nan=0.0)
    return w @ v, w


def attention_inverted_mask(q, k, v, mask=None):
    """Fills where the mask is True: attends exactly where it must not (P3)."""
    w = softmax_inverted_mask(_scores(q, k), mask)
    return w @ v, w


def attention_ignores_mask(q, k, v, mask=None):
    """Never applies the mask."""
    w = torch.softmax(_scores(q, k), dim=-1)
    return w @ v, w


def attention_no_guard(q, k, v, mask=None):
    """-inf fill and torch.softmax: NaN for a query with no visible key (P1)."""
    w = softmax_unguarded(_scores(q, k), mask)
    return w @ v, w


def attention_large_negative(q, k, v, mask=None):
    """-1e9 fill: a query with no visible key averages all values (P6)."""
    w = softmax_large_negative(_scores(q, k), mask)
    return w @ v, w


def attention_mask_after_softmax(q, k, v, mask=None):
    """Zeroes the masked weights after the softmax, which already counted them.

    The masked keys' scores are still in the denominator, so the visible weights
    depend on the future."""
    w = softmax_then_zero(_scores(q, k), mask)
    return w @ v, w


def attention_ignores_qk(q, k, v, mask=None):
    """A uniform average over the visible keys: q and k are never used."""
    w = torch.zeros(q.shape[:-1] + k.shape[-2:-1], dtype=v.dtype)
    w = _guarded_softmax(_masked(w, mask))
    return w @ v, w


def attention_out_only(q, k, v, mask=None):
    """Returns only the output where ``(out, weights)`` is asked."""
    w = _guarded_softmax(_masked(_scores(q, k), mask))
    return w @ v


def attention_mask_on_queries(q, k, v, mask=None):
    """Applies the transposed mask: hides queries' columns instead of keys (P5)."""
    if mask is not None and mask.shape[-1] == mask.shape[-2]:
        mask = mask.transpose(-2, -1)
    w = _guarded_softmax(_masked(_scores(q, k), mask))
    return w @ v, w


def attention_buggy(q, k, v, mask=None):
    """Chapter 2's "find the bug": softmax over the batch, inverted mask, no guard."""
    scores = _scores(q, k)
    if mask is not None:
        scores = scores.masked_fill(mask, _INF)
    w = torch.softmax(scores, dim=0)
    return w @ v, w


def _masked(scores: Tensor, mask: Tensor | None) -> Tensor:
    return scores if mask is None else scores.masked_fill(~mask, _INF)


# ------------------------------------------------------- heads (chapter 3)


def split_heads_view_only(x: Tensor, n_heads: int) -> Tensor:
    """view(B, H, T, d_k) directly: a head gets features of several tokens (P8)."""
    B, T, D = x.shape
    return x.view(B, n_heads, T, D // n_heads)


def split_heads_no_transpose(x: Tensor, n_heads: int) -> Tensor:
    """view(B, T, H, d_k) without the transpose: axis 1 is still the tokens."""
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads)


def split_heads_interleaved(x: Tensor, n_heads: int) -> Tensor:
    """Head h takes every H-th feature instead of one contiguous slice."""
    B, T, D = x.shape
    return x.view(B, T, D // n_heads, n_heads).permute(0, 3, 1, 2)


def merge_heads_no_transpose(heads: Tensor) -> Tensor:
    """(B, H, T, d_k) reshaped straight to (B, T, H*d_k): tokens mixed (P9)."""
    B, H, T, d = heads.shape
    return heads.reshape(B, T, H * d)


def merge_heads_no_reshape(heads: Tensor) -> Tensor:
    """transpose(1, 2) only: (B, T, H, d_k), the heads are never concatenated."""
    return heads.transpose(1, 2)


def merge_heads_interleaved(heads: Tensor) -> Tensor:
    """Concatenates feature by feature (d_k, H) instead of head by head (H, d_k)."""
    B, H, T, d = heads.shape
    return heads.permute(0, 2, 3, 1).reshape(B, T, H * d)


def _split(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)


def _merge(heads):
    B, H, T, d = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * d)


def _multi_head(
    query,
    key,
    value,
    w_q,
    w_k,
    w_v,
    w_o,
    n_heads,
    mask=None,
    *,
    proj=lambda x, w: x @ w.T,
    split=_split,
    merge=_merge,
    attention=None,
    out_proj=True,
):
    from transformer_course.attention import scaled_dot_product_attention

    attention = attention or scaled_dot_product_attention
    q, k, v = (
        split(proj(x, w), n_heads) for x, w in ((query, w_q), (key, w_k), (value, w_v))
    )
    out, weights = attention(q, k, v, mask)
    out = merge(out)
    return (proj(out, w_o) if out_proj else out), weights


def multi_head_x_at_w(*args, **kwargs):
    """x @ w (the paper's Q W^Q) with weights stored (out, in) as in nn.Linear."""
    return _multi_head(*args, **kwargs, proj=lambda x, w: x @ w)


def multi_head_x_at_w_inputs(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """x @ w for the q, k, v projections only; the output projection right (w_o.T)."""
    out, weights = _multi_head(
        query,
        key,
        value,
        w_q,
        w_k,
        w_v,
        w_o,
        n_heads,
        mask,
        proj=lambda x, w: x @ w,
        out_proj=False,
    )
    return out @ w_o.T, weights


def multi_head_split_view_only(*args, **kwargs):
    """Heads split with view(B, H, T, d_k) (P8)."""
    return _multi_head(*args, **kwargs, split=split_heads_view_only)


def multi_head_merge_no_transpose(*args, **kwargs):
    """Heads merged with a straight reshape (P9)."""
    return _multi_head(*args, **kwargs, merge=merge_heads_no_transpose)


def multi_head_inverted_mask(*args, **kwargs):
    """The mask read with PyTorch's polarity, True = blocked (P3)."""
    return _multi_head(*args, **kwargs, attention=attention_inverted_mask)


def multi_head_no_out_proj(*args, **kwargs):
    """The concatenated heads are returned without the output projection w_o."""
    return _multi_head(*args, **kwargs, out_proj=False)


def multi_head_scaled_by_d_model(
    query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None
):
    """Scores divided by sqrt(d_model) instead of sqrt(d_k) of one head."""
    d_model = query.shape[-1]

    def attention(q, k, v, m):
        w = _guarded_softmax(_masked(_scores(q, k, 1 / math.sqrt(d_model)), m))
        return w @ v, w

    return _multi_head(
        query, key, value, w_q, w_k, w_v, w_o, n_heads, mask, attention=attention
    )


def multi_head_averaged_weights(*args, **kwargs):
    """Returns the weights averaged over the heads, (B, T, S) (P13)."""
    out, weights = _multi_head(*args, **kwargs)
    return out, weights.mean(1)


# --------------------------------------------------------- masks (chapter 5)


def causal_mask_top_left(q_len: int, k_len: int) -> Tensor:
    """tril of a (T, S) matrix: right only when T == S; with a cache query 0 sees
    only key 0."""
    return torch.ones(q_len, k_len, dtype=torch.bool).tril()


def causal_mask_inverted(q_len: int, k_len: int) -> Tensor:
    """True marks the future (triu): the blocked convention."""
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len).logical_not()


def causal_mask_no_diagonal(q_len: int, k_len: int) -> Tensor:
    """j < i instead of j <= i: a token may not see itself."""
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len - 1)


def causal_mask_wrong_offset(q_len: int, k_len: int) -> Tensor:
    """tril(q_len - k_len): the offset's sign is flipped."""
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(q_len - k_len)


def padding_mask_query_axis(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, 1, S, 1): hides padded queries (rows), not padded keys (P5)."""
    return (tokens != pad_id)[:, None, :, None]


def padding_mask_inverted(tokens: Tensor, pad_id: int) -> Tensor:
    """True marks the padding."""
    return (tokens == pad_id)[:, None, None, :]


# ------------------------------------------------- the chapters' "find the bug" code


def split_qkv_per_head(qkv: Tensor, n_heads: int):
    """Reads fused features as [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (per head)."""
    B, T, D3 = qkv.shape
    parts = qkv.reshape(B, T, n_heads, 3, D3 // (3 * n_heads)).permute(3, 0, 2, 1, 4)
    return parts[0], parts[1], parts[2]


def merge_folded_heads_buggy(heads: Tensor, n_heads: int) -> Tensor:
    """Chapter 3's bug: (B * H, T, d_k) -> (T, B * H, d_k) -> reshape; right only
    for a batch of one."""
    BH, T, d_k = heads.shape
    return heads.transpose(0, 1).reshape(BH // n_heads, T, n_heads * d_k)


def decoder_mask_buggy(tokens: Tensor, pad_id: int) -> Tensor:
    """Chapter 5's bug: padding on the query axis (P5), combined with "or"."""
    T = tokens.shape[1]
    keep = (tokens != pad_id)[:, None, :, None]
    return keep | torch.ones(T, T, dtype=torch.bool).tril()


def masked_attention_axis_renorm(q, k, v, mask):
    """Chapter 5's bug: softmax over the queries, masked and renormalised (P11, P1)."""
    w = torch.softmax(_scores(q, k), dim=-2).masked_fill(~mask, 0.0)
    w = w / w.sum(dim=-1, keepdim=True)
    return w @ v


# ------------------------------------------------------- distillation (chapter 9)


def soft_target_one_sided(s: Tensor, t: Tensor, T: float) -> Tensor:
    """T^2 KL(p || q) with the temperature on the student logits ``s`` only: the
    teacher's targets ``t`` are not softened (Hinton et al. 2015, section 2)."""
    p = torch.softmax(t, -1)
    return T * T * (p * (p.log() - torch.log_softmax(s / T, -1))).sum(-1).mean()


def streaming_attention_no_output_rescale(q, k, v, keep, block):
    """Chapter 7's streamed attention for one query, q (d,), k (S, d), v (S, d_v), with
    a key padding mask keep (S,), that rescales the running sum but not the partial
    output when the running maximum grows: each block's contribution keeps the scale
    of the maximum it was computed with (FlashAttention's online softmax, Dao et al.
    2022, Algorithm 1, without the factor exp(m - m_new) on the output). Returns (d_v,)."""
    m, l, acc = -math.inf, 0.0, torch.zeros(v.shape[1])
    s = (k @ q / math.sqrt(q.shape[0])).masked_fill(~keep, -math.inf)
    for j in range(0, len(s), block):
        m_new = max(m, s[j : j + block].max().item())
        shift = m_new if m_new > -math.inf else 0.0
        p = torch.exp(s[j : j + block] - shift)
        l = l * math.exp(m - shift) + p.sum().item()
        acc = acc + p @ v[j : j + block]  # bug: acc not rescaled
        m = m_new
    return acc / l if l > 0 else acc


# --------------------------------- the learner trial of 2026-12-03 (issue 39, item 2)
# Each of these got through a check, or got a hint that named another mistake.


def softmax_global_max(
    scores: Tensor, mask: Tensor | None = None, dim: int = -1
) -> Tensor:
    """A guarded softmax along ``dim`` that subtracts one maximum for the whole tensor
    (``s - s.max()``) instead of each slice's own: a slice far below the global
    maximum underflows to exp(-1000) = 0, and the guard turns it into zeros."""
    if mask is not None:
        scores = scores.masked_fill(~mask, _INF)
    top = scores.max()
    top = top if torch.isfinite(top) else torch.zeros_like(top)
    e = torch.exp(scores - top)
    total = e.sum(dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def attention_valid_softmax_over_queries(q, k, v, valid):
    """Chapter 1's attention with missing keys, the keys hidden right but the softmax
    over the query axis (dim=1): the column of a missing key is all -inf, so NaN."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~valid[:, None, :], _INF)
    weights = torch.softmax(scores, dim=1)
    return weights @ v, weights


def attention_valid_swapped(q, k, v, valid):
    """Chapter 1's attention with missing keys, right, returning ``(weights, out)``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~valid[:, None, :], _INF), dim=-1)
    return weights, weights @ v


def merge_halves_reversed(m_a, l_a, m_b, l_b):
    """Chapter 7's merge of two halves with the exponents reversed, exp(m - m_a), and
    no guard: a half that is all -inf gives 0 * exp(+inf) = NaN."""
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m - m_a) + l_b * torch.exp(m - m_b)


def merge_halves_absolute(m_a, l_a, m_b, l_b):
    """Chapter 7's merge through absolute sums, l_a exp(m_a) + l_b exp(m_b), divided
    by exp(m), with a guard for -inf: exp(1000) overflows to inf, and inf / inf is
    NaN for a row of scores around 1000, which has no -inf at all."""
    m = torch.maximum(m_a, m_b)
    a = torch.where(torch.isinf(m_a), torch.zeros_like(l_a), l_a * torch.exp(m_a))
    b = torch.where(torch.isinf(m_b), torch.zeros_like(l_b), l_b * torch.exp(m_b))
    return m, torch.where(torch.isinf(m), torch.zeros_like(m), (a + b) / torch.exp(m))


def clip_loss_scale_item(image_emb, text_emb, log_scale):
    """Chapter 8's CLIP loss, right in value, with the scale taken out of the graph
    (``min(log_scale.exp().item(), 100)``): log_scale gets no gradient, so the
    temperature CLIP is meant to learn stays where it started."""
    scale = min(log_scale.exp().item(), 100.0)
    return _clip(image_emb, text_emb, scale)


def clip_loss_math_exp(image_emb, text_emb, log_scale):
    """The same, through ``math.exp(log_scale)``: a Python float, no gradient."""
    return _clip(image_emb, text_emb, min(math.exp(log_scale), 100.0))


def clip_loss_clamp_min(image_emb, text_emb, log_scale):
    """Chapter 8's CLIP loss with ``clamp(min=100)``: the scale is at least 100, not
    at most."""
    return _clip(image_emb, text_emb, log_scale.exp().clamp(min=100.0))


def clip_loss_clamp_log_after_exp(image_emb, text_emb, log_scale):
    """Chapter 8's CLIP loss with the clip at log(100) applied after the exp: the
    scale is at most 4.6, not 100."""
    return _clip(image_emb, text_emb, log_scale.exp().clamp(max=math.log(100.0)))


def _clip(image_emb, text_emb, scale):
    i = image_emb / image_emb.norm(dim=-1, keepdim=True)
    t = text_emb / text_emb.norm(dim=-1, keepdim=True)
    logits = scale * i @ t.T
    labels = torch.arange(len(i))
    ce = torch.nn.functional.cross_entropy
    return (ce(logits, labels) + ce(logits.T, labels)) / 2


def soft_loss_clamped_teacher(student_logits, teacher_logits, T):
    """Chapter 9's soft-target loss with the teacher's logits clamped at 50 before the
    softmax: finite, but for a confident teacher ([0, 60, 120]) it is another
    teacher."""
    p = torch.softmax(teacher_logits.clamp(max=50.0) / T, -1)
    log_q = torch.log_softmax(student_logits / T, -1)
    return T * T * (p * (p.log() - log_q)).sum(-1).mean()


def rms_norm_no_eps(x, weight, eps):
    """Chapter 10's RMSNorm without eps."""
    return x / x.pow(2).mean(-1, keepdim=True).sqrt() * weight


def rms_norm_mean_of_x(x, weight, eps):
    """Chapter 10's RMSNorm with the mean of x in place of the mean of its squares."""
    return x / (x.mean(-1, keepdim=True) + eps).sqrt() * weight


def rms_norm_root_of_sum(x, weight, eps):
    """Chapter 10's RMSNorm with the root of the sum of squares (an L2 norm)."""
    return x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * weight


def cache_bytes_group_ratio(n_layers, n_heads, n_kv_heads, d_k, nbytes, n_tokens):
    """Chapter 10's KV-cache size with the group size ``n_heads // n_kv_heads`` for the
    number of KV heads: right by coincidence when n_heads = n_kv_heads^2."""
    return 2 * n_layers * (n_heads // n_kv_heads) * d_k * nbytes * n_tokens


# ------------------------------------------------------------ serving (chapter 11)
# A paged cache's gather: pool (N, H_kv, b, d), a block table (list of ints), length ->
# the sequence's keys (H_kv, length, d).


def gather_ignores_block_table(pool: Tensor, table: list[int], length: int) -> Tensor:
    """Reads block j // b of the pool for token j: the logical block number used as
    the physical one, as if every sequence owned the first blocks of the pool."""
    j = torch.arange(length)
    return pool[j // pool.shape[2], :, j % pool.shape[2]].transpose(0, 1)


def gather_blocks_sorted(pool: Tensor, table: list[int], length: int) -> Tensor:
    """Reads the sequence's blocks in pool order (sorted), not in table order: right
    only while blocks happen to be handed out in increasing order."""
    j = torch.arange(length)
    blocks = torch.tensor(sorted(table))[j // pool.shape[2]]
    return pool[blocks, :, j % pool.shape[2]].transpose(0, 1)


def gather_flattened_heads_first(pool: Tensor, table: list[int], length: int) -> Tensor:
    """Flattens the pool to token slots with ``reshape(N * b, H_kv, d)`` while the heads
    axis still comes before the slots: heads and tokens mix (pitfall P8's cousin)."""
    N, H, b, d = pool.shape
    j = torch.arange(length)
    slots = torch.tensor(table)[j // b] * b + j % b
    return pool.reshape(N * b, H, d)[slots].transpose(0, 1)


def gather_shifted_by_one(pool: Tensor, table: list[int], length: int) -> Tensor:
    """Counts token positions from 1: token 0 is skipped and a slot past the end is
    read (the first key lost, an unwritten one read)."""
    b = pool.shape[2]
    j = torch.arange(1, length + 1)
    padded = [*table, table[-1]]  # room for the slot past the end
    blocks = torch.tensor(padded)[j // b]
    return pool[blocks, :, j % b].transpose(0, 1)


# The speculative accept rule: draft (n,) long, p and q (n, V) -> the token kept or drawn
# at each row (n,) long. Right: keep with probability min(1, p/q), else draw from
# norm(max(0, p - q)).


def _accept(draft, p, q, generator, ratio, residual):
    px = p.gather(-1, draft[:, None])[:, 0]
    qx = q.gather(-1, draft[:, None])[:, 0]
    u = torch.rand(px.shape, generator=generator)
    kept = u < ratio(px, qx)
    drawn = torch.multinomial(residual(p, q), 1, generator=generator)[:, 0]
    return torch.where(kept, draft, drawn)


def _right_residual(p, q):
    return (p - q).clamp_min(0)


def accept_always(draft, p, q, generator=None):
    """Keeps every draft: the output follows the drafter's q, not the model's p."""
    return draft.clone()


def accept_resample_from_p(draft, p, q, generator=None):
    """min(1, p/q) right, but a rejected draft is replaced by a draw from p itself:
    tokens that q over-proposes come out too often."""
    return _accept(draft, p, q, generator, lambda px, qx: px / qx, lambda p, q: p)


def accept_ratio_inverted(draft, p, q, generator=None):
    """Keeps the draft with probability min(1, q/p): the ratio upside down."""
    return _accept(
        draft, p, q, generator, lambda px, qx: qx / px.clamp_min(1e-30), _right_residual
    )


def accept_with_probability_p(draft, p, q, generator=None):
    """Keeps the draft with probability p(x), forgetting to divide by q(x) (right only
    for a drafter whose q is one-hot, a greedy one)."""
    return _accept(draft, p, q, generator, lambda px, qx: px, _right_residual)


def accept_residual_q_minus_p(draft, p, q, generator=None):
    """Draws a rejected draft's replacement from norm(max(0, q - p)): the sign swapped,
    so the replacement is again a token the drafter over-proposes."""
    return _accept(
        draft,
        p,
        q,
        generator,
        lambda px, qx: px / qx,
        lambda p, q: (q - p).clamp_min(0),
    )


def accept_ignores_draft(draft, p, q, generator=None):
    """Draws every token from p: the right distribution, but the draft is kept only
    when the draw happens to equal it, so speculation saves almost nothing."""
    return torch.multinomial(p, 1, generator=generator)[:, 0]


def accept_if_p_at_least_q(draft, p, q, generator=None):
    """Keeps the draft exactly when p(x) >= q(x), without a random draw: a threshold
    in place of the coin flip with probability p/q."""
    return _accept(
        draft, p, q, generator, lambda px, qx: (px >= qx).float() * 2, _right_residual
    )


# A prefix cache's block names (pitfall P19: vLLM advisory GHSA-rm76-4mrf-v9r8, PR 12621).


def block_name_builtin_hash(parent: int | None, tokens: list[int]) -> int:
    """vLLM's block name before PR 12621: Python's ``hash((parent, tuple(tokens)))``,
    the first block's parent ``None``. Since Python 3.12 ``hash(None)`` is a constant
    and the hash of ints and tuples of ints never depended on ``PYTHONHASHSEED``, so
    every name is the same in every process: anyone can compute them, and search
    offline for a prompt whose block name equals another user's. The name is also
    only 64 bits, and the parent enters it only modulo 2^61 - 1 (CPython's hash of an
    int), so two different prefixes can give the same name. The fix: SHA-256 of the
    parent's name and the token ids (``paged_cache.block_hash``)."""
    return hash((parent, tuple(tokens)))


# KIVI's keys: k (G, d), a group of G tokens' keys, and bits -> the dequantized keys
# (G, d). Right: one asymmetric scale and minimum per channel (over the G tokens).


def _asymmetric(k: Tensor, bits: int, dim, levels=None, rounding=torch.round) -> Tensor:
    levels = 2**bits - 1 if levels is None else levels
    lo, hi = k.amin(dim, keepdim=True), k.amax(dim, keepdim=True)
    scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return rounding((k - lo) / scale).clamp(0, 2**bits - 1) * scale + lo


def kivi_keys_per_token(k: Tensor, bits: int) -> Tensor:
    """One scale per token (over its channels), as KIVI quantizes values: a key's
    outlier channel then sets the step of every channel of that token."""
    return _asymmetric(k, bits, -1)


def kivi_keys_one_scale(k: Tensor, bits: int) -> Tensor:
    """One scale and minimum for the whole group of keys."""
    return _asymmetric(k, bits, (0, 1))


def kivi_keys_symmetric(k: Tensor, bits: int) -> Tensor:
    """Symmetric per channel: scale max |k| / (2^(bits-1) - 1), no minimum, codes
    centred on zero; a channel that is not centred wastes half its codes."""
    levels = 2 ** (bits - 1) - 1
    scale = k.abs().amax(0, keepdim=True) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (k / scale).round().clamp(-levels, levels) * scale


def kivi_keys_truncated(k: Tensor, bits: int) -> Tensor:
    """Per channel, but codes truncated (floor) instead of rounded: errors up to a whole
    step, all in one direction."""
    return _asymmetric(k, bits, 0, rounding=torch.floor)


def kivi_keys_2_to_the_bits(k: Tensor, bits: int) -> Tensor:
    """Per channel with step (max - min) / 2^bits: 2^bits + 1 levels asked of 2^bits
    codes, so the channel's maximum is clipped to the code below."""
    return _asymmetric(k, bits, 0, levels=2**bits)
