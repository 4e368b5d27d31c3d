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
