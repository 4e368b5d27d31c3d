"""Chapter 5, masks: attention checked against a reference and four properties, the
causal mask for a KV cache, the padding mask and a decoder's combined mask."""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_course.attention import scaled_dot_product_attention, sdpa_attention
from transformer_course.exercises import pitfalls
from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    check_close,
    check_shape,
    exercise_check,
    fail,
    first_output,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids
from transformer_course.exercises._properties import (
    _qkv4,
    check_causal_leakage,
    check_fully_masked_rows,
    check_mask_polarity,
    check_padding_invariance,
)
from transformer_course.flash import tiled_attention
from transformer_course.masks import causal_mask, padding_mask

_REFERENCE_MISTAKES = (
    (
        pitfalls.attention_unscaled,
        N_(
            "the output is softmax(q k^T) v without the 1/sqrt(d_k) scale (pitfall P12)"
        ),
        N_("the scores need one more factor before the softmax (chapter 2)."),
    ),
    (
        pitfalls.attention_softmax_over_queries,
        N_(
            "the softmax ran over the queries (dim=-2), not over the keys (pitfall P11)"
        ),
        N_("each query's weights must sum to 1 over the keys: the last axis."),
    ),
    (
        pitfalls.attention_ignores_qk,
        N_("the output is a plain average of the visible values: q and k are not used"),
        N_("the weights come from the softmax of the scaled scores q k^T."),
    ),
    (
        pitfalls.attention_scaled_by_d_k,
        N_("the scores were divided by d_k instead of sqrt(d_k)"),
        N_("the variance of q . k is d_k: divide by its standard deviation."),
    ),
)


def _compare_with_reference(fn, name: str, masked: bool) -> None:
    """fn on inputs with B, H, T, S, d all different, against the library."""
    from transformer_course.masks import combine_masks

    gen = torch.Generator().manual_seed(54)
    b, h, t, s, d = 2, 3, 4, 6, 5
    q, k, v = _qkv4(gen, b, h, t, s, d)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    if masked:
        mask[0, ..., 4:] = False  # item 0: two padding keys
        mask = combine_masks(mask, causal_mask(t, s))
    out = first_output(fn(q, k, v, mask))
    ref = scaled_dot_product_attention(q, k, v, mask)[0]
    check_shape(out, ref.shape, gettext("{name}'s output").format(name=name))
    if torch.allclose(out.detach(), ref, atol=1e-5):
        return
    if not masked and (~torch.isfinite(out) | (out == 0)).all():
        fail(
            "{name}: with a mask that is all True (every key visible) the "
            "output is 0 or NaN: the mask is inverted (pitfall P3)",
            "here True means 'may attend', the opposite of nn.MultiheadAttention.",
            name=name,
        )
    q2 = q.clone()
    q2[..., -1, :] += 1.0  # change only the last query
    out2 = first_output(fn(q2, k, v, mask))
    if not torch.allclose(out2[..., :-1, :], out[..., :-1, :], atol=1e-5):
        fail(
            "{name}: changing only the last query changed the outputs of the "
            "other queries: the softmax normalised over the queries, not the "
            "keys (pitfall P11)",
            "each query's weights must sum to 1 over the keys.",
            name=name,
        )
    for wrong, message, hint in _REFERENCE_MISTAKES:
        if torch.allclose(out.detach(), wrong(q, k, v, mask)[0], atol=1e-5):
            fail("{name}: {message}", hint, name=name, message=gettext(message))
    label = N_("{name}'s output with a mask") if masked else N_("{name}'s output")
    check_close(out, ref, name=gettext(label).format(name=name))


