"""Property checks for any attention function ``fn(q, k, v, mask)`` (chapter 5):
causal leakage, padding invariance, mask polarity and fully masked rows. They need no
reference answer; ``ch05.check_attention_properties`` runs them together with one."""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_course.exercises._common import (
    Tensor,
    check_close,
    exercise_check,
    fail,
    first_output,
    passed,
)
from transformer_course.exercises._language import gettext


def _qkv4(gen: torch.Generator, b: int, h: int, t: int, s: int, d: int):
    return tuple(torch.randn(b, h, n, d, generator=gen) for n in (t, s, s))


@exercise_check
def check_causal_leakage(fn: Callable[..., Tensor], *, name: str = "fn") -> bool:
    """Property check: with a causal mask, changing the tokens after position t must not
    change any output at or before t.

    ``fn(q, k, v, mask)`` takes q, k, v (B, H, T, d) and a bool (T, T) mask (True = may
    attend) and returns the output (B, H, T, d) or a tuple ``(out, weights)``.

    Raises:
        CheckError: naming the output position that changed, by how much, and which
            future positions were changed.
    """
    from transformer_course.masks import causal_mask

    gen = torch.Generator().manual_seed(50)
    t = 6
    q, k, v = _qkv4(gen, 2, 2, t, t, 8)
    mask = causal_mask(t)
    base = first_output(fn(q, k, v, mask))
    for cut in range(t - 1):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[..., cut + 1 :, :] = torch.randn(
                x[..., cut + 1 :, :].shape, generator=gen
            )
        out = first_output(fn(q2, k2, v2, mask))
        diff = (
            (out[..., : cut + 1, :] - base[..., : cut + 1, :]).abs().amax(dim=(0, 1, 3))
        )
        if not torch.isfinite(diff).all() or (diff > 1e-5).any():
            pos = int(torch.nonzero(~(diff <= 1e-5))[0])
            fail(
                "{name}: the output at position {pos} changed by {diff:.3g} when "
                "only positions {first}..{last} changed: the future leaked into "
                "position {pos}",
                "hide the masked keys before the softmax (scores = -inf where the "
                "mask is False); True means 'may attend'.",
                name=name,
                pos=pos,
                diff=diff[pos].item(),
                first=cut + 1,
                last=t - 1,
            )
    return passed(
        "{name}: no causal leakage (outputs at or before t ignore tokens after t)",
        name=name,
    )


@exercise_check
def check_padding_invariance(fn: Callable[..., Tensor], *, name: str = "fn") -> bool:
    """Property check: appending padding keys (hidden by a (B, 1, 1, S) padding mask)
    must not change the outputs at the real positions, and must not produce NaN.

    ``fn(q, k, v, mask)`` as in ``check_causal_leakage``; here the mask is (B, 1, 1, S).

    Raises:
        CheckError: naming the real position whose output changed and by how much.
    """
    gen = torch.Generator().manual_seed(51)
    b, h, n, d = 2, 2, 4, 8
    q, k, v = _qkv4(gen, b, h, n, n, d)
    real_only = torch.ones(b, 1, 1, n, dtype=torch.bool)
    base = first_output(fn(q, k, v, real_only))
    for n_pad in (1, 3):
        extra = [torch.randn(b, h, n_pad, d, generator=gen) * 5 for _ in range(3)]
        qp, kp, vp = (torch.cat((x, e), dim=-2) for x, e in zip((q, k, v), extra))
        mask = torch.ones(b, 1, 1, n + n_pad, dtype=torch.bool)
        mask[..., n:] = False  # the appended keys are padding
        out = first_output(fn(qp, kp, vp, mask))
        if not torch.isfinite(out).all():
            fail(
                "{name}: NaN/inf in the output after appending {n_pad} padding key(s)",
                "no real query has all keys masked here; look for -inf - -inf or a "
                "division by zero.",
                name=name,
                n_pad=n_pad,
            )
        diff = (out[..., :n, :] - base).abs().amax(dim=(0, 1, 3))
        if (diff > 1e-5).any():
            pos = int(torch.nonzero(diff > 1e-5)[0])
            fail(
                "{name}: the output at real position {pos} changed by {diff:.3g} "
                "when {n_pad} masked padding key(s) were appended: padding leaked "
                "into real positions",
                "a (B, 1, 1, S) mask hides key columns; apply it to the scores "
                "before the softmax.",
                name=name,
                pos=pos,
                diff=diff[pos].item(),
                n_pad=n_pad,
            )
    return passed(
        "{name}: padding invariance (appended padding changes nothing)", name=name
    )


