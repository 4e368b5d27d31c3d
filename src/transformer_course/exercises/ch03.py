"""Chapter 3, multi-head attention: splitting a fused q/k/v projection into heads,
merging heads from the folded (B * H, T, d_k) layout, and multi-head attention from its
weights. Every input has T, H, d_k and B all different, so a mixed-up axis shows."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.attention import MultiHeadAttention
from transformer_course.exercises import pitfalls
from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    check_close,
    check_shape,
    close,
    exercise_check,
    fail,
    out_and_weights,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids

# (B, T, D, H) with B, T, H and d_k = D / H all different
_SIZES = ((2, 3, 20, 4), (3, 5, 12, 2), (1, 2, 24, 3))

_SPLIT_MISTAKES = (
    (
        pitfalls.split_heads_view_only,
        N_(
            "head 0 holds all the features of the first tokens: the features were cut into "
            "(H, T, d_k) blocks of memory, not per token (pitfall P8)"
        ),
        N_(
            "cut each token's feature axis into (H, d_k) first; only then move the head "
            "axis."
        ),
    ),
    (
        pitfalls.split_heads_interleaved,
        N_(
            "head 0 holds every H-th feature instead of one contiguous slice of d_k "
            "features"
        ),
        N_(
            "head h owns features h*d_k to (h+1)*d_k: the head index is the slower one."
        ),
    ),
)


def _split_reference(x: Tensor, n_heads: int) -> Tensor:
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, d_k)


def _diagnose_split(heads, x: Tensor, h: int, name: str) -> None:
    b, t, d = x.shape
    if isinstance(heads, Tensor) and tuple(heads.shape) == (b, t, h, d // h):
        fail(
            "{name} has shape (B, T, H, d_k) = {heads_shape}: axis 1 still "
            "runs over the tokens",
            "the heads must come before the tokens: (B, H, T, d_k).",
            kind=ShapeError,
            name=name,
            heads_shape=tuple(heads.shape),
        )
    check_shape(heads, (b, h, t, d // h), name)
    for wrong, message, hint in _SPLIT_MISTAKES:
        if torch.equal(heads, wrong(x, h)):
            fail("{name}: {message}", hint, name=name, message=gettext(message))
    check_close(heads, _split_reference(x, h), name=name)


@exercise_check
def check_split_heads(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 3: ``fn(x, n_heads)`` with x (B, T, D) must return (B, H, T, d_k),
    d_k = D / H, where head h of token t holds x[:, t, h*d_k:(h+1)*d_k].

    Raises:
        ShapeError: for a wrong shape, or the transpose forgotten.
        CheckError: naming tokens mixed across heads by ``view(B, H, T, d_k)``
            (pitfall P8), interleaved features, or the first wrong value.
    """
    for b, t, d, h in _SIZES:
        x = torch.arange(b * t * d, dtype=torch.float32).view(b, t, d)
        _diagnose_split(fn(x, h), x, h, "heads")
    return passed("heads split per token on 3 inputs")