@exercise_check
@forbids(scaled_dot_product_attention, sdpa_attention, tiled_attention)
def check_attention_properties(fn: Callable[..., Tensor], *, name: str = "fn") -> bool:
    """Chapter 5, "find the bug: masked attention": compare ``fn(q, k, v, mask)`` with
    the library's attention on inputs whose sizes all differ, then run the four
    property checks (mask polarity, causal leakage, padding invariance, fully masked
    rows), then compare again under a causal and padding mask.

    Raises:
        CheckError: naming a missing scale, a softmax over the queries, an output that
            ignores q and k, or the first property that fails.
    """
    _compare_with_reference(fn, name, masked=False)
    for check in (
        check_mask_polarity,
        check_causal_leakage,
        check_padding_invariance,
        check_fully_masked_rows,
    ):
        check.strict(fn, name=name)
    _compare_with_reference(fn, name, masked=True)
    return passed(
        "{name}: matches the reference, and all four mask properties hold", name=name
    )


# ------------------------------------------------------ chapter 5: masks (exercises)


@exercise_check
@forbids(causal_mask)
def check_causal_mask(fn: Callable[[int, int], Tensor]) -> bool:
    """Chapter 5, exercise "causal mask for a KV cache": ``fn(q_len, k_len)`` must return
    a bool (T, S) mask, True = may attend, with query i seeing keys j <= i + S - T
    (queries aligned to the last keys, bottom-right).

    Raises:
        CheckError: naming a non-bool mask, inverted polarity, a masked diagonal, or
            top-left alignment.
    """
    for t, s in ((4, 4), (2, 5), (1, 6), (3, 3)):
        out = fn(t, s)
        check_shape(out, (t, s), f"fn({t}, {s})")
        if out.dtype != torch.bool:
            fail(
                "fn({t}, {s}) has dtype {out_dtype}, expected torch.bool",
                "a comparison of index tensors gives a bool tensor.",
                kind=ShapeError,
                t=t,
                s=s,
                out_dtype=out.dtype,
            )
        ref = causal_mask(t, s)
        if torch.equal(out, ref):
            continue
        if torch.equal(out, ~ref):
            fail(
                "fn({t}, {s}) is inverted: True marks the future",
                "True = may attend; key j is visible when it is not in the future.",
                t=t,
                s=s,
            )
        if torch.equal(out, torch.tril(torch.ones(t, s, dtype=torch.bool), s - t - 1)):
            fail(
                "fn({t}, {s}) hides the diagonal: a token may attend to itself",
                "use <=, not <.",
                t=t,
                s=s,
            )
        if torch.equal(out, torch.tril(torch.ones(t, s, dtype=torch.bool), s - t + 1)):
            fail(
                "fn({t}, {s}) lets each query see one key too many: the next token, "
                "which is in the future",
                "query i sees keys j <= i + k_len - q_len: mind the diagonal offset.",
                t=t,
                s=s,
            )
        if t != s and torch.equal(out, pitfalls.causal_mask_wrong_offset(t, s)):
            fail(
                "fn({t}, {s}) hides keys the last queries must see: the diagonal "
                "offset points the wrong way",
                "with more keys than queries, query i may see more than i + 1 keys.",
                t=t,
                s=s,
            )
        if torch.equal(out, pitfalls.causal_mask_top_left(t, s)):
            fail(
                "fn({t}, {s}) is aligned top-left: query 0 sees only key 0. With "
                "{s} keys and {t} queries (decoding with a cache) the queries are "
                "the last {t} tokens",
                "query i sits at position i + k_len - q_len.",
                t=t,
                s=s,
            )
        check_close(out.int(), ref.int(), name=f"fn({t}, {s})")
    return passed("causal masks right, square and bottom-right aligned")