@exercise_check
def check_mask_polarity(fn: Callable[..., Tensor], *, name: str = "fn") -> bool:
    """Property check: True in the mask means "may attend". With one allowed key per
    query, the output must be exactly that key's value.

    Raises:
        CheckError: saying whether the function attends where the mask is False
            (inverted polarity, pitfall P3) or ignores the mask.
    """
    t = 3
    q = torch.zeros(1, 1, t, 4)
    k = torch.zeros(1, 1, t, 4)
    v = torch.eye(t)[None, None]  # (1, 1, 3, 3): value j is the one-hot e_j
    allowed = [2, 0, 1]
    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[torch.arange(t), allowed] = True
    out = first_output(fn(q, k, v, mask))[0, 0]  # (T, 3): row i = weights of query i
    want = v[0, 0, allowed]
    if torch.allclose(out, want, atol=1e-5):
        return passed("{name}: mask polarity (True = may attend)", name=name)
    if torch.allclose(out, (1 - want) / (t - 1), atol=1e-5):
        fail(
            "{name}: query 0 may attend only key 2, yet its output is {out}: "
            "it attended to every key except the allowed one. The mask "
            "polarity is inverted",
            "here True = may attend; nn.MultiheadAttention uses True = blocked "
            "(pitfall P3). Fill the scores where ~mask.",
            name=name,
            out=[round(x, 3) for x in out[0].tolist()],
        )
    if torch.allclose(out, want / t, atol=1e-5):
        fail(
            "{name}: query 0 may attend only key 2, yet that key's weight is "
            "{out:.3f}, not 1: the mask was applied after the softmax, so the "
            "hidden keys still took their share of the denominator",
            "hide the masked keys in the scores, before the softmax.",
            name=name,
            out=out[0, 2].item(),
        )
    if torch.allclose(out, torch.full_like(out, 1 / t), atol=1e-5):
        fail(
            "{name}: the mask had no effect: query 0 mixed all keys equally",
            "apply the mask to the scores before the softmax.",
            name=name,
        )
    fail(
        "{name}: query 0 may attend only key 2 and should output {want}, got {out}",
        "the mask is indexed [query, key]: row i says which keys query i may see.",
        name=name,
        want=want[0].tolist(),
        out=[round(x, 3) for x in out[0].tolist()],
    )


@exercise_check
def check_fully_masked_rows(fn: Callable[..., Tensor], *, name: str = "fn") -> bool:
    """Property check (pitfalls P1, P6): a query whose keys are all masked gets a zero
    output, never NaN, also in the gradients; the other batch items are unaffected.

    Raises:
        CheckError: naming NaN in the output or gradients, or a non-zero (uniform)
            output for the fully masked item.
    """
    gen = torch.Generator().manual_seed(53)
    q, k, v = (x.requires_grad_() for x in _qkv4(gen, 2, 1, 3, 3, 4))
    mask = torch.ones(2, 1, 1, 3, dtype=torch.bool)
    mask[1] = False  # item 1: every key is padding
    out = first_output(fn(q, k, v, mask))
    if not torch.isfinite(out).all():
        fail(
            "{name}: a query whose keys are all masked gives NaN (pitfall P1)",
            "softmax over only -inf is 0/0; make that row's weights exactly 0.",
            name=name,
        )
    if out[1].abs().max() > 1e-6:
        fail(
            "{name}: the item whose keys are all masked has output [{row}] "
            "(row 0), expected 0: filling masked scores with a large finite "
            "number makes the row uniform (pitfall P6)",
            "use -inf and set rows with no visible key to 0 after the softmax.",
            name=name,
            row=", ".join(f"{x:.3f}" for x in out[1, 0, 0].tolist()),
        )
    out[0].sum().backward()
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if x.grad is not None and not torch.isfinite(x.grad).all():
            fail(
                "{name}: the gradient of {arg} has NaN although the loss uses only "
                "the unmasked item (pitfall P1: the NaN spreads through the batch)",
                "avoid exp(-inf - -inf); guard the division by the row sum.",
                name=name,
                arg=arg,
            )
    alone = first_output(fn(q[:1].detach(), k[:1].detach(), v[:1].detach(), mask[:1]))
    check_close(
        out[:1].detach(), alone.detach(), name=gettext("output of the unmasked item")
    )
    return passed(
        "{name}: fully masked rows give zeros, no NaN (output and gradients)", name=name
    )
