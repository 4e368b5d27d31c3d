"""Chapter 10, a modern LLM: RMSNorm, SwiGLU, the size of a grouped-query KV cache, and
loading one GGUF tensor in the right RoPE layout.

The references are written out here (explicit sums, index loops), so a check does not
trust the library code (``layers.py``, ``interop.py``) it is testing a learner against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    check_shape,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids
from transformer_course.interop import permute_rotary_rows
from transformer_course.layers import RMSNorm, SwiGLU
from transformer_course.measure import kv_cache_bytes_per_token


def _close(a, b, atol=1e-5) -> bool:
    return (
        isinstance(a, Tensor)
        and a.shape == b.shape
        and torch.allclose(a.detach(), b, atol=atol, equal_nan=True)  # NaN where b has
    )


def _rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    mean_square = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    return x / torch.sqrt(mean_square + eps) * weight


@exercise_check
@forbids(RMSNorm)
def check_rms_norm(fn: Callable[[Tensor, Tensor, float], Tensor]) -> bool:
    """Chapter 10, exercise "RMSNorm": ``fn(x, weight, eps)`` with x (..., D) and weight
    (D,) must return x / sqrt(mean(x^2) + eps) * weight over the last axis (Zhang and
    Sennrich 2019, equation (4)).

    Raises:
        CheckError: a wrong shape (``ShapeError``), the mean subtracted (LayerNorm), eps
            added outside the square root or left out, the gain left out, the mean of
            x or the sum of squares in place of the mean of squares, no square root,
            another axis, a call to the library's ``RMSNorm``, or any other
            difference (token 0's values).
    """
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(3, 4, 6, generator=gen) * 3 + 2  # a mean far from 0 shows LayerNorm
    weight = torch.rand(6, generator=gen) + 0.5
    eps = 0.5  # large, so where it goes shows
    want = _rms_reference(x, weight, eps)
    got = fn(x, weight, eps)
    check_shape(got, tuple(want.shape), "output")
    if _close(got, want):
        return passed(
            "RMSNorm divides by the root mean square, then scales by the gain"
        )
    centred = x - x.mean(-1, keepdim=True)
    if _close(got, _rms_reference(centred, weight, eps)) or _close(
        got, torch.nn.functional.layer_norm(x, (6,), weight, eps=eps)
    ):
        fail(
            "the mean is subtracted: that is LayerNorm",
            "RMSNorm keeps the mean; it divides by sqrt(mean(x^2) + eps) only.",
        )
    rms = torch.sqrt((x * x).mean(-1, keepdim=True))
    if _close(got, x / (rms + eps) * weight):
        fail(
            "eps is added to the root mean square instead of inside the square root",
            "with eps = 0.5 here, sqrt(m + eps) and sqrt(m) + eps differ visibly.",
        )
    if _close(got, _rms_reference(x, torch.ones(6), eps)):
        fail(
            "the gain is missing",
            "multiply the normalised x by weight (D,) at the end.",
        )
    if _close(got, _rms_reference(x, weight, 0.0)):
        fail(
            "eps is left out: the output is x / sqrt(mean(x^2)) * weight",
            "eps (0.5 here) goes inside the square root: sqrt(mean(x^2) + eps).",
        )
    if _close(got, x / torch.sqrt(x.mean(-1, keepdim=True) + eps) * weight):
        fail(
            "the root is of the mean of x, not of the mean of its squares",
            "square first: mean(x * x) over the last axis, then + eps and the root.",
        )
    if _close(got, x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps) * weight):
        fail(
            "the root is of the sum of the squares, not of their mean: the output "
            "is sqrt(D) = {root:.3f} times too small",
            "divide the sum of squares by D, the size of the last axis (or use mean).",
            root=x.shape[-1] ** 0.5,
        )
    if _close(got, x / ((x * x).mean(-1, keepdim=True) + eps) * weight):
        fail(
            "the square root is missing: x is divided by mean(x^2) + eps itself",
            "the root mean square is sqrt(mean(x^2)): take the root of the mean.",
        )
    for axis in ((0,), (1,), (0, 1, 2)):
        mean_square = (x * x).mean(axis, keepdim=True)
        if _close(got, x / torch.sqrt(mean_square + eps) * weight):
            fail(
                "the mean of x^2 runs over axis {axis}, not over the last axis",
                "the mean is over the last axis (the D features of each token), "
                "keepdim=True.",
                axis=axis if len(axis) > 1 else axis[0],
            )
    fail(
        "the output differs from x / sqrt(mean(x^2) + eps) * weight: for token 0 "
        "got {got}, expected {want}",
        "compute one token by hand: its mean of squares over the D features, plus "
        "eps, the root, then x / root * weight.",
        got=[round(v, 4) for v in got[0, 0].tolist()],
        want=[round(v, 4) for v in want[0, 0].tolist()],
    )


@exercise_check
@forbids(SwiGLU)
def check_swiglu(fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> bool:
    """Chapter 10, exercise "SwiGLU": ``fn(x, w_gate, w_up, w_down)`` with x (..., D)
    and ``nn.Linear`` weights (d_ff, D), (d_ff, D), (D, d_ff) must return
    (SiLU(x W_gate^T) * (x W_up^T)) W_down^T (Shazeer 2020, equation (6)).

    Raises:
        CheckError: a wrong shape, the gate and up projections swapped, a sigmoid
            instead of SiLU (plain GLU), GELU (GeGLU), SiLU on both projections or
            after the product, a sum instead of the product, no gate at all, a call
            to the library's ``SwiGLU``, or any other difference.
    """
    gen = torch.Generator().manual_seed(11)
    D, d_ff = 5, 7
    x = torch.randn(2, 3, D, generator=gen)
    w_gate, w_up = (
        torch.randn(d_ff, D, generator=gen),
        torch.randn(d_ff, D, generator=gen),
    )
    w_down = torch.randn(D, d_ff, generator=gen)
    g, u = x @ w_gate.T, x @ w_up.T  # (2, 3, d_ff)
    want = (g * torch.sigmoid(g) * u) @ w_down.T
    got = fn(x, w_gate, w_up, w_down)
    if not isinstance(got, Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        fail(
            "expected a tensor of shape {want_shape} (..., D), got {shape}",
            "nn.Linear weights are (out, in): x @ w.T maps D to d_ff and back.",
            kind=ShapeError,
            want_shape=tuple(want.shape),
            shape=shape,
        )
    if _close(got, want, 1e-4):
        return passed("SwiGLU gates the up projection with the SiLU of the gate")
    if _close(got, (u * torch.sigmoid(u) * g) @ w_down.T, 1e-4):
        fail(
            "the SiLU is applied to the up projection: gate and up are swapped",
            "the activation goes on x @ w_gate.T; x @ w_up.T is multiplied in as is.",
        )
    if _close(got, (torch.sigmoid(g) * u) @ w_down.T, 1e-4):
        fail(
            "the gate is a sigmoid (GLU), not SiLU (Swish)", "SiLU(z) = z * sigmoid(z)."
        )
    if _close(got, (g * torch.sigmoid(g)) @ w_down.T, 1e-4) or _close(
        got, (u * torch.sigmoid(u)) @ w_down.T, 1e-4
    ):
        fail(
            "only one projection is used: there is no gate",
            "SwiGLU multiplies two projections of x elementwise.",
        )
    silu = torch.nn.functional.silu
    for wrong, message, hint in (
        (
            (torch.nn.functional.gelu(g) * u) @ w_down.T,
            N_("the gate is a GELU (GeGLU), not SiLU"),
            N_("SwiGLU's gate is SiLU(z) = z * sigmoid(z) (Shazeer 2020, eq. 6)."),
        ),
        (
            (silu(g) * silu(u)) @ w_down.T,
            N_("the SiLU is applied to both projections"),
            N_("only the gate goes through SiLU; x @ w_up.T is multiplied in as is."),
        ),
        (
            silu(g * u) @ w_down.T,
            N_("the SiLU is applied after the product, to gate * up"),
            N_("apply SiLU to the gate projection first, then multiply by up."),
        ),
        (
            (silu(g) + u) @ w_down.T,
            N_("the gate and up projections are added, not multiplied"),
            N_("a gated unit multiplies elementwise: SiLU(gate) * up."),
        ),
        (
            (g * torch.sigmoid(g) * u).relu() @ w_down.T,
            N_("a ReLU is applied before the down projection"),
            N_("SwiGLU has one activation, the SiLU of the gate."),
        ),
    ):
        if _close(got, wrong, 1e-4):
            fail(message, hint)
    fail(
        "the output differs from W_down(SiLU(W_gate x) * W_up x)",
        "compare with a 1-token x and print the d_ff hidden values.",
    )


#: (n_layers, n_heads, n_kv_heads, d_k, bytes per element, tokens) of the test cases.
_GQA_CASES = [(30, 9, 3, 64, 2, 8192), (32, 32, 8, 128, 2, 1000), (4, 6, 1, 16, 4, 7)]


@exercise_check
@forbids(kv_cache_bytes_per_token)
def check_gqa_cache_bytes(fn: Callable[[int, int, int, int, int, int], int]) -> bool:
    """Chapter 10, exercise "a GQA KV-cache size": ``fn(n_layers, n_heads, n_kv_heads,
    d_k, bytes_per_element, n_tokens)`` must return the bytes a KV cache holds for
    n_tokens tokens: keys and values, of the n_kv_heads heads, in every layer.

    Raises:
        CheckError: a result that is not an int, the query heads counted (also as
            n_heads * n_kv_heads), the group size n_heads // n_kv_heads for the KV
            heads, keys or values left out, n_tokens left out or off by one, bits for
            bytes, a call to the library's ``kv_cache_bytes_per_token``, or any other
            difference.
    """
    for L, H, H_kv, d_k, nbytes, n in _GQA_CASES:
        want = 2 * L * H_kv * d_k * nbytes * n
        got = fn(L, H, H_kv, d_k, nbytes, n)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(
                "expected an int (bytes), got {type}",
                "a size in bytes is a whole number: use int arithmetic.",
                kind=ShapeError,
                type=type(got).__name__,
            )
        if got == want:
            continue
        per_head = want // H_kv  # bytes of one KV head
        if got == want // H_kv * H:
            fail(
                "n_heads={H} heads are counted: the cache holds the n_kv_heads={H_kv}",
                "grouped queries share key/value heads; only those are cached.",
                H=H,
                H_kv=H_kv,
            )
        if got == per_head * (H // H_kv) and H // H_kv != H_kv:
            fail(
                "for {config} you count n_heads // n_kv_heads = {ratio} heads: that "
                "is the group size (query heads per KV head), not the number of KV "
                "heads, {H_kv}",
                "the cache holds n_kv_heads key heads and as many value heads.",
                config=(L, H, H_kv, d_k, nbytes, n),
                ratio=H // H_kv,
                H_kv=H_kv,
            )
        if got == per_head * H * H_kv:
            fail(
                "for {config} you count n_heads * n_kv_heads = {product} heads; the "
                "cache holds the n_kv_heads = {H_kv}",
                "grouped queries share key/value heads; only those are cached.",
                config=(L, H, H_kv, d_k, nbytes, n),
                product=H * H_kv,
                H_kv=H_kv,
            )
        if got * 2 == want:
            fail(
                "half the expected size: keys or values are missing",
                "every cached token keeps one key and one value per KV head.",
            )
        for wrong, message, hint in (
            (
                want // n,
                N_("the size of one token's cache: n_tokens is not multiplied in"),
                N_("every token adds its own keys and values: multiply by n_tokens."),
            ),
            (
                want * 8,
                N_("8 times the expected size: that is a count of bits, not bytes"),
                N_("bytes_per_element is already in bytes."),
            ),
            (
                want // n * (n + 1),
                N_("one token too many: the size is for n_tokens + 1 tokens"),
                N_("n_tokens cached tokens take n_tokens times one token's size."),
            ),
            (
                want // n * (n - 1),
                N_("one token too few: the size is for n_tokens - 1 tokens"),
                N_("n_tokens cached tokens take n_tokens times one token's size."),
            ),
        ):
            if got == wrong and n > 1:
                fail(
                    "for {config} expected {want:,} bytes, got {got:,}: {message}",
                    hint,
                    config=(L, H, H_kv, d_k, nbytes, n),
                    want=want,
                    got=got,
                    message=gettext(message),
                )
        fail(
            "for {config} expected {want:,} bytes, got {got:,}",
            "multiply: 2 x layers x KV heads x d_k x bytes per element x tokens.",
            config=(L, H, H_kv, d_k, nbytes, n),
            want=want,
            got=got,
        )
    return passed("the KV cache holds 2 x layers x KV heads x d_k numbers a token")


def _interleave(w: Tensor, n_heads: int) -> Tensor:
    """llama.cpp's permutation, row by row: half layout -> interleaved."""
    d = w.shape[0] // n_heads
    out = torch.empty_like(w)
    for h in range(n_heads):
        for i in range(d // 2):
            out[h * d + 2 * i] = w[h * d + i]
            out[h * d + 2 * i + 1] = w[h * d + i + d // 2]
    return out


def _deinterleave_rows(w: Tensor, n_heads: int) -> Tensor:
    """The inverse of ``_interleave``, row by row."""
    d = w.shape[0] // n_heads
    out = torch.empty_like(w)
    for h in range(n_heads):
        for i in range(d // 2):
            out[h * d + i] = w[h * d + 2 * i]
            out[h * d + i + d // 2] = w[h * d + 2 * i + 1]
    return out


@exercise_check
@forbids(permute_rotary_rows)
def check_unpermute_rows(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 10, exercise "loading one tensor with the right layout": ``fn(w,
    n_heads)`` gets W^Q or W^K (n_heads * d_k, D) as a GGUF file stores it (each head's
    rows interleaved by llama.cpp's converter) and must return the rows in Hugging
    Face's "half" layout (the converter's permutation undone).

    Raises:
        CheckError: a wrong shape, the rows unchanged, the permutation applied again
            instead of undone, the heads ignored, the two halves of a head swapped,
            the head offset forgotten, a call to the library's
            ``permute_rotary_rows``, or any other difference.
    """
    gen = torch.Generator().manual_seed(12)
    n_heads, d_k, D = 3, 8, 5
    half = torch.randn(n_heads * d_k, D, generator=gen)
    stored = _interleave(half, n_heads)
    got = fn(stored, n_heads)
    check_shape(got, tuple(half.shape), "rows")
    if _close(got, half, 0):
        return passed("the rows are back in the half layout, head by head")
    if _close(got, stored, 0):
        fail(
            "the rows are unchanged", "GGUF moved row i + d_k/2 of each head to 2i + 1."
        )
    if _close(got, _interleave(stored, n_heads), 0):
        fail(
            "the permutation is applied again instead of undone",
            "reshape each head as (d_k / 2, 2): the pairs are adjacent rows.",
        )
    if _close(got, _interleave(torch.eye(n_heads * d_k), 1).T @ stored, 0):
        fail(
            "the rows are permuted as one head: n_heads is ignored",
            "each head's d_k rows are permuted on their own.",
        )
    d = d_k // 2
    swapped = torch.cat(
        [half[h * d_k : (h + 1) * d_k].roll(d, 0) for h in range(n_heads)]
    )
    if _close(got, swapped, 0):
        fail(
            "within each head the two halves are swapped: rows 2i + 1 went to the "
            "first half and rows 2i to the second",
            "row 2i of a head (the first of a pair) goes to row i, row 2i + 1 to "
            "row i + d_k / 2.",
        )
    head0 = _deinterleave_rows(stored[:d_k], 1)
    if _close(got, head0.repeat(n_heads, 1), 0):
        fail(
            "every head holds head 0's rows: the head offset h * d_k is missing "
            "from the row indices",
            "head h's rows are h * d_k to (h + 1) * d_k - 1 of the stored tensor.",
        )
    fail(
        "the rows differ from the half layout",
        "row 2i of a head goes to row i, row 2i + 1 to row i + d_k / 2.",
    )