@exercise_check
def check_split_qkv(fn: Callable[[Tensor, int], tuple]) -> bool:
    """Chapter 3, exercise "split a fused projection": ``fn(qkv, n_heads)`` with qkv
    (B, T, 3 * D), the output of one fused projection whose features are
    [all of q | all of k | all of v], must return ``(q, k, v)``, each (B, H, T, d_k),
    d_k = D / H.

    Raises:
        ShapeError: for a result that is not three tensors, or a wrong shape.
        CheckError: naming q, k, v taken in the wrong order or cut per head, the
            split pitfalls (P8, interleaved), or the first wrong value.
    """
    for b, t, d, h in _SIZES:
        qkv = torch.arange(b * t * 3 * d, dtype=torch.float32).view(b, t, 3 * d)
        result = fn(qkv, h)
        if not (isinstance(result, (tuple, list)) and len(result) == 3):
            fail(
                "expected the tuple (q, k, v)",
                "return the three tensors.",
                kind=ShapeError,
            )
        parts = [p.contiguous() for p in qkv.split(d, dim=-1)]  # (B, T, D) each
        per_head = pitfalls.split_qkv_per_head(qkv, h)
        for name, got, part in zip("qkv", result, parts):
            if isinstance(got, Tensor) and tuple(got.shape) == (b, h, t, d // h):
                for other, wrong in zip("qkv", parts):
                    if other != name and torch.equal(got, _split_reference(wrong, h)):
                        fail(
                            "your {name} holds the features of {other}",
                            "the fused features are [q | k | v], in that order.",
                            name=name,
                            other=other,
                        )
                if torch.equal(got, per_head["qkv".index(name)]):
                    fail(
                        "your {name} was cut out of each head's slice: the features were "
                        "read as [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]",
                        "here the fused features are [all of q | all of k | all of "
                        "v]: separate q, k, v before splitting into heads.",
                        name=name,
                    )
            _diagnose_split(got, part, h, name)
    return passed("fused projection split into q, k, v heads on 3 inputs")


_MERGE_MISTAKES = (
    (
        pitfalls.merge_heads_no_transpose,
        N_(
            "token 0 of the result holds head 0's tokens 0, 1, ...: (B, H, T, d_k) was "
            "reshaped straight to (B, T, H*d_k) (pitfall P9)"
        ),
        N_(
            "a reshape reads memory in order: put the axes in the order of the result "
            "first (and mind pitfall P10)."
        ),
    ),
    (
        pitfalls.merge_heads_interleaved,
        N_(
            "each token's features alternate between heads: the concatenation runs "
            "feature by feature, (d_k, H), instead of head by head, (H, d_k)"
        ),
        N_("token t must read [head 0 of t | head 1 of t | ...]."),
    ),
)


@exercise_check
def check_merge_heads(fn: Callable[[Tensor], Tensor]) -> bool:
    """Chapter 3: ``fn(heads)`` with heads (B, H, T, d_k) must return
    (B, T, H * d_k) where token t is [head 0 of token t | head 1 of token t | ...].

    Raises:
        ShapeError: for a wrong shape, or heads transposed but not concatenated.
        CheckError: naming a straight reshape that mixes tokens (pitfall P9),
            interleaved heads, or the first wrong value.
    """
    for b, t, d, h in _SIZES:
        heads = torch.arange(b * t * d, dtype=torch.float32).view(b, h, t, d // h)
        merged = fn(heads)
        if isinstance(merged, Tensor) and tuple(merged.shape) == (b, t, h, d // h):
            fail(
                "merged has shape (B, T, H, d_k) = {merged_shape}: the heads were "
                "moved but not concatenated",
                "the last two axes must become one of size H * d_k.",
                kind=ShapeError,
                merged_shape=tuple(merged.shape),
            )
        check_shape(merged, (b, t, d), "merged")
        for wrong, message, hint in _MERGE_MISTAKES:
            if torch.equal(merged, wrong(heads)):
                fail(message, hint)
        check_close(merged, heads.transpose(1, 2).reshape(b, t, d), name="merged")
    return passed("heads merged per token on 3 inputs")


@exercise_check
def check_merge_folded_heads(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 3, exercise "find the bug: merging folded heads": ``fn(heads,
    n_heads)`` with heads (B * H, T, d_k), row b * H + h holding head h of batch item
    b (batch and heads folded into one axis, as inside ``nn.MultiheadAttention``),
    must return (B, T, H * d_k), token t = [head 0 of t | head 1 of t | ...].

    Raises:
        ShapeError: for a wrong shape.
        CheckError: naming batch items mixed together, the rows read head-major
            (h * B + b), a straight reshape (P9), or the first wrong value.
    """
    for b, t, d, h in _SIZES:
        dk = d // h
        folded = torch.arange(b * t * d, dtype=torch.float32).view(b * h, t, dk)
        merged = fn(folded.clone(), h)
        check_shape(merged, (b, t, d), "merged")
        ref = folded.view(b, h, t, dk).transpose(1, 2).reshape(b, t, d)
        if torch.equal(merged, ref):
            continue
        if torch.equal(merged, pitfalls.merge_folded_heads_buggy(folded, h)):
            fail(
                "with a batch of {b} the tokens of different batch items end up in "
                "one row: the batch axis was folded into the token axis",
                "split the first axis back into (B, H) before anything else.",
                b=b,
            )
        if torch.equal(
            merged, folded.view(h, b, t, dk).permute(1, 2, 0, 3).reshape(b, t, d)
        ):
            fail(
                "the rows were read head-major (row h * B + b)",
                "row b * H + h holds head h of item b: the batch index is the "
                "slower one.",
            )
        if torch.equal(
            merged, folded.view(b, h, t, dk).permute(0, 2, 3, 1).reshape(b, t, d)
        ):
            fail(
                "each token's features run feature by feature, (d_k, H), instead of "
                "head by head, (H, d_k): heads and head_dim were swapped in the merge",
                "token t must read [head 0 of t | head 1 of t | ...]: (B, T, H, d_k) "
                "before the reshape.",
            )
        if torch.equal(merged, folded.reshape(b, t, d)):
            fail(
                "token 0 holds one head's tokens 0, 1, ...: (B * H, T, d_k) was "
                "reshaped straight to (B, T, H * d_k) (pitfall P9)",
                "a reshape reads memory in order: bring the axes into the order of "
                "the result first.",
            )
        check_close(merged, ref, name="merged")
    return passed("folded heads merged per batch item and token on 3 inputs")


_MHA_MISTAKES = (
    (
        pitfalls.multi_head_x_at_w,
        N_(
            "your projections compute x @ w; the weights are stored (out, in), as in "
            "nn.Linear"
        ),
        N_(
            "the paper writes Q W^Q with W^Q of shape (in, out); here you hold its "
            "transpose."
        ),
    ),
    (
        pitfalls.multi_head_x_at_w_inputs,
        N_(
            "your q, k and v projections compute x @ w (the output projection is "
            "right); the weights are stored (out, in), as in nn.Linear"
        ),
        N_(
            "the paper writes Q W^Q with W^Q of shape (in, out); here you hold its "
            "transpose."
        ),
    ),
    (
        pitfalls.multi_head_split_view_only,
        N_(
            "the heads were split with view(B, H, T, d_k): each head sees features of "
            "several tokens (pitfall P8)"
        ),
        N_("run your split on a small arange tensor and look at head 0."),
    ),
    (
        pitfalls.multi_head_merge_no_transpose,
        N_(
            "the weights are right but the heads were merged with a straight reshape: "
            "tokens mixed (pitfall P9)"
        ),
        N_("run your merge on a small arange tensor and look at token 0."),
    ),
    (
        pitfalls.multi_head_inverted_mask,
        N_(
            "the mask is inverted: the weights sit on the keys the mask hides (pitfall P3)"
        ),
        N_("here True means 'may attend', the opposite of nn.MultiheadAttention."),
    ),
    (
        pitfalls.multi_head_scaled_by_d_model,
        N_(
            "the scores were divided by sqrt(d_model): each head's scores use its own d_k"
        ),
        N_("the scale belongs to one head's dot product."),
    ),
    (
        pitfalls.multi_head_no_out_proj,
        N_(
            "out is the concatenation of the heads: the output projection w_o is missing"
        ),
        N_("the last step mixes the heads with one more projection."),
    ),
)


@exercise_check
@forbids(MultiHeadAttention)
def check_multi_head_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 3, exercise "multi-head attention from its weights":
    ``fn(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None)`` with query
    (B, T, D), key and value (B, S, D), four (D, D) weights in ``nn.Linear`` layout
    (y = x @ w.T, no bias) and a bool mask broadcastable to (B, H, T, S) must return
    ``(out, weights)``: out (B, T, D), per-head weights (B, H, T, S).

    Raises:
        ShapeError: for a result that is not ``(out, weights)``, weights averaged over
            heads (pitfall P13), or another wrong shape.
        CheckError: naming ``x @ w`` instead of ``x @ w.T``, heads split or merged
            across tokens (P8, P9), an inverted mask (P3), the scale of d_model, a
            missing w_o, a call of the library's ``MultiHeadAttention`` (loaded with
            the weights), or the first wrong value.
    """
    gen = torch.Generator().manual_seed(5)
    for b, t, s, d, h, masked in ((2, 3, 5, 24, 4, False), (3, 4, 6, 10, 2, True)):
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
            mask[-1, ..., s // 2 :] = False  # padding in the last item
        out, weights = out_and_weights(fn(x, mem, mem, *ws, h, mask))
        with torch.no_grad():
            ref_out, ref_w = ref(x, mem, mem, mask)
        check_shape(out, (b, t, d), "out")
        if isinstance(weights, Tensor) and tuple(weights.shape) == (b, t, s):
            fail(
                "weights have shape (B, T, S): they were averaged over the heads "
                "(pitfall P13)",
                "return the per-head weights, (B, H, T, S).",
                kind=ShapeError,
            )
        check_shape(weights, (b, h, t, s), "weights")
        if masked and not close(weights, ref_w):
            with torch.no_grad():
                open_out, open_w = ref(x, mem, mem)
            if close(weights, open_w) and close(out, open_out):
                fail(
                    "the mask had no effect: the padded keys of the last item still "
                    "get weight",
                    "set the scores to -inf where the mask is False, before the "
                    "softmax (True = may attend).",
                )
        if close(weights, ref_w) and not close(out, ref_out):
            vh = (mem @ ws[2].T).view(b, s, h, d // h).transpose(1, 2)
            heads = ref_w @ vh  # (B, H, T, d_k)
            if close(out, heads.permute(0, 2, 3, 1).reshape(b, t, d) @ ws[3].T):
                fail(
                    "the weights are right, but each token's merged features run "
                    "feature by feature, (d_k, H), not head by head, (H, d_k)",
                    "token t must read [head 0 of t | head 1 of t | ...]: transpose "
                    "to (B, T, H, d_k) before the reshape.",
                )
        if not (close(weights, ref_w) and close(out, ref_out)):
            for wrong, message, hint in _MHA_MISTAKES:
                w_out, w_w = wrong(x, mem, mem, *ws, h, mask)
                if close(out, w_out) and close(weights, w_w):
                    fail(message, hint)
        check_close(weights, ref_w, name="weights")
        check_close(
            out,
            ref_out,
            name="out",
            hint="the weights are right: look at the merge and w_o.",
        )
    return passed("multi-head attention matches the library's MultiHeadAttention")
