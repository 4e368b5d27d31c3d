"""Making attention fast: tiled (FlashAttention-style) attention with an online softmax,
sliding-window attention computed band by band, and grouped-query attention.

Derived in chapter 7 ("Making attention fast"). Shape letters:

    B batch, H query heads, H_kv key/value heads, T query length, S key length,
    d_k query/key size, d_v value size, D d_model.

Masks are bool with True = may attend (see ``masks.py``); a query with no visible key
gets a zero output, never NaN. Importing this module registers ``"tiled"`` in
``attention.ATTENTION_BACKENDS``.

Sources:
    Milakov and Gimelshein 2018, "Online normalizer calculation for softmax",
    algorithm 3 (the running max and running sum).
    Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
    IO-Awareness", section 3.1, algorithm 1 (tiling).
    Beltagy et al. 2020 (Longformer), section 3.1; Jiang et al. 2023 (Mistral 7B),
    section 2 (sliding-window attention).
    Jacob et al. 2018, section 2 (int8 quantization, here symmetric per channel).
    Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need"
    (multi-query attention); Ainslie et al. 2023, "GQA", section 2 (grouped-query).
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from transformer_course.attention import (
    ATTENTION_BACKENDS,
    MultiHeadAttention,
    check_mask,
    check_qkv,
    scaled_dot_product_attention,
)
from transformer_course.masks import sliding_window_mask

Tensor = torch.Tensor


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value}")


def _check_no_dropout(dropout_p: float) -> None:
    if dropout_p != 0.0:
        raise ValueError(
            f"dropout_p: the tiled and banded paths support only 0.0, got {dropout_p}; "
            "use the 'naive' backend to train with attention dropout"
        )


# ----------------------------------------------------------------- tiled attention


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, None]:
    """Exact attention computed tile by tile with an online softmax (FlashAttention).

    Queries are split into blocks of ``block_q`` rows; for each block the keys and
    values are visited in blocks of ``block_k``. A running row maximum ``m`` and a
    running sum ``l`` of exponentials rescale the partial output whenever a larger
    score turns up, so the (T, S) score matrix is never stored: the extra memory is
    one (block_q, block_k) tile plus O(T) statistics per head, instead of O(T * S).
    Arithmetic is in float32 even for float16/bfloat16 inputs; the output is cast
    back to the input dtype.

    Args:
        q: queries (..., T, d_k), floating point.
        k: keys (..., S, d_k), same dtype and leading dimensions.
        v: values (..., S, d_v).
        mask: optional bool mask broadcastable to (..., T, S), True = may attend.
        block_q: rows of queries per tile (>= 1; need not divide T).
        block_k: keys per tile (>= 1; need not divide S).
        causal: also apply ``causal_mask(T, S)`` (bottom-right aligned) and skip the
            tiles that lie wholly above the diagonal.
        scale: multiplier of the scores; default 1 / sqrt(d_k).
        dropout_p: must be 0.0 (accepted so the function fits the backend registry).

    Returns:
        ``(out, None)``: ``out`` (..., T, d_v) in the dtype of ``q``; no weights are
        materialised. A query with no visible key gets a zero row.

    Raises:
        TypeError: non-float inputs, mixed dtypes, a non-bool mask, a non-int block.
        ValueError: a block size < 1, mismatched d_k or S, a mask that does not
            broadcast to (..., T, S), ``dropout_p != 0``.

    Source: Dao et al. 2022, algorithm 1; Milakov and Gimelshein 2018, algorithm 3.
    """
    check_qkv(q, k, v)
    _check_positive("block_q", block_q)
    _check_positive("block_k", block_k)
    _check_no_dropout(dropout_p)
    *lead, t, d_k = q.shape
    s = k.shape[-2]
    if mask is not None:
        check_mask(mask, (*lead, t, s))
        mask = mask.expand(*lead, t, s)  # a view: no (T, S) copy is made
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    outs = []
    for q0 in range(0, t, block_q):
        q1 = min(q0 + block_q, t)
        q_blk = q[..., q0:q1, :].to(work) * scale  # (..., bq, d_k)
        m = q_blk.new_full((*lead, q1 - q0, 1), float("-inf"))  # running max
        l = q_blk.new_zeros((*lead, q1 - q0, 1))  # running sum of exp
        acc = q_blk.new_zeros((*lead, q1 - q0, v.shape[-1]))  # (..., bq, d_v)
        # causal: query i sees key j <= i + S - T, so tiles past that are skipped
        k_end = min(s, q1 + s - t) if causal else s
        for k0 in range(0, max(k_end, 0), block_k):
            k1 = min(k0 + block_k, s)
            k_blk = k[..., k0:k1, :].to(work)  # (..., bk, d_k)
            scores = q_blk @ k_blk.transpose(-2, -1)  # (..., bq, bk)
            keep = None
            if mask is not None:
                keep = mask[..., q0:q1, k0:k1]  # (..., bq, bk)
            if causal:
                i = torch.arange(q0, q1, device=q.device)[:, None] + (s - t)
                j = torch.arange(k0, k1, device=q.device)[None, :]
                keep = j <= i if keep is None else keep & (j <= i)  # (bq, bk)
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            # The output does not depend on the shift m (it cancels between numerator
            # and denominator), so m is computed without gradient. Rows that have
            # seen no visible key yet keep m = -inf and are shifted by 0 instead.
            with torch.no_grad():
                m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
                shift = torch.where(m_new.isfinite(), m_new, torch.zeros_like(m_new))
            p = torch.exp(scores - shift)  # (..., bq, bk); masked: exp(-inf) = 0
            alpha = torch.exp(m - shift)  # rescales what was accumulated so far
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v[..., k0:k1, :].to(work)  # (..., bq, d_v)
            m = m_new
        has_key = l > 0  # a query with no visible key keeps l = 0 and gets zeros
        blk = torch.where(has_key, acc / torch.where(has_key, l, 1.0), 0.0)
        outs.append(blk.to(q.dtype))  # (..., bq, d_v)
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
    _check_positive("block", block)
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


# ---------------------------------------------------------- sliding-window attention


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
    check_qkv(q, k, v)
    _check_positive("window", window)
    block = min(window, 256) if block is None else block
    _check_positive("block", block)
    *lead, t, _ = q.shape
    s = k.shape[-2]
    if s < t:
        raise ValueError(
            f"k: expected at least as many keys as queries (S >= T = {t}), "
            f"got k shape {tuple(k.shape)}"
        )
    if mask is not None:
        check_mask(mask, (*lead, t, s))
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


# ------------------------------------------------------------ grouped-query attention


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Repeat each key/value head ``n_rep`` times so H_kv heads serve H = H_kv * n_rep
    query heads: head h of the result is head h // n_rep of ``x``.

    Args:
        x: (B, H_kv, S, d) keys or values.
        n_rep: query heads per key/value head (>= 1).

    Returns:
        (B, H_kv * n_rep, S, d); ``x`` itself when ``n_rep == 1``.

    Raises:
        ValueError: if ``x`` is not 4-D or ``n_rep`` < 1.

    Source: Ainslie et al. 2023, section 2 (grouped-query attention).
    """
    _check_positive("n_rep", n_rep)
    if x.dim() != 4:
        raise ValueError(f"x: expected shape (B, H_kv, S, d), got {tuple(x.shape)}")
    if n_rep == 1:
        return x
    b, h_kv, s, d = x.shape
    x = x[:, :, None, :, :].expand(b, h_kv, n_rep, s, d)  # (B, H_kv, n_rep, S, d)
    return x.reshape(b, h_kv * n_rep, s, d)  # (B, H, S, d)


