"""Self-checks for the exercises: run a learner's function on random inputs, compare
with the library's reference, and say what is wrong (which dimension, which axis, where
a NaN appears) with a hint. A check never shows the solution code.

Every check prints a line starting with "passed" on success and raises ``CheckError``
(an ``AssertionError``) with a message and a hint on failure, so it works in a notebook,
under pytest and under the otter-grader autograder alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from transformer_course.attention import masked_softmax, scaled_dot_product_attention

Tensor = torch.Tensor


class CheckError(AssertionError):
    """A self-check failed; the message says what is wrong and gives a hint."""


def _fail(message: str, hint: str | None = None) -> None:
    raise CheckError(message + (f"\nHint: {hint}" if hint else ""))


def _passed(what: str) -> bool:
    print(f"passed: {what}")
    return True


# ------------------------------------------------------------------ generic checks


def not_attempted_is_false(check: Callable[..., bool]) -> Callable[..., bool]:
    """Decorator for checks: when the learner's function still raises
    ``NotImplementedError`` (the stub), print "not attempted yet ..." and return False
    instead of raising, so a chapter with untouched stubs runs top to bottom."""

    def wrapped(fn, *args, **kwargs) -> bool:
        try:
            return check(fn, *args, **kwargs)
        except NotImplementedError:
            name = getattr(fn, "__name__", "your function")
            print(f"not attempted yet: {name} raises NotImplementedError; "
                  "write its body and run this cell again.")
            return False

    wrapped.__name__, wrapped.__doc__ = check.__name__, check.__doc__
    wrapped.__wrapped__ = check
    return wrapped



def check_shape(x, expected: Sequence[int | None], name: str = "x") -> bool:
    """Check that ``x`` is a tensor of shape ``expected`` (``None`` matches any size).

    Raises:
        CheckError: naming the first dimension that differs, e.g.
            "dimension 1 of weights is 5, expected 4".
    """
    if not isinstance(x, Tensor):
        _fail(f"{name} is a {type(x).__name__}, expected a torch.Tensor")
    shape, want = tuple(x.shape), tuple(expected)
    if len(shape) != len(want):
        _fail(
            f"{name} has {len(shape)} dimensions {shape}, expected {len(want)} {want}",
            "check for a missing or extra batch/head dimension (unsqueeze/squeeze).",
        )
    for dim, (got, exp) in enumerate(zip(shape, want)):
        if exp is not None and got != exp:
            _fail(
                f"dimension {dim} of {name} is {got}, expected {exp} "
                f"(shape {shape}, expected {want})",
                "print the shape after every step and compare with the comments.",
            )
    return True


def check_close(
    actual, expected: Tensor, *, atol: float = 1e-5, rtol: float = 1e-5, name: str = "x"
) -> bool:
    """Check that ``actual`` equals ``expected`` within ``atol + rtol * |expected|``.

    Raises:
        CheckError: for a wrong shape, NaN/inf (with the first position), or values
            out of tolerance (with the largest difference and where it is).
    """
    check_shape(actual, expected.shape, name)
    actual = actual.detach().to(expected.dtype)
    bad = ~torch.isfinite(actual)
    if bad.any():
        where = tuple(torch.nonzero(bad)[0].tolist())
        _fail(
            f"{name} has {int(bad.sum())} NaN/inf values, the first at index {where}",
            "a softmax over a row whose keys are all masked gives NaN; "
            "look for a division by zero or exp of a large number.",
        )
    diff = (actual - expected).abs()
    tol = atol + rtol * expected.abs()
    if (diff > tol).any():
        where = tuple(torch.nonzero(diff > tol)[0].tolist())
        _fail(
            f"{name} differs from the reference: max |difference| = "
            f"{diff.max().item():.3g}; first wrong entry at index {where}: "
            f"got {actual[where].item():.5g}, expected {expected[where].item():.5g}"
        )
    return True


# ------------------------------------------------------- chapter 1: queries, keys, values


def _random_qkv(gen: torch.Generator, lead: tuple[int, ...], t: int, s: int, d: int, dv: int):
    q = torch.randn(*lead, t, d, generator=gen)
    k = torch.randn(*lead, s, d, generator=gen)
    v = torch.randn(*lead, s, dv, generator=gen)
    return q, k, v


@not_attempted_is_false
def check_soft_lookup(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> bool:
    """Chapter 1, exercise "soft lookup": ``fn(query, keys, values)`` with query (d,),
    keys (S, d), values (S, d_v) must return the (d_v,) weighted sum of the values with
    weights softmax(keys @ query / sqrt(d)).

    Raises:
        CheckError: with a hint that names the mistake (hard lookup, missing scale,
            wrong shape).
    """
    gen = torch.Generator().manual_seed(1)
    for s, d, dv in ((5, 4, 3), (1, 8, 2), (7, 16, 5)):
        q = torch.randn(d, generator=gen)
        keys = torch.randn(s, d, generator=gen)
        values = torch.randn(s, dv, generator=gen)
        out = fn(q, keys, values)
        check_shape(out, (dv,), "output")
        scores = keys @ q
        ref = torch.softmax(scores / math.sqrt(d), dim=0) @ values
        if torch.allclose(out, ref, atol=1e-5):
            continue
        if torch.allclose(out, values[scores.argmax()], atol=1e-5):
            _fail(
                "your output is the value of the best-matching key only: a hard lookup",
                "a soft lookup mixes every value, weighted by the softmax of the scores.",
            )
        if torch.allclose(out, torch.softmax(scores, 0) @ values, atol=1e-5):
            _fail(
                "your output matches softmax(keys @ query) @ values without scaling",
                "divide the scores by sqrt(d), the size of the query vector.",
            )
        check_close(out, ref, atol=1e-5, name="output")
    return _passed("soft lookup matches the reference on 3 random inputs")


@not_attempted_is_false
def check_dot_product_attention(
    fn: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
) -> bool:
    """Chapter 1, exercise "batched attention": ``fn(q, k, v)`` with q (B, T, d),
    k (B, S, d), v (B, S, d_v) must return ``(out, weights)``: out (B, T, d_v) and
    weights (B, T, S) = softmax(q k^T / sqrt(d)) over the keys.

    Raises:
        CheckError: naming a wrong shape, a softmax over the wrong axis, a missing scale,
            batch items that leak into each other, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(2)
    for b, t, s, d, dv in ((2, 3, 4, 8, 5), (1, 1, 6, 4, 2), (3, 5, 2, 16, 3)):
        q, k, v = _random_qkv(gen, (b,), t, s, d, dv)
        result = fn(q, k, v)
        if not (isinstance(result, tuple) and len(result) == 2):
            _fail(
                f"expected fn to return a tuple (out, weights), got {type(result).__name__}",
                "return both the output and the attention weights.",
            )
        out, weights = result
        check_shape(weights, (b, t, s), "weights")
        check_shape(out, (b, t, dv), "out")
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        if not torch.allclose(weights.sum(-1), torch.ones(b, t), atol=1e-5):
            if t > 1 and torch.allclose(weights.sum(-2), torch.ones(b, s), atol=1e-5):
                _fail(
                    "each column of weights sums to 1: the softmax ran over the query "
                    "axis (dim=-2)",
                    "normalise over the keys: softmax(..., dim=-1).",
                )
            _fail(
                "the weights of a query do not sum to 1 over the keys",
                "apply softmax over the last dimension (the keys).",
            )
        raw = masked_softmax(q @ k.transpose(-2, -1))
        if torch.allclose(weights, raw, atol=1e-5) and d > 1:
            _fail(
                "your weights are softmax(q k^T) without the 1/sqrt(d) scale",
                "divide the scores by sqrt(d_k) before the softmax.",
            )
        check_close(weights, ref_w, atol=1e-5, name="weights")
        check_close(out, ref_out, atol=1e-5, name="out")
        if b > 1:
            perm = torch.randperm(b, generator=gen)
            out_p, _ = fn(q[perm], k[perm], v[perm])
            if not torch.allclose(out_p, out[perm], atol=1e-5):
                _fail(
                    "permuting the batch does not permute the outputs: items leak into "
                    "each other",
                    "use batched matmul (q @ k.transpose(-2, -1)), not a reshape that "
                    "mixes the batch.",
                )
    return _passed("batched dot-product attention matches the reference on 3 random inputs")


