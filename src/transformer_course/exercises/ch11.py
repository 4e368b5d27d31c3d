"""Chapter 11, attention at serving time: reading a sequence's keys through a paged
cache's block table, the speculative-sampling rule that keeps the model's
distribution, and KIVI's per-channel quantization of a group of keys.

The references are written out here (an explicit loop over the tokens, the exact
conditional distributions of each rule), so a check does not trust the library code
(``paged_cache.py``, ``speculative.py``, ``kv_quant.py``) it is testing a learner against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_course.exercises import pitfalls
from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    check_shape,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_
from transformer_course.exercises._method import forbids
from transformer_course.kv_quant import quantize
from transformer_course.paged_cache import PagedKVCache, PagedLayerCache
from transformer_course.speculative import accept_or_resample

# ------------------------------------------------------------ the block table

#: (block table, length) of the test cases: a table out of pool order with a last
#: block partly filled, and one whose last block is full.
_TABLE_CASES = [([5, 2, 6], 10), ([3, 0], 8)]


def _gather_reference(pool: Tensor, table: list[int], length: int) -> Tensor:
    """Token j of the sequence lives in block table[j // b] at offset j % b."""
    b = pool.shape[2]
    keys = [pool[table[j // b], :, j % b] for j in range(length)]  # (H_kv, d) each
    return torch.stack(keys, dim=1)  # (H_kv, length, d)


@exercise_check
@forbids(PagedKVCache.gather, PagedLayerCache.update)
def check_paged_gather(fn: Callable[[Tensor, list[int], int], Tensor]) -> bool:
    """Chapter 11, exercise "reading through the block table": ``fn(pool, table,
    length)`` gets one layer's key pool (N, H_kv, b, d) (N blocks of b token slots),
    a sequence's block table (a list of block numbers, in the sequence's order) and
    its length, and must return its keys (H_kv, length, d) in token order: token j is
    in block ``table[j // b]`` at offset ``j % b`` (Kwon et al. 2023, section 4.2).

    Raises:
        CheckError: a wrong shape (``ShapeError``, the unused slots of the last block
            kept, or the tokens before the heads), the block table not read (block
            j // b of the pool), the blocks read in pool order, the pool flattened
            with the heads before the slots, positions counted from 1, a call to the
            library's ``PagedKVCache.gather``, or any other difference.
    """
    gen = torch.Generator().manual_seed(111)
    N, H, b, d = 7, 2, 4, 3
    pool = torch.randn(N, H, b, d, generator=gen)
    for table, length in _TABLE_CASES:
        want = _gather_reference(pool, table, length)
        got = fn(pool, list(table), length)
        if (
            isinstance(got, Tensor)
            and got.shape == (H, len(table) * b, d) != want.shape
        ):
            fail(
                "keys of shape {shape}: all {slots} slots of the {n} blocks, but the "
                "sequence has {length} tokens",
                "the last block is only partly filled: keep the first length slots.",
                kind=ShapeError,
                shape=tuple(got.shape),
                slots=len(table) * b,
                n=len(table),
                length=length,
            )
        if isinstance(got, Tensor) and got.shape == (length, H, d):
            fail(
                "keys of shape {shape} are (length, H_kv, d); expected (H_kv, "
                "length, d) = {want}",
                "the attention reads each head's keys as one (length, d) matrix: the "
                "heads axis comes first.",
                kind=ShapeError,
                shape=tuple(got.shape),
                want=tuple(want.shape),
            )
        check_shape(got, tuple(want.shape), "keys")
        got = got.detach().to(want.dtype)
        if torch.equal(got, want):
            continue
        for wrong, message, hint in (
            (
                pitfalls.gather_ignores_block_table,
                N_(
                    "for table {table} token j was read from block j // b of the pool: "
                    "the block table is not used"
                ),
                N_(
                    "j // b is the sequence's own (logical) block number; the table "
                    "says which block of the pool holds it."
                ),
            ),
            (
                pitfalls.gather_blocks_sorted,
                N_(
                    "for table {table} the blocks were read in the pool's order, not "
                    "in the table's"
                ),
                N_(
                    "the pool hands out whichever block is free: the table's order is "
                    "the sequence's order, whatever the block numbers."
                ),
            ),
            (
                pitfalls.gather_flattened_heads_first,
                N_(
                    "the pool was flattened to token slots with the heads axis still "
                    "before the slots: keys of different heads and tokens are mixed"
                ),
                N_(
                    "a block is (H_kv, b, d): move the slots next to the blocks before "
                    "merging the two axes, or index block and offset separately."
                ),
            ),
            (
                pitfalls.gather_shifted_by_one,
                N_(
                    "the keys are shifted by one token: token 0 is missing and a slot "
                    "past the end is read"
                ),
                N_("the first token is position 0: block table[0], offset 0."),
            ),
        ):
            if torch.equal(got, wrong(pool, list(table), length)):
                fail(message, hint, table=table)
        wrong_at = int((got - want).abs().amax((0, 2)).argmax())
        fail(
            "for table {table} and length {length} the keys differ from the pool's: "
            "token {j} should come from block {block}, offset {offset}",
            "print the (block, offset) of each token j and read those slots in token "
            "order.",
            table=table,
            length=length,
            j=wrong_at,
            block=table[wrong_at // b],
            offset=wrong_at % b,
        )
    return passed(
        "the keys are read in token order through the block table, only up to the "
        "sequence's length"
    )


# ------------------------------------------------------ the speculative accept rule

#: The model's p and the drafter's q of the statistical test (V = 4): q over-proposes
#: tokens 2 and 3, p never gives token 3.
_P = (0.5, 0.3, 0.2, 0.0)
_Q = (0.1, 0.2, 0.3, 0.4)
_ROWS_PER_DRAFT = 5000
_TOLERANCE = 0.04  # largest total variation allowed (sampling noise: about 0.01)


def _rule(accept: Tensor, residual: Tensor) -> Tensor:
    """(V, V): row x is the distribution of the token a rule returns for draft x, when
    it keeps x with probability accept[x] and otherwise draws from residual."""
    residual = residual / residual.sum()
    V = accept.shape[0]
    return (
        accept[:, None] * torch.eye(V, dtype=torch.float64)
        + (1 - accept[:, None]) * residual
    )


def _rules(p: Tensor, q: Tensor) -> tuple[Tensor, list[tuple[Tensor, str, str]]]:
    """The right rule's conditional distributions and the known-wrong ones', each with
    its message and hint (pitfalls.accept_*)."""
    ratio = (p / q).clamp(max=1)
    residual = (p - q).clamp_min(0)
    V = p.shape[0]
    right = _rule(ratio, residual)
    wrong = [
        (
            torch.eye(V, dtype=torch.float64),
            N_(
                "every draft is kept: the tokens follow the drafter's q, not the "
                "model's p"
            ),
            N_(
                "a draft x that q proposes more often than p gives it must sometimes be "
                "rejected: keep it with probability p(x) / q(x) when that is below 1."
            ),
        ),
        (
            _rule(ratio, p),
            N_(
                "a rejected draft is replaced by a draw from p: tokens that q "
                "over-proposes come out too often"
            ),
            N_(
                "the kept drafts already give p where q is small; a replacement must "
                "add only what is missing, the part of p above q: max(0, p - q), "
                "normalised."
            ),
        ),
        (
            _rule((q / p).nan_to_num(posinf=1.0).clamp(max=1), residual),
            N_(
                "the draft is kept with probability q(x) / p(x): the ratio is upside down"
            ),
            N_(
                "the model's p(x) goes on top: keep x with probability min(1, p(x) / q(x))."
            ),
        ),
        (
            _rule(p, residual),
            N_(
                "the draft is kept with probability p(x), not p(x) / q(x): q(x) is "
                "left out"
            ),
            N_(
                "q(x) is how often the drafter proposes x; divide by it (the rule "
                "is min(1, p(x) / q(x)))."
            ),
        ),
        (
            _rule(ratio, (q - p).clamp_min(0)),
            N_(
                "a rejected draft is replaced from max(0, q - p): the difference is "
                "the wrong way round"
            ),
            N_(
                "the replacement must give the tokens p wants more than q proposes: "
                "max(0, p - q), normalised."
            ),
        ),
        (
            p[None, :].expand(V, V),
            N_(
                "every token is drawn from p whatever the draft: the distribution is "
                "right, but the draft is kept only when the draw equals it"
            ),
            N_(
                "speculation saves a forward pass only if drafts are kept as often as "
                "possible: keep x with probability min(1, p(x) / q(x)), draw only "
                "when it is rejected."
            ),
        ),
        (
            _rule((p >= q).double(), residual),
            N_(
                "the draft is kept exactly when p(x) >= q(x): a threshold, not a "
                "random draw"
            ),
            N_(
                "draw u uniform in [0, 1) and keep x when u < p(x) / q(x): a draft "
                "with p(x) < q(x) is kept sometimes, not never."
            ),
        ),
        (
            residual[None, :].expand(V, V) / residual.sum(),
            N_("no draft is ever kept: every token is drawn from max(0, p - q)"),
            N_(
                "the residual is only for a rejected draft; first keep x with "
                "probability min(1, p(x) / q(x))."
            ),
        ),
    ]
    return right, wrong


def _total_variation(a: Tensor, b: Tensor) -> Tensor:
    """Half the L1 distance of the rows of a and b: (V,)."""
    return (a - b).abs().sum(-1) / 2


def _tokens(got, n: int, what: str) -> Tensor:
    if isinstance(got, (tuple, list)) and len(got) == 2:
        fail(
            "the function returned a pair; expected only the tokens, (n,) long",
            "whether a draft was kept is token == draft: return only the tokens.",
            kind=ShapeError,
        )
    check_shape(got, (n,), what)
    if got.dtype.is_floating_point or got.dtype == torch.bool:
        fail(
            "the tokens are {dtype}; expected integer token ids",
            "return the kept draft or the drawn token id (torch.long) for each row.",
            kind=ShapeError,
            dtype=got.dtype,
        )
    return got.long()


def _call(fn, draft, p, q, generator):
    """fn's tokens; a draw from an all-zero or NaN residual named, not a crash."""
    try:
        return fn(draft, p, q, generator)
    except RuntimeError as err:
        if "multinomial" in str(err) or "probability" in str(err):
            fail(
                "torch.multinomial refused a distribution (all zeros, negative or "
                "NaN): where p == q the residual max(0, p - q) is all zeros",
                "where p equals q every draft is kept and no draw is needed: draw "
                "only for rejected rows, or draw from p where the residual is empty.",
            )
        raise


@exercise_check
@forbids(accept_or_resample)
def check_speculative_accept(fn: Callable[..., Tensor]) -> bool:
    """Chapter 11, exercise "the accept rule": ``fn(draft, p, q, generator)`` gets n
    draft tokens (n,) long, the model's distributions p (n, V) and the drafter's q
    (n, V) at each row (each row sums to 1; q(draft) > 0), and a ``torch.Generator``,
    and must return one token a row (n,) long: the draft x, kept with probability
    min(1, p(x) / q(x)), else a token drawn from max(0, p - q) normalised. With drafts
    drawn from q the tokens then follow p exactly (Leviathan et al. 2023, appendix
    A.1; Chen et al. 2023, theorem 1).

    The check is statistical, with fixed seeds: 5,000 rows for each draft token of a
    4-token vocabulary; for each draft the tokens returned must be within total
    variation 0.04 of the rule's distribution. Then rows with p == q: every draft kept.

    Raises:
        CheckError: a wrong type or shape; every draft kept; a rejected draft replaced
            from p or from max(0, q - p); the ratio q/p; p(x) without q(x); every token
            drawn from p; a threshold p >= q instead of a draw; no draft kept; a crash
            of torch.multinomial where p == q; a call to the library's
            ``accept_or_resample``; or any other distribution.
    """
    p = torch.tensor(_P, dtype=torch.float64)
    q = torch.tensor(_Q, dtype=torch.float64)
    V = p.shape[0]
    right, wrong = _rules(p, q)
    draft = torch.arange(V).repeat_interleave(_ROWS_PER_DRAFT)  # (n,)
    n = draft.shape[0]
    rows_p = p.float()[None].expand(n, V).contiguous()
    rows_q = q.float()[None].expand(n, V).contiguous()
    with torch.random.fork_rng(devices=[]):  # the notebook's own random state kept
        torch.manual_seed(112)  # also fixed for an answer that ignores generator
        gen = torch.Generator().manual_seed(113)
        got = _tokens(_call(fn, draft, rows_p, rows_q, gen), n, "tokens")
    if bool((got < 0).any() | (got >= V).any()):
        fail(
            "token ids outside the vocabulary 0..{last}: got {bad}",
            "return the draft itself or a token id drawn from the residual.",
            last=V - 1,
            bad=sorted(set(got[(got < 0) | (got >= V)].tolist()))[:5],
        )
    counts = torch.zeros(V, V, dtype=torch.float64)
    counts.index_put_((draft, got), torch.ones(n, dtype=torch.float64), accumulate=True)
    seen = counts / _ROWS_PER_DRAFT  # (V, V): row x, the tokens returned for draft x
    if bool((_total_variation(seen, right) > _TOLERANCE).any()):
        for rule, message, hint in wrong:
            if bool((_total_variation(seen, rule) <= _TOLERANCE).all()):
                fail(message, hint)
        x = int(_total_variation(seen, right).argmax())
        fail(
            "for draft {x} the tokens returned were {got}, expected {want} "
            "(keep x with probability {keep:.2f}, else draw from max(0, p - q))",
            "take one draft x by hand: the chance to keep it is min(1, p(x) / q(x)); "
            "the rest is a draw from the part of p above q.",
            x=x,
            got=[round(v, 3) for v in seen[x].tolist()],
            want=[round(v, 3) for v in right[x].tolist()],
            keep=min(1.0, _P[x] / _Q[x]),
        )
    same = torch.tensor([[0.25, 0.25, 0.5], [0.7, 0.2, 0.1]])  # p == q: keep them all
    draft = torch.tensor([2, 0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(114)
        gen = torch.Generator().manual_seed(115)
        got = _tokens(_call(fn, draft, same, same.clone(), gen), 2, "tokens")
    if not torch.equal(got, draft):
        fail(
            "with p == q the drafts {draft} came back as {got}: a draft the model "
            "agrees with must always be kept",
            "min(1, p(x) / q(x)) is 1 when p(x) = q(x): keep x for sure.",
            draft=draft.tolist(),
            got=got.tolist(),
        )
    return passed(
        "drafts are kept with probability min(1, p/q) and replaced from "
        "max(0, p - q): the tokens follow the model's p"
    )


# ---------------------------------------------------- KIVI: keys per channel


def _kivi_reference(k: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """(dequantized keys, step of each channel (1, d)), channel by channel."""
    levels = 2**bits - 1
    out, steps = torch.empty_like(k), torch.empty(1, k.shape[1], dtype=k.dtype)
    for c in range(k.shape[1]):
        lo, hi = k[:, c].min(), k[:, c].max()
        step = (hi - lo) / levels if hi > lo else torch.ones((), dtype=k.dtype)
        out[:, c] = ((k[:, c] - lo) / step).round().clamp(0, levels) * step + lo
        steps[0, c] = step
    return out, steps


def _keys_group(gen: torch.Generator) -> Tensor:
    """A group of G = 6 keys with d = 5 channels, channel 2 twenty times larger and
    every channel off centre (KIVI, figure 2: keys have outlier channels)."""
    k = torch.randn(6, 5, generator=gen) + torch.tensor([0.5, -1.0, 0.0, 2.0, 0.3])
    return k * torch.tensor([1.0, 0.5, 20.0, 1.5, 0.8])


@exercise_check
@forbids(quantize)
def check_kivi_keys(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 11, exercise "keys per channel": ``fn(k, bits)`` gets a group of keys k
    (G, d) float32 (G tokens, d channels) and must return them quantized to ``bits``
    bits and dequantized, (G, d): per channel c, with lo and hi the minimum and maximum
    of k[:, c] over the G tokens, step s = (hi - lo) / (2^bits - 1), code
    round((k - lo) / s) and value code * s + lo, so every key is within s / 2 of the
    original (KIVI, Liu et al. 2024, section 3.2; asymmetric quantization, Jacob et
    al. 2018, section 2.1). A channel with hi == lo comes back exactly.

    Raises:
        CheckError: a wrong shape (``ShapeError``); one scale per token (KIVI's values),
            one for the whole group, a symmetric scale, truncation instead of rounding,
            2^bits steps instead of 2^bits - 1, the bits ignored, a call to the library's
            ``kv_quant.quantize``, or any other difference (the key farthest off).
    """
    gen = torch.Generator().manual_seed(116)
    k = _keys_group(gen)
    for bits in (4, 2):
        want, steps = _kivi_reference(k, bits)
        got = fn(k.clone(), bits)
        check_shape(got, tuple(k.shape), "keys")
        got = got.detach().to(k.dtype)
        if torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            continue
        for wrong, message, hint in (
            (
                pitfalls.kivi_keys_per_token,
                N_(
                    "one scale per token, over its channels: that is how KIVI "
                    "quantizes values; for keys channel {big}'s large range sets "
                    "every token's step"
                ),
                N_(
                    "reduce over the tokens (axis 0), not over the channels: each "
                    "channel gets its own minimum and step."
                ),
            ),
            (
                pitfalls.kivi_keys_one_scale,
                N_(
                    "one scale for the whole group: every channel shares channel {big}'s step"
                ),
                N_("take the minimum and maximum of each channel separately."),
            ),
            (
                pitfalls.kivi_keys_symmetric,
                N_(
                    "a symmetric scale, max |k| / (2^(bits-1) - 1): a channel off "
                    "centre wastes the codes on one side of zero"
                ),
                N_(
                    "asymmetric: subtract each channel's minimum, then spread "
                    "2^bits - 1 steps from its minimum to its maximum."
                ),
            ),
            (
                pitfalls.kivi_keys_truncated,
                N_(
                    "the codes are truncated, not rounded: errors up to a whole step, "
                    "all of one sign"
                ),
                N_("round to the nearest code; the error is then at most half a step."),
            ),
            (
                pitfalls.kivi_keys_2_to_the_bits,
                N_(
                    "the step is (max - min) / 2^bits: each channel's maximum needs "
                    "code 2^bits, one more than {bits} bits hold"
                ),
                N_(
                    "{bits} bits give 2^bits codes, 0 to 2^bits - 1: that is "
                    "2^bits - 1 steps from the minimum to the maximum."
                ),
            ),
            (
                lambda k, bits: _kivi_reference(k, 8)[0],
                N_(
                    "with bits = {bits} the keys are as precise as with 8 bits: bits is ignored"
                ),
                N_("use bits for the number of codes: 2^bits of them."),
            ),
        ):
            if torch.allclose(got, wrong(k.clone(), bits), rtol=1e-5, atol=1e-5):
                fail(message, hint, big=2, bits=bits)
        off = (got - want).abs() / steps  # in steps of each channel
        t, c = divmod(int(off.argmax()), k.shape[1])
        fail(
            "with bits = {bits} key ({t}, {c}) is {got:.4f}, expected {want:.4f}: "
            "the original {orig:.4f} on channel {c}'s grid of step {step:.4f}",
            "compute channel {c} by hand: its minimum, its step (max - min) / "
            "(2^bits - 1), the code of each key rounded, then code * step + minimum.",
            bits=bits,
            t=t,
            c=c,
            got=got[t, c].item(),
            want=want[t, c].item(),
            orig=k[t, c].item(),
            step=steps[0, c].item(),
        )
    return passed("keys quantized per channel: each within half its channel's step")