def kv_cache_bytes_per_token(
    n_layers: int, n_kv_heads: int, d_k: int, dtype: torch.dtype = torch.float32
) -> int:
    """Bytes a KV cache stores per token: 2 (keys and values) x n_layers x n_kv_heads
    x d_k x the size of one element of ``dtype``."""
    _check_positive("n_layers", n_layers)
    _check_positive("n_kv_heads", n_kv_heads)
    _check_positive("d_k", d_k)
    return 2 * n_layers * n_kv_heads * d_k * torch.empty((), dtype=dtype).element_size()


class GroupedQueryAttention(MultiHeadAttention):
    """Multi-head attention in which groups of query heads share a key/value head.

    ``n_kv_heads == n_heads`` is ordinary multi-head attention (same parameters, same
    names, so a ``MultiHeadAttention`` state dict loads into it); ``n_kv_heads == 1``
    is multi-query attention; in between is grouped-query attention. The key and value
    projections, and therefore a KV cache, shrink by n_heads / n_kv_heads: the cache
    stores (B, H_kv, S, d_k) and each key/value head is repeated for its group of
    n_heads / n_kv_heads query heads (``repeat_kv``) just before attention.

    Args:
        d_model, n_heads, dropout, bias, backend: as ``MultiHeadAttention``.
        n_kv_heads: key/value heads H_kv, a divisor of ``n_heads`` (default n_heads).

    Shapes: as ``MultiHeadAttention.forward``; ``cache.update`` receives keys and
    values with H_kv heads.

    Raises:
        TypeError / ValueError: as ``MultiHeadAttention``, plus ``n_kv_heads`` that is
        not an int dividing ``n_heads``.

    Source: Ainslie et al. 2023, section 2; Shazeer 2019 (multi-query attention).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "naive",
    ):
        super().__init__(d_model, n_heads, dropout=dropout, bias=bias, backend=backend)
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _check_positive("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(
                f"n_kv_heads: expected a divisor of n_heads = {n_heads}, "
                f"got {n_kv_heads}"
            )
        self.n_kv_heads = n_kv_heads
        d_kv = n_kv_heads * self.d_k
        self.k_proj = nn.Linear(d_model, d_kv, bias=bias)  # W^K of the H_kv heads
        self.v_proj = nn.Linear(d_model, d_kv, bias=bias)  # W^V of the H_kv heads

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, n * d_k) -> (B, n, L, d_k) for n = H (queries) or H_kv (keys)."""
        b, length, features = x.shape
        n = features // self.d_k
        return x.view(b, length, n, self.d_k).transpose(1, 2)  # (B, n, L, d_k)

    def _backend_fn(self):
        attend = super()._backend_fn()

        def grouped(q, k, v, mask=None, **kwargs):
            n_rep = self.n_heads // self.n_kv_heads
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, d_k)
            return attend(q, k, v, mask, **kwargs)

        return grouped