# ------------------------------------- chapters 2 and 3: scaled dot-product, multi-head




@not_attempted_is_false
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
        _fail("the weights of a row do not sum to 1 over the last axis (the keys)",
              "normalise over dim=-1: exp(s) / exp(s).sum(dim=-1, keepdim=True).")
    check_close(w, torch.softmax(scores, -1), name="weights")
    big = scores * 10 + 1000.0  # exp(1000) overflows float32
    w = fn(big)
    if not torch.isfinite(w).all():
        _fail("scores around 1000 give NaN or inf: exp() overflowed",
              "subtract the row maximum before exp; softmax does not change when a "
              "constant is subtracted from a row.")
    check_close(w, torch.softmax(big, -1), name="weights for large scores")
    mask = torch.rand(2, 3, 5, generator=gen) > 0.4
    mask[:, :, 0] = True
    mask[1, 2] = False  # one row sees no key at all
    w = fn(scores, mask)
    check_shape(w, scores.shape, "masked weights")
    if torch.isnan(w[1, 2]).any():
        _fail("a row whose keys are all masked gives NaN (pitfall P1)",
              "when a row has no visible key, its sum is 0: divide only where the sum "
              "is positive and leave the row at 0.")
    if (w[1, 2] != 0).any():
        _fail(f"a row whose keys are all masked gives {w[1, 2].tolist()}, expected zeros "
              "(pitfall P6: filling with a large negative number makes it uniform)",
              "use -inf for masked entries (exp gives exactly 0) and guard the division.")
    if (w[~mask] != 0).any():
        _fail("a masked key got a non-zero weight",
              "True in the mask means 'may attend': set scores to -inf where mask is False.")
    check_close(w, masked_softmax(scores, mask), name="masked weights")
    return _passed("stable masked softmax: large scores, masks and empty rows are right")


@not_attempted_is_false
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
        q, k, v = _random_qkv(gen, (b,), t, s, d, dv)
        out, w = fn(q, k, v)
        check_shape(w, (b, t, s), "weights")
        check_shape(out, (b, t, dv), "out")
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        sums = w.sum(-1)
        if not torch.allclose(sums, torch.ones(b, t), atol=1e-5):
            _fail(f"weights of a query sum to {sums.flatten()[0].item():.3f} over the "
                  "keys, expected 1: the softmax ran over the batch or query axis "
                  "(pitfall P11)",
                  "softmax(scores, dim=-1): the keys are the last axis.")
        unscaled = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        if torch.allclose(w, unscaled, atol=1e-5) and not torch.allclose(
                unscaled, ref_w, atol=1e-5):
            _fail("your weights are softmax(q k^T) without the 1/sqrt(d_k) scale "
                  "(pitfall P12)",
                  "divide the scores by math.sqrt(q.shape[-1]) before the softmax.")
        check_close(w, ref_w, name="weights")
        check_close(out, ref_out, name="out")
        if b > 1:
            perm = torch.randperm(b, generator=gen)
            out_p, _ = fn(q[perm], k[perm], v[perm])
            if not torch.allclose(out_p, out[perm], atol=1e-5):
                _fail("permuting the batch does not permute the outputs: batch items "
                      "leak into each other (pitfall P11)",
                      "never normalise or transpose over dim 0.")
    q, k, v = _random_qkv(gen, (2,), 3, 4, 8, 5)
    mask = torch.tensor([[True, True, False, False], [True, True, True, False],
                         [False, False, False, False]])  # (T, S): last query sees nothing
    out, w = fn(q, k, v, mask)
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask)
    if not (torch.isfinite(out).all() and torch.isfinite(w).all()):
        _fail("a query whose keys are all masked gives NaN (pitfall P1)",
              "that row's weights and output must be 0: guard the softmax's division.")
    if (w[:, :2][~mask[:2].expand(2, 2, 4)] != 0).any():
        if torch.allclose(w[:, 0, 2:].sum(-1), torch.ones(2), atol=1e-5):
            _fail("the mask is inverted: your weights sit on the keys the mask hides "
                  "(pitfall P3)",
                  "here True means 'may attend'; PyTorch's nn.MultiheadAttention uses "
                  "the opposite convention.")
        _fail("a masked key got a non-zero weight",
              "set the scores to -inf where the mask is False before the softmax.")
    check_close(w, ref_w, name="masked weights")
    check_close(out, ref_out, name="masked out")
    return _passed("scaled, masked attention matches the library on 4 inputs")


