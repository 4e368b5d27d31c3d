"""Chapter 3, multi-head attention: split, merge, and attention from the weights."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.exercises._common import (
    Tensor,
    check_close,
    check_shape,
    exercise_check,
    fail,
    passed,
)


def _split_reference(x: Tensor, n_heads: int) -> Tensor:
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, d_k)


@exercise_check
def check_split_heads(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 3, exercise "split the heads": ``fn(x, n_heads)`` with x (B, T, D) must
    return (B, H, T, d_k), d_k = D / H, where head h of token t holds
    x[:, t, h*d_k:(h+1)*d_k].

    Raises:
        CheckError: naming the wrong shape, or tokens mixed across heads by
            ``view(B, H, T, d_k)`` (pitfall P8), or the first wrong value.
    """
    for b, t, d, h in ((1, 2, 4, 2), (2, 5, 12, 3), (3, 4, 8, 8)):
        x = torch.arange(b * t * d, dtype=torch.float32).view(b, t, d)
        heads = fn(x, h)
        check_shape(heads, (b, h, t, d // h), "heads")
        if torch.equal(heads, x.view(b, h, t, d // h)):
            fail("head 0 holds features of several tokens: x was viewed as "
                  "(B, H, T, d_k) directly (pitfall P8)",
                  "view as (B, T, H, d_k) first, then transpose(1, 2).")
        check_close(heads, _split_reference(x, h), name="heads")
    return passed("heads split per token on 3 inputs")


@exercise_check
def check_merge_heads(fn: Callable[[Tensor], Tensor]) -> bool:
    """Chapter 3, exercise "merge the heads" (find the bug): ``fn(heads)`` with heads
    (B, H, T, d_k) must return (B, T, H * d_k) where token t is
    [head 0 of token t | head 1 of token t | ...].

    Raises:
        CheckError: naming the wrong shape, a straight reshape that mixes tokens
            (pitfall P9), or the first wrong value.
    """
    for b, h, t, d in ((1, 2, 2, 2), (2, 3, 5, 4), (2, 4, 3, 1)):
        heads = torch.arange(b * h * t * d, dtype=torch.float32).view(b, h, t, d)
        merged = fn(heads)
        check_shape(merged, (b, t, h * d), "merged")
        if torch.equal(merged, heads.reshape(b, t, h * d)):
            fail("token 0 of the result holds head 0's tokens 0, 1, ...: (B, H, T, d_k) "
                  "was reshaped straight to (B, T, H*d_k) (pitfall P9)",
                  "bring the token axis next to the batch first: transpose(1, 2), "
                  "then reshape (or .contiguous().view, pitfall P10).")
        ref = heads.transpose(1, 2).reshape(b, t, h * d)
        check_close(merged, ref, name="merged")
    return passed("heads merged per token on 3 inputs")


@exercise_check
def check_multi_head_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 3, exercise "multi-head attention from its weights":
    ``fn(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None)`` with query
    (B, T, D), key and value (B, S, D), four (D, D) weights in ``nn.Linear`` layout
    (y = x @ w.T, no bias) and a bool mask broadcastable to (B, H, T, S) must return
    ``(out, weights)``: out (B, T, D), per-head weights (B, H, T, S).

    Raises:
        CheckError: naming the wrong shape, weights averaged over heads (pitfall P13),
            heads split or merged across tokens (P8, P9), or the first wrong value.
    """
    from transformer_course.attention import MultiHeadAttention

    gen = torch.Generator().manual_seed(5)
    for b, t, s, d, h, masked in ((1, 3, 3, 4, 2, False), (2, 4, 6, 12, 3, True)):
        ref = MultiHeadAttention(d, h, bias=False)
        ws = [torch.randn(d, d, generator=gen) / math.sqrt(d) for _ in range(4)]
        with torch.no_grad():
            for lin, w in zip((ref.q_proj, ref.k_proj, ref.v_proj, ref.out_proj), ws):
                lin.weight.copy_(w)
        x = torch.randn(b, t, d, generator=gen)
        mem = torch.randn(b, s, d, generator=gen)
        mask = None
        if masked:
            mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
            mask[-1, ..., s // 2:] = False  # padding in the last item
        out, weights = fn(x, mem, mem, *ws, h, mask)
        with torch.no_grad():
            ref_out, ref_w = ref(x, mem, mem, mask)
        check_shape(out, (b, t, d), "out")
        if isinstance(weights, Tensor) and tuple(weights.shape) == (b, t, s):
            fail("weights have shape (B, T, S): they were averaged over the heads "
                  "(pitfall P13)",
                  "return the per-head weights, (B, H, T, S).")
        check_shape(weights, (b, h, t, s), "weights")
        check_close(weights, ref_w, atol=1e-5, name="weights")
        check_close(out, ref_out, atol=1e-5, name="out")
    return passed("multi-head attention matches the library's MultiHeadAttention")