# ------------------------------------------------------------------- int8 weights


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8 quantization of a weight matrix.

    Row i is divided by scale_i = max_j |w_ij| / 127 and rounded, so the largest
    entry of each row maps to +-127 and zero stays exactly zero.

    Args:
        weight: (d_out, d_in) floating-point weights (an ``nn.Linear.weight``).

    Returns:
        ``(w_int8, scale)``: int8 (d_out, d_in) and float32 (d_out, 1), with
        ``w_int8 * scale`` close to ``weight`` (error at most scale / 2 per entry).
        A row of zeros gets scale 1.

    Raises:
        TypeError: if ``weight`` is not a floating-point tensor.
        ValueError: if it is not 2-D.

    Source: Jacob et al. 2018, "Quantization and Training of Neural Networks for
    Efficient Integer-Arithmetic-Only Inference", section 2 (with zero point 0).
    """
    if not isinstance(weight, Tensor) or not weight.dtype.is_floating_point:
        raise TypeError("weight: expected a floating-point torch.Tensor")
    if weight.dim() != 2:
        raise ValueError(
            f"weight: expected shape (d_out, d_in), got {tuple(weight.shape)}"
        )
    w = weight.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127.0  # (d_out, 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    w_int8 = torch.round(w / scale).clamp(-127, 127).to(torch.int8)  # (d_out, d_in)
    return w_int8, scale


def dequantize_int8(w_int8: Tensor, scale: Tensor) -> Tensor:
    """float32 weights back from ``quantize_int8``: w_int8 * scale, (d_out, d_in)."""
    return w_int8.float() * scale


# ------------------------------------------------------------------ measuring memory


class _TensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storage that PyTorch operators create and that are
    still referenced, and remembers the peak. Views share their base's storage and
    are counted once."""

    def __init__(self):
        super().__init__()
        self.refs: dict[int, tuple[int, int]] = {}  # address -> (tensors, bytes)
        self.live = self.peak = 0

    def _release(self, key: int) -> None:
        count, size = self.refs[key]
        if count > 1:
            self.refs[key] = (count - 1, size)
        else:
            del self.refs[key]
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0:
                continue
            count, size = self.refs.get(key, (0, storage.nbytes()))
            if count == 0:
                self.live += size
                self.peak = max(self.peak, self.live)
            self.refs[key] = (count + 1, size)
            weakref.finalize(t, self._release, key)
        return out


def peak_tensor_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Peak bytes of new tensors alive at once while ``fn()`` runs (under no_grad).

    On a CUDA device this is ``torch.cuda.max_memory_allocated`` minus what was
    allocated before. Elsewhere the tensors each operator returns are counted as they
    are created and freed; scratch buffers that a fused kernel allocates inside itself
    (e.g. the tiles of PyTorch's flash kernel) are not seen.

    Args:
        fn: called with no arguments; what it returns is freed before the count ends.
        device: where ``fn`` computes.

    Returns:
        Bytes (int).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            out = fn()
            torch.cuda.synchronize(device)
        del out
        return torch.cuda.max_memory_allocated(device) - before
    with torch.no_grad(), _TensorBytes() as counter:
        out = fn()
        del out
    return counter.peak


ATTENTION_BACKENDS["tiled"] = tiled_attention