def _split_reference(x: Tensor, n_heads: int) -> Tensor:
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, d_k)


@not_attempted_is_false
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
            _fail("head 0 holds features of several tokens: x was viewed as "
                  "(B, H, T, d_k) directly (pitfall P8)",
                  "view as (B, T, H, d_k) first, then transpose(1, 2).")
        check_close(heads, _split_reference(x, h), name="heads")
    return _passed("heads split per token on 3 inputs")


@not_attempted_is_false
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
            _fail("token 0 of the result holds head 0's tokens 0, 1, ...: (B, H, T, d_k) "
                  "was reshaped straight to (B, T, H*d_k) (pitfall P9)",
                  "bring the token axis next to the batch first: transpose(1, 2), "
                  "then reshape (or .contiguous().view, pitfall P10).")
        ref = heads.transpose(1, 2).reshape(b, t, h * d)
        check_close(merged, ref, name="merged")
    return _passed("heads merged per token on 3 inputs")


@not_attempted_is_false
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
            _fail("weights have shape (B, T, S): they were averaged over the heads "
                  "(pitfall P13)",
                  "return the per-head weights, (B, H, T, S).")
        check_shape(weights, (b, h, t, s), "weights")
        check_close(weights, ref_w, atol=1e-5, name="weights")
        check_close(out, ref_out, atol=1e-5, name="out")
    return _passed("multi-head attention matches the library's MultiHeadAttention")


# --------------------------------------------- chapter 4: positional encoding (exercises)


@not_attempted_is_false
def check_sinusoidal_encoding(fn: Callable[[int, int], Tensor]) -> bool:
    """Chapter 4, exercise "sinusoidal table": ``fn(max_len, d_model)`` must return the
    (max_len, d_model) table with column 2i = sin(pos w_i), column 2i+1 = cos(pos w_i),
    w_i = 10000^(-2i / d_model), for even *and odd* d_model (pitfall P15).

    Raises:
        CheckError: naming a crash on odd d_model, sines and cosines swapped or in two
            halves, a wrong exponent, or the first wrong value.
    """
    from transformer_course.positional import sinusoidal_encoding

    for max_len, d in ((10, 4), (50, 16), (10, 5), (7, 1)):
        try:
            out = fn(max_len, d)
        except NotImplementedError:
            raise  # the stub: "not attempted yet"
        except (RuntimeError, IndexError, ValueError) as err:
            _fail(f"fn({max_len}, {d}) raised {type(err).__name__}: {err}",
                  "with an odd d_model there is one more sine column than cosine columns "
                  "(pitfall P15): fill pe[:, 0::2] and pe[:, 1::2] with angles sliced "
                  "to their own widths.")
        check_shape(out, (max_len, d), f"fn({max_len}, {d})")
        out = out.detach().double()
        ref = sinusoidal_encoding(max_len, d, dtype=torch.float64)
        if torch.allclose(out, ref, atol=1e-5):
            continue
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        if d % 2 == 0:
            ang = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            if torch.allclose(out, torch.cat((ang.sin(), ang.cos()), -1), atol=1e-5):
                _fail("your sines fill the first half of the columns and the cosines "
                      "the second half",
                      "the paper interleaves them: column 2i is a sine, column 2i+1 "
                      "the cosine of the same angle.")
            if torch.allclose(out[:, 0::2], ref[:, 1::2], atol=1e-5):
                _fail("columns 0, 2, 4, ... hold cosines: sines and cosines are swapped",
                      "PE[pos, 2i] = sin(pos w_i); row 0 starts 0, 1, 0, 1, ...")
            cols = torch.arange(0, d, 2, dtype=torch.float64)
            wrong = pos * 10000.0 ** (-(cols / 2) / d)
            if torch.allclose(out[:, 0::2], wrong.sin(), atol=1e-5):
                _fail("the frequencies use i / d_model, not 2i / d_model",
                      "w_i = 10000 ** (-2 * i / d_model) for pair i; the exponent of "
                      "column 2i is that column index over d_model.")
        check_close(out, ref, atol=1e-5, name=f"fn({max_len}, {d})")
    return _passed("sinusoidal table right for d_model = 4, 16, 5 (odd) and 1")


@not_attempted_is_false
def check_rotary_half(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """Chapter 4, exercise "rotary, half layout": ``fn(x, positions)`` with x
    (..., T, d), d even, and integer positions (T,) must rotate the pair
    (x_i, x_{i + d/2}) by positions * 10000^(-2i / d).

    Raises:
        CheckError: naming the interleaved pairing, a reversed rotation, a changed norm,
            or the first wrong value.
    """
    from transformer_course.positional import apply_rotary

    gen = torch.Generator().manual_seed(40)
    for shape, offset in (((5, 4), 0), ((2, 3, 6, 8), 0), ((1, 2, 3, 16), 7)):
        x = torch.randn(*shape, generator=gen)
        positions = torch.arange(offset, offset + shape[-2])
        out = fn(x, positions)
        check_shape(out, shape, "output")
        ref = apply_rotary(x, positions, layout="half")
        if torch.allclose(out, ref, atol=1e-5):
            continue
        if torch.allclose(out, apply_rotary(x, positions, layout="interleaved"), atol=1e-5):
            _fail("you rotated neighbouring pairs (x0, x1), (x2, x3): the interleaved "
                  "layout",
                  "this exercise pairs x_i with x_{i + d/2}: split x into two halves.")
        if torch.allclose(out, apply_rotary(x, -positions, layout="half"), atol=1e-5):
            _fail("the rotation runs backwards (by -pos * theta_i)",
                  "first half: x1 * cos - x2 * sin; second half: x1 * sin + x2 * cos.")
        if not torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-4):
            _fail("the norm of a vector changed: this is not a rotation",
                  "each pair must use the cos and sin of one and the same angle.")
        check_close(out, ref, atol=1e-5, name="output")
    return _passed("rotary (half layout) matches the library, offsets included")