@exercise_check
@forbids(padding_mask)
def check_padding_mask(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 5, exercise "find the bug: padding mask": ``fn(tokens, pad_id)`` with
    integer tokens (B, S) must return a bool (B, 1, 1, S) mask, True = real key.

    Raises:
        CheckError: naming a mask on the query axis (B, 1, S, 1) (pitfall P5), inverted
            polarity, or a missing singleton axis.
    """
    for tokens, pad in (
        (torch.tensor([[5, 7, 0, 0]]), 0),
        (torch.tensor([[3, 1, 2], [4, 9, 9]]), 9),
    ):
        b, s = tokens.shape
        out = fn(tokens, pad)
        if isinstance(out, Tensor) and tuple(out.shape) == (b, 1, s, 1):
            fail(
                "the mask has shape (B, 1, S, 1) = {out_shape}: it hides padded "
                "queries (rows), not padded keys (columns), so real tokens still "
                "attend to padding (pitfall P5)",
                "padding is a property of the keys: the mask must vary along the "
                "last axis, the keys' axis.",
                out_shape=tuple(out.shape),
            )
        check_shape(out, (b, 1, 1, s), "mask")
        if out.dtype != torch.bool:
            fail(
                "the mask has dtype {out_dtype}, expected torch.bool",
                "a comparison such as == or != gives a bool tensor.",
                kind=ShapeError,
                out_dtype=out.dtype,
            )
        ref = padding_mask(tokens, pad)
        if torch.equal(out, ~ref):
            fail(
                "the mask is inverted: True marks the padding",
                "True = may attend, so True for real tokens: tokens != pad_id.",
            )
        check_close(out.int(), ref.int(), name="mask")
    return passed("padding mask (B, 1, 1, S) hides padded keys")


@exercise_check
def check_decoder_mask(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 5, exercise "find the bug: a decoder's mask": ``fn(tokens, pad_id)``
    with integer tokens (B, T) must return the bool (B, 1, T, T) self-attention mask
    of a decoder, True = may attend: query i sees key j when j <= i and token j is not
    padding. A mask that also hides the rows of padded queries is accepted (real
    tokens see the same keys; a padded query's output is then 0).

    Raises:
        ShapeError: for a wrong shape.
        CheckError: naming padding on the query axis (pitfall P5), masks combined with
            "or", a missing causal or padding part, or an inverted mask.
    """
    for tokens, pad in (
        (torch.tensor([[5, 7, 3, 0, 0]]), 0),
        (torch.tensor([[9, 9, 4, 1], [3, 1, 2, 6], [4, 8, 9, 9]]), 9),
    ):
        b, t = tokens.shape
        out = fn(tokens, pad)
        check_shape(out, (b, 1, t, t), "mask")
        if out.dtype != torch.bool:
            fail(
                "the mask has dtype {out_dtype}, expected torch.bool",
                "combine bool masks with logical operators, not with + or *.",
                kind=ShapeError,
                out_dtype=out.dtype,
            )
        causal, keys = causal_mask(t), padding_mask(tokens, pad)
        queries = (tokens != pad)[:, None, :, None]
        ref = causal & keys
        if torch.equal(out, ref) or torch.equal(out, ref & queries):
            continue  # hiding padded queries' rows too is defensible: they get zeros
        if torch.equal(out, ~ref):
            fail(
                "the mask is inverted: True marks what must be hidden",
                "True = may attend.",
            )
        for wrong, message in (
            (
                causal & queries,
                N_(
                    "the padding part varies along the queries (rows): it hides the "
                    "rows of padded queries, not the padded keys, so in a "
                    "left-padded sequence a real token attends to the padding "
                    "before it (pitfall P5)"
                ),
            ),
            (
                causal | queries,
                N_(
                    "the two masks were combined with 'or', and the "
                    "padding part varies along the queries (pitfall P5)"
                ),
            ),
            (
                causal | keys,
                N_(
                    "the two masks were combined with 'or': a key is "
                    "visible when either mask allows it"
                ),
            ),
            (
                causal.expand_as(ref),
                N_("padded keys are visible: only the causal part is there"),
            ),
            (
                keys.expand_as(ref),
                N_("future keys are visible: only the padding part is there"),
            ),
            (
                causal & ~keys,
                N_(
                    "the padding part is inverted: padded keys are visible and the "
                    "real ones hidden"
                ),
            ),
            (
                torch.ones(t, t, dtype=torch.bool).triu() & keys,
                N_(
                    "the causal part is upper-triangular (triu): each query sees "
                    "itself and the future, not the past"
                ),
            ),
        ):
            if torch.equal(out, wrong):
                fail(
                    message,
                    "a key is visible only if it is in the past (or now) "
                    "and it is a real token.",
                )
        check_close(out.int(), ref.int(), name="mask")
    return passed("decoder mask: causal and padding combined, (B, 1, T, T)")
