"""Chapter 2, scaled dot-product attention: a stable masked softmax along any axis,
attention in the (B, T, H, d) layout with a key padding mask, and "find the bug"."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.attention import masked_softmax, scaled_dot_product_attention
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
    random_qkv,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids

_P3 = (
    N_(
        "the mask is inverted: your weights sit on the keys the mask hides, and the "
        "keys it allows get 0 (pitfall P3)"
    ),
    N_(
        "here True means 'may attend'; PyTorch's nn.MultiheadAttention uses the opposite "
        "convention."
    ),
)
_P1 = (
    N_("a query whose keys are all masked gives NaN (pitfall P1)"),
    N_(
        "softmax over a row of only -inf is 0/0: that row's weights (and output) must be "
        "0, so guard the division."
    ),
)
_P6 = (
    N_(
        "a query whose keys are all masked gets a uniform row ({row}), expected zeros: "
        "a large finite fill such as -1e9 turns an empty row into an average (pitfall P6)"
    ),
    N_("use -inf, so exp gives exactly 0, and guard the division for empty rows."),
)
_AFTER = (
    N_(
        "the visible weights of a row sum to {total:.3f}, not 1: the masked keys "
        "were zeroed after the softmax, so they still count in its denominator"
    ),
    N_("hide the masked keys before the softmax, in the scores."),
)


def _check_masked_rows(w: Tensor, scores: Tensor, mask: Tensor, empty, dim: int = -1):
    """Shared by the softmax and the attention checks: polarity, mask-after-softmax,
    NaN and uniform empty rows, in the order that names the actual mistake."""
    has_key = mask.expand_as(w).any(dim, keepdim=True).expand_as(w)
    hidden = ~mask.expand_as(w) & has_key
    seen = torch.nan_to_num(w.detach(), nan=0.0)
    if (seen[hidden] != 0).any():
        if (seen[mask.expand_as(w) & has_key].abs() < 1e-6).all():
            fail(*_P3)
        if close(w, torch.softmax(scores, dim)):
            fail(
                "the mask had no effect: masked keys got the same weight as without "
                "a mask",
                "set the scores to -inf where the mask is False.",
            )
        fail(
            "a masked key got a non-zero weight",
            "set the scores to -inf where the mask is False, before the softmax.",
        )
    total = seen.sum(dim)
    rows = hidden.any(dim)
    if rows.any() and (total[rows] < 1 - 1e-4).all():
        fail(*_AFTER, total=total[rows][0].item())
    if not torch.isfinite(w[has_key]).all():
        fail(
            "NaN/inf in a row that has visible keys",
            "subtract the row maximum of the visible scores before exp.",
        )
    row = w[empty]
    if torch.isnan(row).any():
        fail(*_P1)
    if (row != 0).any():
        if torch.allclose(row, torch.full_like(row, 1 / row.shape[-1]), atol=1e-4):
            each = gettext("each weight {weight:.3f}").format(weight=1 / row.shape[-1])
            fail(*_P6, row=each)
        fail(
            "a query whose keys are all masked gets weights {row}, expected zeros",
            _P6[1],
            row=[round(x, 3) for x in row.flatten().tolist()],
        )


@exercise_check
@forbids(masked_softmax)
def check_stable_softmax(fn: Callable[..., Tensor]) -> bool:
    """Chapter 2, exercise "stable masked softmax": ``fn(scores, mask=None, dim=-1)``
    with scores of any shape and an optional bool mask broadcastable to them (True =
    may attend) must return the softmax along ``dim``, exact zeros where masked, and
    zeros for a slice with no visible entry (not NaN, P1; not uniform, P6), even for
    scores in the thousands.

    Scores around 1000 are compared within float32's precision at that scale
    (2 eps x 1010 = 2.4e-4 relative), so the logsumexp form exp(s - logsumexp(s)),
    which loses about 2.5e-5 there, is accepted.

    Raises:
        CheckError: naming the wrong axis, an ignored ``dim``, overflow, one maximum
            for the whole tensor (rows near 0 next to rows near 1000 underflow), an
            inverted mask (P3), a mask applied after the softmax, a NaN (P1) or
            uniform (P6) empty row, a call to the library's ``masked_softmax``, or
            the first wrong value.
    """
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 5, generator=gen)  # (B, T, S), all sizes differ
    w = fn(scores)
    check_shape(w, scores.shape, "weights")
    if not close(w.sum(-1), torch.ones(2, 3)):
        hint = N_("normalise along dim: exp(s) / exp(s).sum(dim=dim, keepdim=True).")
        if close(w.sum(-2), torch.ones(2, 5)):
            fail(
                "each column (dim=-2) sums to 1, not each row: the softmax ran over "
                "the queries",
                hint,
            )
        fail("the weights of a row do not sum to 1 over the last axis", hint)
    check_close(w, torch.softmax(scores, -1), name="weights")
    keys_first = scores.transpose(-2, -1)  # (B, S, T): the keys along dim=-2
    try:
        w = fn(keys_first, dim=-2)
    except TypeError as err:
        fail(
            "fn(scores, dim=-2) raised TypeError: {err}",
            "the signature is my_softmax(scores, mask=None, dim=-1).",
            err=err,
        )
    check_shape(w, keys_first.shape, gettext("weights for dim=-2"))
    if close(w, torch.softmax(keys_first, -1)):
        fail(
            "fn(scores, dim=-2) normalised the last axis: the dim argument was ignored",
            "use dim in every reduction (max, sum), with keepdim=True.",
        )
    check_close(w, torch.softmax(keys_first, -2), name=gettext("weights for dim=-2"))
    big = scores * 10 + 1000.0  # exp(1000) overflows float32
    w = fn(big)
    if not torch.isfinite(w).all():
        fail(
            "scores around 1000 give NaN or inf: exp() overflowed",
            "softmax does not change when a constant is subtracted from a row; "
            "choose the constant so that exp never sees a large number.",
        )
    # float32 holds scores near 1000 to 6e-5: a right answer that subtracts a large
    # number (logsumexp form) loses that much, so the tolerance grows with the scale
    rtol = 1e-5 + 2 * torch.finfo(torch.float32).eps * big.abs().max().item()
    check_close(
        w,
        torch.softmax(big, -1),
        rtol=rtol,
        name=gettext("weights for large scores"),
        hint=N_(
            "the error is larger than float32's precision at this scale: subtract "
            "each row's maximum before exp."
        ),
    )
    mixed = scores.clone()
    mixed[0] = mixed[0] + 1000.0  # batch item 0 around 1000, item 1 around 0
    w = fn(mixed)
    check_shape(w, mixed.shape, gettext("weights for mixed scores"))
    low = torch.nan_to_num(w[1].detach(), nan=0.0)
    if not torch.isfinite(w[0]).all() or (low.sum(-1) < 0.5).any():
        fail(
            "rows of scores around 0 next to rows around 1000 get weights {row} "
            "(expected {want}): the maximum you subtract is the whole tensor's, so "
            "exp(0 - 1000) underflows to 0 in the low rows",
            "subtract each slice's own maximum along dim: s.amax(dim, keepdim=True).",
            row=[round(x, 3) for x in low[0].tolist()],
            want=[round(x, 3) for x in torch.softmax(mixed[1, 0], -1).tolist()],
        )
    check_close(
        w, torch.softmax(mixed, -1), rtol=rtol, name=gettext("weights for mixed scores")
    )
    mask = torch.rand(2, 3, 5, generator=gen) > 0.4
    mask[:, :, 0] = True
    mask[1, 2] = False  # one row sees no key at all
    w = fn(scores, mask)
    check_shape(w, scores.shape, gettext("masked weights"))
    _check_masked_rows(w, scores, mask, (1, 2))
    check_close(w, masked_softmax(scores, mask), name=gettext("masked weights"))
    w = fn(keys_first, mask.transpose(-2, -1), dim=-2)
    check_shape(w, keys_first.shape, gettext("masked weights for dim=-2"))
    _check_masked_rows(w, keys_first, mask.transpose(-2, -1), (1, slice(None), 2), -2)
    check_close(
        w,
        masked_softmax(scores, mask).transpose(-2, -1),
        name=gettext("masked weights for dim=-2"),
    )
    return passed("stable masked softmax: any axis, large scores, masks and empty rows")


def _diagnose_attention(fn, q, k, v, w, ref_w, mask=None):
    """Name the mistake behind weights that differ from the reference."""
    sums = w.sum(-1)
    if not close(sums, torch.ones_like(sums)) and mask is None:
        hint = N_("each query's weights are normalised over the keys, the last axis.")
        if close(w.sum(0), torch.ones_like(w[0])):
            fail(
                "the weights of one query position sum to 1 across the batch: the "
                "softmax ran over the batch axis (pitfall P11)",
                hint,
            )
        if close(w.sum(-2), torch.ones_like(w[..., 0, :])):
            fail(
                "each key's column of weights sums to 1: the softmax ran over the "
                "queries (dim=-2, pitfall P11)",
                hint,
            )
        fail(
            "the weights of a query sum to {sums:.3f} over the keys, expected 1",
            hint,
            sums=sums.flatten()[0].item(),
        )
    if close(w, torch.full_like(w, 1 / w.shape[-1])) and not close(w, ref_w):
        fail(
            "every key gets the same weight 1/S: the scores do not depend on q and k",
            "the weights come from softmax of the scaled scores q k^T.",
        )
    d_v = v.shape[-1]
    if d_v != q.shape[-1]:
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d_v)).masked_fill(
            torch.zeros((), dtype=torch.bool) if mask is None else ~mask, -math.inf
        )
        if close(w, torch.softmax(scores, -1).nan_to_num(0.0)) and not close(w, ref_w):
            fail(
                "your scores are divided by sqrt(d_v), the size of a value, not by "
                "sqrt(d_k)",
                "the scale comes from the vectors that are multiplied: queries and "
                "keys.",
            )
    for wrong, message, hint in (
        (
            pitfalls.attention_unscaled,
            N_(
                "your weights are softmax(q k^T) without the 1/sqrt(d_k) scale "
                "(pitfall P12)"
            ),
            N_("the scores need one more factor before the softmax; see 'Why divide'."),
        ),
        (
            pitfalls.attention_scaled_by_d_k,
            N_("your weights are too flat: the scores were divided by d_k"),
            N_("the variance of q . k is d_k: divide by its standard deviation."),
        ),
    ):
        if close(w, wrong(q, k, v, mask)[1]) and not close(w, ref_w):
            fail(message, hint)


@exercise_check
@forbids(scaled_dot_product_attention)
def check_masked_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 2, exercise "find the bug": ``fn(q, k, v, mask=None)`` with q
    (B, T, d_k), k (B, S, d_k), v (B, S, d_v) and a bool mask broadcastable to
    (B, T, S) (True = may attend) must return ``(out, weights)`` as
    ``scaled_dot_product_attention`` does.

    Raises:
        ShapeError: for a result that is not ``(out, weights)`` or a wrong shape.
        CheckError: naming a missing 1/sqrt(d_k) (P12), a softmax over the wrong axis
            (P11), an inverted mask (P3), NaN (P1) or a uniform row (P6) for a query
            with no key, batch items leaking into each other, a call to the library's
            ``scaled_dot_product_attention``, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(4)
    for b, t, s, d, dv in ((1, 2, 3, 4, 5), (2, 3, 5, 8, 4), (3, 4, 6, 16, 2)):
        q, k, v = random_qkv(gen, (b,), t, s, d, dv)
        out, w = out_and_weights(fn(q, k, v))
        check_shape(w, (b, t, s), "weights")
        check_shape(out, (b, t, dv), "out")
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        _diagnose_attention(fn, q, k, v, w, ref_w)
        check_close(w, ref_w, name="weights")
        check_close(
            out, ref_out, name="out", hint="the weights are right: out = weights @ v."
        )
        if b > 1:
            perm = torch.randperm(b, generator=gen)
            out_p, _ = out_and_weights(fn(q[perm], k[perm], v[perm]))
            if not close(out_p, out[perm]):
                fail(
                    "permuting the batch does not permute the outputs: batch items "
                    "leak into each other (pitfall P11)",
                    "never normalise or transpose over dim 0.",
                )
    q, k, v = random_qkv(gen, (2,), 3, 4, 8, 5)
    mask = torch.tensor(
        [
            [True, True, False, False],
            [True, True, True, False],
            [False, False, False, False],
        ]
    )  # (T, S): last query sees nothing
    out, w = out_and_weights(fn(q, k, v, mask))
    check_shape(w, (2, 3, 4), gettext("masked weights"))
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    _check_masked_rows(w, scores, mask, (slice(None), 2))
    check_close(w, ref_w, name=gettext("masked weights"))
    check_close(
        out,
        ref_out,
        name=gettext("masked out"),
        hint="the weights are right: out = weights @ v.",
    )
    return passed("scaled, masked attention matches the library on 4 inputs")


@exercise_check
@forbids(scaled_dot_product_attention)
def check_attention_bthd(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 2, exercise "attention in the (B, T, H, d) layout":
    ``fn(q, k, v, key_padding_mask=None)`` with q (B, T, H, d_k), k (B, S, H, d_k),
    v (B, S, H, d_v) (the layout of FlashAttention and many checkpoints) and a bool
    key_padding_mask (B, S), True = real token, must return ``(out, weights)``: out
    (B, T, H, d_v), weights (B, H, T, S), scaled and masked as in the chapter.

    Raises:
        ShapeError: for a result that is not ``(out, weights)``, an output left as
            (B, H, T, d_v), or another wrong shape.
        CheckError: naming a missing scale (P12), the wrong softmax axis (P11), an
            inverted mask (P3), NaN (P1) or uniform (P6) rows, a call to the library's
            ``scaled_dot_product_attention``, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(12)
    for b, t, s, h, d, dv, padded in (
        (1, 2, 3, 4, 8, 5, False),
        (2, 3, 5, 4, 6, 7, True),
    ):
        q, k, v = random_qkv(gen, (b, h), t, s, d, dv)  # (B, H, T, d): the reference
        kpm = None
        if padded:
            kpm = torch.ones(b, s, dtype=torch.bool)
            kpm[0, 3:] = False  # item 0: two padding tokens
            kpm[1] = False  # item 1: nothing but padding
        bthd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        out, w = out_and_weights(fn(*bthd, kpm) if padded else fn(*bthd))
        check_shape(w, (b, h, t, s), "weights")
        if isinstance(out, Tensor) and tuple(out.shape) == (b, h, t, dv) and h != t:
            fail(
                "out has shape (B, H, T, d_v): the layout asked for is (B, T, H, d_v)",
                "undo the axis change you made on the way in.",
                kind=ShapeError,
            )
        check_shape(out, (b, t, h, dv), "out")
        mask = None if kpm is None else kpm[:, None, None, :]  # (B, 1, 1, S)
        ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask)
        if mask is None:
            _diagnose_attention(fn, q, k, v, w, ref_w)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            _check_masked_rows(w, scores, mask, (1,))
        check_close(w, ref_w, name="weights")
        check_close(
            out,
            ref_out.transpose(1, 2),
            name="out",
            hint="the weights are right: look at weights @ v and its layout.",
        )
    return passed("attention in the (B, T, H, d) layout with a key padding mask")