@not_attempted_is_false
def check_new_token_positions(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 4, exercise "find the bug: positions under a KV cache": ``fn(keep,
    n_new)`` with keep a bool (B, S) padding mask over every token so far (cache plus
    the n_new newest, True = real token, left padding allowed) must return the (B,
    n_new) absolute positions of the newest tokens, counting real tokens only.

    Raises:
        CheckError: naming positions restarted at 0 for the new chunk (pitfall P16),
            padding counted as positions, or the first wrong value.
    """
    from transformer_course.positional import position_ids

    keep_full = torch.ones(1, 7, dtype=torch.bool)
    keep_left = torch.tensor([[False, False, True, True, True, True],
                              [True, True, True, True, True, True]])
    for keep, n_new in ((keep_full, 3), (keep_full, 1), (keep_left, 2)):
        out = fn(keep, n_new)
        check_shape(out, (keep.shape[0], n_new), "positions")
        ref = position_ids(n_new, offset=keep.shape[1] - n_new, keep=keep)
        if torch.equal(out.long(), ref):
            continue
        if torch.equal(out.long(), torch.arange(n_new).expand_as(ref)):
            _fail(f"the {n_new} new token(s) got positions {out[0].tolist()}: they were "
                  "numbered from 0 within the new chunk, as if the cache were empty "
                  f"(pitfall P16); expected {ref[0].tolist()}",
                  "a new token's position is the number of tokens before it.")
        naive = torch.arange(keep.shape[1] - n_new, keep.shape[1]).expand_as(ref)
        if torch.equal(out.long(), naive):
            _fail(f"row 0 got positions {out[0].tolist()}, expected {ref[0].tolist()}: "
                  "the left padding was counted",
                  "count real tokens only: keep.cumsum(-1) - 1, then the last n_new "
                  "columns.")
        _fail(f"positions {out.tolist()}, expected {ref.tolist()} "
              f"(keep = {keep.int().tolist()}, n_new = {n_new})")
    return _passed("new tokens get their absolute positions, with and without padding")


# ------------------------------------ chapter 5: properties of any attention function


def _first_output(result) -> Tensor:
    return result[0] if isinstance(result, tuple) else result


def _qkv4(gen: torch.Generator, b: int, h: int, t: int, s: int, d: int):
    return tuple(torch.randn(b, h, n, d, generator=gen) for n in (t, s, s))


@not_attempted_is_false
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
    base = _first_output(fn(q, k, v, mask))
    for cut in range(t - 1):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[..., cut + 1:, :] = torch.randn(x[..., cut + 1:, :].shape, generator=gen)
        out = _first_output(fn(q2, k2, v2, mask))
        diff = (out[..., : cut + 1, :] - base[..., : cut + 1, :]).abs().amax(dim=(0, 1, 3))
        if not torch.isfinite(diff).all() or (diff > 1e-5).any():
            pos = int(torch.nonzero(~(diff <= 1e-5))[0])
            _fail(f"{name}: the output at position {pos} changed by "
                  f"{diff[pos].item():.3g} when only positions {cut + 1}..{t - 1} "
                  f"changed: the future leaked into position {pos}",
                  "hide the masked keys before the softmax (scores = -inf where the "
                  "mask is False); True means 'may attend'.")
    return _passed(f"{name}: no causal leakage (outputs at or before t ignore tokens "
                   "after t)")


@not_attempted_is_false
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
    base = _first_output(fn(q, k, v, real_only))
    for n_pad in (1, 3):
        extra = [torch.randn(b, h, n_pad, d, generator=gen) * 5 for _ in range(3)]
        qp, kp, vp = (torch.cat((x, e), dim=-2) for x, e in zip((q, k, v), extra))
        mask = torch.ones(b, 1, 1, n + n_pad, dtype=torch.bool)
        mask[..., n:] = False  # the appended keys are padding
        out = _first_output(fn(qp, kp, vp, mask))
        if not torch.isfinite(out).all():
            _fail(f"{name}: NaN/inf in the output after appending {n_pad} padding "
                  "key(s)",
                  "no real query has all keys masked here; look for -inf - -inf or a "
                  "division by zero.")
        diff = (out[..., :n, :] - base).abs().amax(dim=(0, 1, 3))
        if (diff > 1e-5).any():
            pos = int(torch.nonzero(diff > 1e-5)[0])
            _fail(f"{name}: the output at real position {pos} changed by "
                  f"{diff[pos].item():.3g} when {n_pad} masked padding key(s) were "
                  "appended: padding leaked into real positions",
                  "a (B, 1, 1, S) mask hides key columns; apply it to the scores "
                  "before the softmax.")
    return _passed(f"{name}: padding invariance (appended padding changes nothing)")


@not_attempted_is_false
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
    out = _first_output(fn(q, k, v, mask))[0, 0]  # (T, 3): row i = weights of query i
    want = v[0, 0, allowed]
    if torch.allclose(out, want, atol=1e-5):
        return _passed(f"{name}: mask polarity (True = may attend)")
    if torch.allclose(out, (1 - want) / (t - 1), atol=1e-5):
        _fail(f"{name}: query 0 may attend only key 2, yet its output is "
              f"{[round(x, 3) for x in out[0].tolist()]}: it attended to every key "
              "except the allowed one. The mask polarity is inverted",
              "here True = may attend; nn.MultiheadAttention uses True = blocked "
              "(pitfall P3). Fill the scores where ~mask.")
    if torch.allclose(out, torch.full_like(out, 1 / t), atol=1e-5):
        _fail(f"{name}: the mask had no effect: query 0 mixed all keys equally",
              "apply the mask to the scores before the softmax.")
    _fail(f"{name}: query 0 may attend only key 2 and should output {want[0].tolist()}, "
          f"got {[round(x, 3) for x in out[0].tolist()]}")


@not_attempted_is_false
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
    out = _first_output(fn(q, k, v, mask))
    if not torch.isfinite(out).all():
        _fail(f"{name}: a query whose keys are all masked gives NaN (pitfall P1)",
              "softmax over only -inf is 0/0; make that row's weights exactly 0.")
    if out[1].abs().max() > 1e-6:
        _fail(f"{name}: the item whose keys are all masked has output "
              f"[{', '.join(f'{x:.3f}' for x in out[1, 0, 0].tolist())}] (row 0), "
              "expected 0: "
              "filling masked scores with a large finite number makes the row uniform "
              "(pitfall P6)",
              "use -inf and set rows with no visible key to 0 after the softmax.")
    out[0].sum().backward()
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if x.grad is not None and not torch.isfinite(x.grad).all():
            _fail(f"{name}: the gradient of {arg} has NaN although the loss uses only "
                  "the unmasked item (pitfall P1: the NaN spreads through the batch)",
                  "avoid exp(-inf - -inf); guard the division by the row sum.")
    alone = _first_output(fn(q[:1].detach(), k[:1].detach(), v[:1].detach(), mask[:1]))
    check_close(out[:1].detach(), alone.detach(), name="output of the unmasked item")
    return _passed(f"{name}: fully masked rows give zeros, no NaN (output and gradients)")


@not_attempted_is_false
def check_attention_properties(fn: Callable[..., Tensor], *, name: str = "fn") -> bool:
    """Run the four property checks on ``fn(q, k, v, mask)``: causal leakage, padding
    invariance, mask polarity, fully masked rows (chapter 5, "find the bug").

    Raises:
        CheckError: from the first property that fails.
    """
    for check in (check_causal_leakage, check_padding_invariance, check_mask_polarity,
                  check_fully_masked_rows):
        check.__wrapped__(fn, name=name)
    return _passed(f"{name}: all four mask properties hold")


# ------------------------------------------------------ chapter 5: masks (exercises)


@not_attempted_is_false
def check_causal_mask(fn: Callable[[int, int], Tensor]) -> bool:
    """Chapter 5, exercise "causal mask for a KV cache": ``fn(q_len, k_len)`` must return
    a bool (T, S) mask, True = may attend, with query i seeing keys j <= i + S - T
    (queries aligned to the last keys, bottom-right).

    Raises:
        CheckError: naming a non-bool mask, inverted polarity, a masked diagonal, or
            top-left alignment.
    """
    from transformer_course.masks import causal_mask

    for t, s in ((4, 4), (2, 5), (1, 6), (3, 3)):
        out = fn(t, s)
        check_shape(out, (t, s), f"fn({t}, {s})")
        if out.dtype != torch.bool:
            _fail(f"fn({t}, {s}) has dtype {out.dtype}, expected torch.bool",
                  "build it with a comparison such as j <= i + (k_len - q_len).")
        ref = causal_mask(t, s)
        if torch.equal(out, ref):
            continue
        if torch.equal(out, ~ref):
            _fail(f"fn({t}, {s}) is inverted: True marks the future",
                  "True = may attend; key j is visible when it is not in the future.")
        if torch.equal(out, torch.tril(torch.ones(t, s, dtype=torch.bool), s - t - 1)):
            _fail(f"fn({t}, {s}) hides the diagonal: a token may attend to itself",
                  "use <=, not <.")
        if torch.equal(out, torch.tril(torch.ones(t, s, dtype=torch.bool))):
            _fail(f"fn({t}, {s}) is aligned top-left: query 0 sees only key 0. With "
                  f"{s} keys and {t} queries (decoding with a cache) the queries are the "
                  f"last {t} tokens",
                  "query i sits at position i + k_len - q_len.")
        check_close(out.int(), ref.int(), name=f"fn({t}, {s})")
    return _passed("causal masks right, square and bottom-right aligned")


@not_attempted_is_false
def check_padding_mask(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 5, exercise "find the bug: padding mask": ``fn(tokens, pad_id)`` with
    integer tokens (B, S) must return a bool (B, 1, 1, S) mask, True = real key.

    Raises:
        CheckError: naming a mask on the query axis (B, 1, S, 1) (pitfall P5), inverted
            polarity, or a missing singleton axis.
    """
    from transformer_course.masks import padding_mask

    for tokens, pad in ((torch.tensor([[5, 7, 0, 0]]), 0),
                        (torch.tensor([[3, 1, 2], [4, 9, 9]]), 9)):
        b, s = tokens.shape
        out = fn(tokens, pad)
        if isinstance(out, Tensor) and tuple(out.shape) == (b, 1, s, 1):
            _fail(f"the mask has shape (B, 1, S, 1) = {tuple(out.shape)}: it hides padded "
                  "queries (rows), not padded keys (columns), so real tokens still "
                  "attend to padding (pitfall P5)",
                  "index the singleton axes as [:, None, None, :] -> (B, 1, 1, S).")
        check_shape(out, (b, 1, 1, s), "mask")
        if out.dtype != torch.bool:
            _fail(f"the mask has dtype {out.dtype}, expected torch.bool")
        ref = padding_mask(tokens, pad)
        if torch.equal(out, ~ref):
            _fail("the mask is inverted: True marks the padding",
                  "True = may attend, so True for real tokens: tokens != pad_id.")
        check_close(out.int(), ref.int(), name="mask")
    return _passed("padding mask (B, 1, 1, S) hides padded keys")


# ------------------------------------------------- chapter 7: making attention fast


def _softmax_no_rescale(x: Tensor, block: int) -> Tensor:
    """The classic online-softmax bug: the running sum is not rescaled when the
    running maximum grows."""
    m, l = float("-inf"), 0.0
    for j in range(0, len(x), block):
        m = max(m, x[j : j + block].max().item())
        l = l + torch.exp(x[j : j + block] - m).sum().item()
    return torch.exp(x - m) / l


@not_attempted_is_false
def check_online_softmax(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 7, exercise "online softmax": ``fn(scores, block)`` reads one row of
    scores (S,) ``block`` entries at a time, keeping a running maximum and a running
    sum, and returns softmax(scores) (S,). Entries equal to -inf (masked keys) get
    weight 0; a row that is all -inf gives zeros; scores around 1000 must not overflow.

    Raises:
        CheckError: naming a missing rescale of the running sum, overflow, NaN from a
            block that is all -inf, or the first wrong value.
    """
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(10, generator=gen) * 3
    for block in (1, 3, 10, 16):
        w = fn(x.clone(), block)
        check_shape(w, (10,), "weights")
        ref = torch.softmax(x, 0)
        buggy = _softmax_no_rescale(x, block)
        if not torch.allclose(w, ref, atol=1e-5) and torch.allclose(w, buggy, atol=1e-5):
            _fail(
                f"with block={block} your weights do not sum to 1: the running sum "
                "was not rescaled when the running maximum grew",
                "when a block raises the maximum from m to m_new, multiply the sum so "
                "far by exp(m - m_new) before adding the new block's exp(x - m_new).",
            )
        check_close(w, ref, name=f"weights (block={block})")
    big = x * 10 + 1000.0
    w = fn(big, 4)
    if not torch.isfinite(w).all():
        _fail("scores around 1000 give NaN or inf: exp() overflowed",
              "exponentiate x - m (m the running maximum), never x itself.")
    check_close(w, torch.softmax(big, 0), name="weights for large scores")
    inf = float("-inf")
    masked = torch.tensor([inf, inf, 1.0, inf, 2.0, 0.5])
    w = fn(masked, 2)
    if torch.isnan(w).any():
        _fail("a first block whose scores are all -inf gives NaN",
              "while the maximum is still -inf, exp(-inf - (-inf)) is NaN: skip such "
              "a block (nothing is visible yet) or treat m = -inf as 0.")
    check_close(w, torch.softmax(masked, 0), name="weights with -inf entries")
    w = fn(torch.full((4,), inf), 2)
    if torch.isnan(w).any() or (w != 0).any():
        _fail(f"a row that is all -inf gives {w.tolist()}, expected zeros",
              "if the running sum is 0 at the end, return zeros (no key is visible).")
    return _passed("online softmax matches torch.softmax for every block size, "
                   "large scores and masked entries")


def _stream_no_output_rescale(q, k, v, block):
    m, l, acc = float("-inf"), 0.0, torch.zeros(v.shape[-1])
    s = k @ q / math.sqrt(q.shape[-1])
    for j in range(0, len(s), block):
        m_new = max(m, s[j : j + block].max().item())
        p = torch.exp(s[j : j + block] - m_new)
        l = l * math.exp(m - m_new) + p.sum().item()
        acc = acc + p @ v[j : j + block]  # bug: acc not rescaled
        m = m_new
    return acc / l


@not_attempted_is_false
def check_streaming_attention(fn: Callable[..., Tensor]) -> bool:
    """Chapter 7, exercise "find the bug" (one query, FlashAttention-style):
    ``fn(q, k, v, block)`` with q (d,), k (S, d), v (S, d_v) must return
    softmax(k q / sqrt(d)) v, (d_v,), reading k and v ``block`` rows at a time.

    Raises:
        CheckError: naming an unrescaled output accumulator, a wrong shape, or the
            first wrong value.
    """
    gen = torch.Generator().manual_seed(8)
    for s, d, dv, block in ((12, 8, 5, 4), (7, 4, 3, 3), (5, 16, 2, 8)):
        q = torch.randn(d, generator=gen) * 2
        k = torch.randn(s, d, generator=gen) * 2
        v = torch.randn(s, dv, generator=gen)
        out = fn(q, k, v, block)
        check_shape(out, (dv,), "output")
        ref = torch.softmax(k @ q / math.sqrt(d), 0) @ v
        buggy = _stream_no_output_rescale(q, k, v, block)
        if not torch.allclose(out, ref, atol=1e-5) and torch.allclose(
            out, buggy, atol=1e-5
        ):
            _fail("the partial output is not rescaled when the running maximum grows",
                  "acc holds sum exp(s_j - m) v_j for the OLD m: multiply it by "
                  "exp(m - m_new), exactly like the running sum l.")
        check_close(out, ref, atol=1e-5, name="output")
    return _passed("streaming attention equals softmax(k q / sqrt(d)) v for 3 inputs")


@not_attempted_is_false
def check_repeat_kv(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 7, exercise "repeat_kv": ``fn(x, n_rep)`` with x (B, H_kv, S, d) must
    return (B, H_kv * n_rep, S, d) where head h is x's head h // n_rep (each key/value
    head serves n_rep consecutive query heads).

    Raises:
        CheckError: naming a wrong shape, or heads tiled in the wrong order.
    """
    gen = torch.Generator().manual_seed(9)
    for shape, n_rep in (((2, 3, 5, 4), 2), ((1, 2, 3, 8), 4), ((2, 4, 1, 2), 1)):
        x = torch.randn(*shape, generator=gen)
        out = fn(x, n_rep)
        b, h_kv, s, d = shape
        check_shape(out, (b, h_kv * n_rep, s, d), "output")
        if n_rep > 1 and torch.equal(out, x.repeat(1, n_rep, 1, 1)):
            _fail("the whole stack of heads is tiled (head h gets head h % H_kv)",
                  "query heads 0..n_rep-1 share key/value head 0: repeat each head "
                  "n_rep times in a row (x[:, :, None].expand(...) or "
                  "repeat_interleave on dim 1).")
        check_close(out, x.repeat_interleave(n_rep, dim=1), atol=0, rtol=0,
                    name="output")
    return _passed("repeat_kv gives head h the key/value head h // n_rep")


@not_attempted_is_false
def check_quantize_int8(fn: Callable[[Tensor], tuple[Tensor, Tensor]]) -> bool:
    """Chapter 7, exercise "int8 by hand": ``fn(weight)`` with weight (d_out, d_in)
    must return ``(w_int8, scale)``: int8 (d_out, d_in) and scale (d_out, 1), one
    scale per output row = max |row| / 127, values rounded to nearest, so that
    ``w_int8 * scale`` is within scale / 2 of ``weight``.

    Raises:
        CheckError: naming a wrong dtype or shape, one scale for the whole matrix,
            truncation instead of rounding, or an error larger than scale / 2.
    """
    gen = torch.Generator().manual_seed(10)
    w = torch.randn(6, 32, generator=gen) * torch.logspace(-2, 1, 6)[:, None]
    result = fn(w.clone())
    if not (isinstance(result, tuple) and len(result) == 2):
        _fail("expected fn to return a tuple (w_int8, scale)",
              "return both the int8 weights and the per-row scales.")
    w_int8, scale = result
    check_shape(w_int8, (6, 32), "w_int8")
    if w_int8.dtype != torch.int8:
        _fail(f"w_int8 has dtype {w_int8.dtype}, expected torch.int8",
              "convert at the end with .to(torch.int8).")
    if tuple(scale.shape) not in ((6, 1), (6,)):
        _fail(f"scale has shape {tuple(scale.shape)}, expected (6, 1): one per row",
              "take the maximum over dim=1 with keepdim=True.")
    scale = scale.reshape(6, 1).float()
    if torch.allclose(scale, scale[0].expand_as(scale)):
        _fail("every row has the same scale: that is per-tensor quantization",
              "small rows then round to 0; compute max |w| per output row (dim=1).")
    recon = w_int8.float() * scale
    err = (recon - w).abs()
    if (err > scale / 2 + 1e-6).any():
        if (err < scale + 1e-6).all():
            _fail("errors reach a whole step (scale): the values were truncated",
                  ".to(torch.int8) rounds toward zero; call torch.round first.")
        _fail(f"max |w_int8 * scale - w| = {err.max():.3g} exceeds scale / 2",
              "scale = max |row| / 127 and w_int8 = round(w / scale).")
    check_close(scale, w.abs().amax(dim=1, keepdim=True) / 127, rtol=1e-4,
                name="scale")
    return _passed("per-channel int8: one scale per row, error within half a step")


# --------------------------------------------------- chapter 6: the full Transformer


@not_attempted_is_false
def check_noam_lr(fn: Callable[[int, int, int], float]) -> bool:
    """Chapter 6, exercise "warmup schedule": ``fn(step, d_model, warmup)`` must return
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) for step >= 1 (Vaswani et al.
    2017, equation 3).

    Raises:
        CheckError: naming the first (step, d_model, warmup) that is wrong, with a hint
            for a peak at the wrong step, a missing d_model factor or a swapped min/max.
    """
    from transformer_course.training import noam_lr

    for d_model, warmup in ((512, 4000), (128, 400), (64, 10)):
        for step in (1, warmup // 2, warmup, 2 * warmup, 10 * warmup):
            got, want = float(fn(step, d_model, warmup)), noam_lr(step, d_model, warmup)
            if math.isclose(got, want, rel_tol=1e-6):
                continue
            if math.isclose(got, want * math.sqrt(d_model), rel_tol=1e-6):
                _fail(f"fn({step}, {d_model}, {warmup}) = {got:.3g}, expected "
                      f"{want:.3g}: off by a factor sqrt(d_model)",
                      "multiply by d_model ** -0.5.")
            if step != warmup and math.isclose(
                got, d_model**-0.5 * max(step**-0.5, step * warmup**-1.5), rel_tol=1e-6
            ):
                _fail(f"fn({step}, {d_model}, {warmup}) = {got:.3g}, expected "
                      f"{want:.3g}: max instead of min",
                      "the rate is the smaller of the rising and the decaying branch.")
            _fail(f"fn({step}, {d_model}, {warmup}) = {got:.6g}, expected {want:.6g}",
                  "rising branch step * warmup ** -1.5, decaying branch step ** -0.5; "
                  "they meet at step = warmup.")
    return _passed("the warmup schedule matches equation (3) at 15 points")


@not_attempted_is_false
def check_label_smoothed_loss(fn: Callable[..., Tensor]) -> bool:
    """Chapter 6, exercise "label smoothing by hand": ``fn(logits, target, eps,
    pad_id)`` with logits (N, V) and target (N,) must return the mean over non-padding
    positions of -sum_v q_v log p_v, with q = (1 - eps) one_hot(target) + eps / V, the
    value of ``nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_id)``.

    Raises:
        CheckError: with a hint for padding counted in the loss or the average,
            smoothing spread over V - 1 tokens, or no smoothing at all.
    """
    gen = torch.Generator().manual_seed(6)
    for n, v, eps in ((8, 5, 0.1), (12, 7, 0.2), (5, 3, 0.0)):
        logits = torch.randn(n, v, generator=gen) * 2
        target = torch.randint(1, v, (n,), generator=gen)
        target[-2:] = 0  # two padding positions (pad_id 0)
        got = fn(logits.clone(), target.clone(), eps, 0)
        if not isinstance(got, Tensor) or got.numel() != 1:
            _fail("expected a scalar tensor (the mean loss)",
                  "average over the non-padding positions with .sum() / count.")
        got = got.reshape(())
        want = torch.nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=0)(
            logits, target)
        if torch.allclose(got, want, atol=1e-5):
            continue
        logp = logits.log_softmax(-1)
        keep = target != 0
        nll = -logp.gather(1, target[:, None])[:, 0]
        per_pos = (1 - eps) * nll - eps / v * logp.sum(-1)
        if torch.allclose(got, per_pos.mean(), atol=1e-5):
            _fail("padding positions are counted in the loss",
                  "drop the positions whose target is pad_id before averaging.")
        if torch.allclose(got, per_pos.sum() / keep.sum(), atol=1e-5):
            _fail("the padded positions' losses are added to the sum",
                  "multiply each position's loss by (target != pad_id) before summing.")
        if torch.allclose(got, nll[keep].mean(), atol=1e-5) and eps > 0:
            _fail("your loss is plain cross-entropy: no smoothing",
                  "mix (1 - eps) * the one-hot target with eps / V on every token.")
        off = (1 - eps) * nll - eps / (v - 1) * (logp.sum(-1) + nll)
        if torch.allclose(got, off[keep].mean(), atol=1e-5) and eps > 0:
            _fail("the smoothing mass is spread over the V - 1 wrong tokens",
                  "PyTorch spreads eps / V over all V tokens, the right one included.")
        _fail(f"loss = {got.item():.5f}, expected {want.item():.5f} (N={n}, V={v}, "
              f"eps={eps})",
              "-(1 - eps) * log p[target] - eps / V * sum(log p), averaged over "
              "positions whose target is not pad_id.")
    return _passed("label-smoothed loss equals nn.CrossEntropyLoss on 3 random batches")


@not_attempted_is_false
def check_teacher_forcing_loss(fn: Callable[..., Tensor]) -> bool:
    """Chapter 6, exercise "find the bug: teacher forcing": ``fn(model, src, tgt,
    criterion)`` must feed the decoder tgt[:, :-1] and score its predictions against
    tgt[:, 1:] (``training.translation_loss``).

    Raises:
        CheckError: for the unshifted version (the decoder sees the token it must
            predict), a shift in the wrong direction, or a different value.
    """
    from transformer_course.model import TransformerConfig, make_model
    from transformer_course.training import make_criterion, translation_loss

    gen = torch.Generator().manual_seed(7)
    cfg = TransformerConfig(src_vocab_size=12, tgt_vocab_size=10, d_model=16,
                            n_heads=2, d_ff=32, dropout=0.0, max_len=10)
    torch.manual_seed(7)
    model = make_model(cfg).eval()
    src = torch.randint(4, 12, (3, 5), generator=gen)
    tgt = torch.cat([torch.ones(3, 1).long(), torch.randint(4, 10, (3, 5), generator=gen),
                     torch.full((3, 1), 2)], 1)
    crit = make_criterion(0.1)
    got = fn(model, src, tgt, crit)
    want = translation_loss(model, src, tgt, crit)
    if not isinstance(got, Tensor) or got.numel() != 1:
        _fail("expected a scalar loss tensor", "return criterion(...) of the batch.")
    if torch.allclose(got.reshape(()), want, atol=1e-5):
        return _passed("the decoder reads tgt[:, :-1] and predicts tgt[:, 1:]")
    logits = model(src, tgt)
    same = crit(logits.reshape(-1, 10), tgt.reshape(-1))
    if torch.allclose(got.reshape(()), same, atol=1e-5):
        _fail("the decoder input and the labels are the same sequence: position t "
              "is asked for the token it is reading",
              "input tgt[:, :-1] (from BOS), labels tgt[:, 1:] (up to EOS).")
    _fail(f"loss = {got.item():.5f}, expected {want.item():.5f}",
          "logits = model(src, tgt[:, :-1]); compare logits.reshape(-1, V) with "
          "tgt[:, 1:].reshape(-1).")


# ------------------------------------ chapter 1: from recurrence to attention (issue 19)


@not_attempted_is_false
def check_encoder_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """Chapter 1, exercise "attention over the encoder states": ``fn(dec, memory, w_q,
    w_k, w_score)`` with decoder states dec (B, T, H), encoder states memory (B, S, H),
    w_q and w_k (A, H), w_score (A,) must return ``(context, weights)``, (B, T, H) and
    (B, T, S): additive attention with the encoder states as keys and values
    (``attention.additive_attention``; Bahdanau et al. 2015, section 3.1).

    Raises:
        CheckError: with a hint for the usual mistakes: the softmax over the decoder
            steps instead of the encoder states, a missing tanh, only the last encoder
            state (the fixed-size bottleneck), or wrong shapes.
    """
    from transformer_course.attention import additive_attention

    gen = torch.Generator().manual_seed(19)
    for b, t, s, h, a in ((2, 3, 5, 4, 6), (1, 4, 4, 8, 3), (3, 1, 7, 5, 5)):
        dec, memory = torch.randn(b, t, h, generator=gen), torch.randn(b, s, h, generator=gen)
        w_q, w_k = torch.randn(a, h, generator=gen), torch.randn(a, h, generator=gen)
        w_score = torch.randn(a, generator=gen)
        result = fn(dec, memory, w_q, w_k, w_score)
        if not (isinstance(result, tuple) and len(result) == 2):
            _fail("expected a tuple (context, weights)",
                  "return the weighted sum of the encoder states and the weights.")
        context, weights = result
        check_shape(weights, (b, t, s), "weights")
        check_shape(context, (b, t, h), "context")
        want, want_w = additive_attention(dec, memory, memory, w_q, w_k, w_score)
        if torch.allclose(weights, want_w, atol=1e-5):
            check_close(context, want, atol=1e-5, name="context")
            continue
        features = (dec @ w_q.T).unsqueeze(-2) + (memory @ w_k.T).unsqueeze(-3)
        if t > 1 and torch.allclose(weights, (features.tanh() @ w_score).softmax(1),
                                    atol=1e-5):
            _fail("your weights sum to 1 over the decoder steps, not over the encoder "
                  "states", "take the softmax over the last axis (dim=-1), the keys.")
        if torch.allclose(weights, (features @ w_score).softmax(-1), atol=1e-5):
            _fail("your scores miss the tanh", "score = w_score . tanh(W_q d + W_k m).")
        if torch.allclose(context, memory[:, -1:].expand(b, t, h), atol=1e-5):
            _fail("your context is the last encoder state for every step: that is the "
                  "fixed-size bottleneck attention removes",
                  "weight every encoder state by its softmax score and sum.")
        check_close(weights, want_w, atol=1e-5, name="weights")
    return _passed("attention over the encoder states matches additive_attention on 3 "
                   "random inputs")
