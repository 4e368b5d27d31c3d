"""Chapter 2, scaled dot-product attention: a stable masked softmax and masked attention."""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_course.attention import masked_softmax, scaled_dot_product_attention
from transformer_course.exercises._common import (
    Tensor,
    check_close,
    check_shape,
    exercise_check,
    fail,
    out_and_weights,
    passed,
    random_qkv,
)


@exercise_check
def check_stable_softmax(fn: Callable[..., Tensor]) -> bool:
    """Chapter 2, exercise "stable masked softmax": ``fn(scores, mask=None)`` with scores
    (..., T, S) and an optional bool mask broadcastable to them (True = keep) must return
    softmax over the last axis, exact zeros where masked, and an all-zero row where a
    query keeps no key (not NaN, pitfall P1; not uniform, pitfall P6), even for scores
    in the thousands.

    Raises:
        CheckError: naming overflow (NaN/inf), the wrong axis, a masked entry with
            weight, a NaN or uniform empty row, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 5, generator=gen)
    w = fn(scores)
    check_shape(w, scores.shape, "weights")
    if not torch.allclose(w.sum(-1), torch.ones(2, 3), atol=1e-5):
        fail("the weights of a row do not sum to 1 over the last axis (the keys)",
              "normalise over dim=-1: exp(s) / exp(s).sum(dim=-1, keepdim=True).")
    check_close(w, torch.softmax(scores, -1), name="weights")
    big = scores * 10 + 1000.0  # exp(1000) overflows float32
    w = fn(big)
    if not torch.isfinite(w).all():
        fail("scores around 1000 give NaN or inf: exp() overflowed",
              "subtract the row maximum before exp; softmax does not change when a "
              "constant is subtracted from a row.")
    check_close(w, torch.softmax(big, -1), name="weights for large scores")
    mask = torch.rand(2, 3, 5, generator=gen) > 0.4
    mask[:, :, 0] = True
    mask[1, 2] = False  # one row sees no key at all
    w = fn(scores, mask)
    check_shape(w, scores.shape, "masked weights")
    if torch.isnan(w[1, 2]).any():
        fail("a row whose keys are all masked gives NaN (pitfall P1)",
              "when a row has no visible key, its sum is 0: divide only where the sum "
              "is positive and leave the row at 0.")
    if (w[1, 2] != 0).any():
        fail(f"a row whose keys are all masked gives {w[1, 2].tolist()}, expected zeros "
              "(pitfall P6: filling with a large negative number makes it uniform)",
              "use -inf for masked entries (exp gives exactly 0) and guard the division.")
    if (w[~mask] != 0).any():
        fail("a masked key got a non-zero weight",
              "True in the mask means 'may attend': set scores to -inf where mask is False.")
    check_close(w, masked_softmax(scores, mask), name="masked weights")
    return passed("stable masked softmax: large scores, masks and empty rows are right")


@exercise_check
def check_masked_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 2, exercises "scaled, masked attention" and "find the bug":
    ``fn(q, k, v, mask=None)`` with q (B, T, d_k), k (B, S, d_k), v (B, S, d_v) and a
    bool mask broadcastable to (B, T, S) (True = may attend) must return
    ``(out, weights)`` as ``scaled_dot_product_attention`` does.

    Raises:
        CheckError: naming a missing 1/sqrt(d_k) (P12), a softmax over the wrong axis
            (P11), an inverted mask (P3), NaN for a query with no key (P1), batch items
            leaking into each other, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(4)
    for b, t, s, d, dv in ((1, 1, 2, 3, 2), (2, 3, 4, 8, 5), (3, 4, 4, 16, 3)):
        q, k, v = random_qkv(gen, (b,), t, s, d, dv)
        out, w = out_and_weights(fn(q, k, v))
        check_shape(w, (b, t, s), "weights")
        check_shape(out, (b, t, dv), "out")
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        sums = w.sum(-1)
        if not torch.allclose(sums, torch.ones(b, t), atol=1e-5):
            fail(f"weights of a query sum to {sums.flatten()[0].item():.3f} over the "
                  "keys, expected 1: the softmax ran over the batch or query axis "
                  "(pitfall P11)",
                  "softmax(scores, dim=-1): the keys are the last axis.")
        unscaled = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        if torch.allclose(w, unscaled, atol=1e-5) and not torch.allclose(
                unscaled, ref_w, atol=1e-5):
            fail("your weights are softmax(q k^T) without the 1/sqrt(d_k) scale "
                  "(pitfall P12)",
                  "divide the scores by math.sqrt(q.shape[-1]) before the softmax.")
        check_close(w, ref_w, name="weights")
        check_close(out, ref_out, name="out")
        if b > 1:
            perm = torch.randperm(b, generator=gen)
            out_p, _ = out_and_weights(fn(q[perm], k[perm], v[perm]))
            if not torch.allclose(out_p, out[perm], atol=1e-5):
                fail("permuting the batch does not permute the outputs: batch items "
                      "leak into each other (pitfall P11)",
                      "never normalise or transpose over dim 0.")
    q, k, v = random_qkv(gen, (2,), 3, 4, 8, 5)
    mask = torch.tensor([[True, True, False, False], [True, True, True, False],
                         [False, False, False, False]])  # (T, S): last query sees nothing
    out, w = out_and_weights(fn(q, k, v, mask))
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask)
    if not (torch.isfinite(out).all() and torch.isfinite(w).all()):
        fail("a query whose keys are all masked gives NaN (pitfall P1)",
              "that row's weights and output must be 0: guard the softmax's division.")
    if (w[:, :2][~mask[:2].expand(2, 2, 4)] != 0).any():
        if torch.allclose(w[:, 0, 2:].sum(-1), torch.ones(2), atol=1e-5):
            fail("the mask is inverted: your weights sit on the keys the mask hides "
                  "(pitfall P3)",
                  "here True means 'may attend'; PyTorch's nn.MultiheadAttention uses "
                  "the opposite convention.")
        fail("a masked key got a non-zero weight",
              "set the scores to -inf where the mask is False before the softmax.")
    check_close(w, ref_w, name="masked weights")
    check_close(out, ref_out, name="masked out")
    return passed("scaled, masked attention matches the library on 4 inputs")
