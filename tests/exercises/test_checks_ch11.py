"""Chapter 11's self-checks: a learner's own right answers pass (also written another
way), the library's own versions are refused (the exercise asks for the computation),
each known-wrong variant of ``pitfalls`` fails with the message that names its mistake
(``check.strict``), prints two lines and returns False (``check``), in English and in
Chinese."""

from __future__ import annotations

import pytest
import torch

from transformer_course.exercises import (
    CheckError,
    ShapeError,
    ch11,
    check_kivi_keys,
    check_paged_gather,
    check_speculative_accept,
    pitfalls,
    set_language,
)
from transformer_course.kv_quant import dequantize, quantize
from transformer_course.paged_cache import BlockPool, PagedKVCache
from transformer_course.speculative import accept_or_resample

param = pytest.mark.parametrize

# ------------------------------------------------------------ the block table


def own_gather(pool, table, length):
    b = pool.shape[2]
    j = torch.arange(length)
    return pool[torch.tensor(table)[j // b], :, j % b].transpose(0, 1)


def gather_loop(pool, table, length):  # right, one token at a time
    b = pool.shape[2]
    return torch.stack([pool[table[j // b], :, j % b] for j in range(length)], dim=1)


def gather_blocks_then_cut(pool, table, length):  # right, whole blocks then a slice
    blocks = pool[torch.tensor(table)]  # (n, H, b, d)
    return blocks.transpose(0, 1).flatten(1, 2)[:, :length]


def gather_flat(pool, table, length):  # right, the slots flattened the right way
    N, H, b, d = pool.shape
    flat = pool.transpose(1, 2).reshape(N * b, H, d)
    slots = [table[j // b] * b + j % b for j in range(length)]
    return flat[slots].transpose(0, 1)


@param("answer", [own_gather, gather_loop, gather_blocks_then_cut, gather_flat])
def test_right_gathers_pass(answer, quiet_check):
    assert quiet_check(check_paged_gather, answer) is True


def test_the_reference_agrees_with_the_librarys_paged_cache():
    """The check's reference reads what ``PagedKVCache.gather`` reads."""
    pool = BlockPool(1, 2, 3, n_blocks=6, block_size=4)
    cache = PagedKVCache(pool)
    seq, _ = cache.add_sequence()
    cache.prepare([seq], [list(range(10))])
    cache.block_tables[seq] = [4, 1, 3]  # out of pool order
    pool.k[0].copy_(torch.randn(pool.k[0].shape))
    keys, _ = cache.gather(0, seq)
    assert torch.equal(ch11._gather_reference(pool.k[0], [4, 1, 3], 10), keys)


GATHER_PITFALLS = [
    (pitfalls.gather_ignores_block_table, "the block table is not used"),
    (pitfalls.gather_blocks_sorted, "in the pool's order"),
    (pitfalls.gather_flattened_heads_first, "heads axis still before the slots"),
    (pitfalls.gather_shifted_by_one, "shifted by one token"),
    (
        lambda pool, t, n: gather_blocks_then_cut(pool, t, len(t) * pool.shape[2]),
        "slots",
    ),
    (lambda pool, t, n: own_gather(pool, t, n).transpose(0, 1), "heads axis comes"),
]


def test_gather_shape_mistakes_are_shape_errors_and_others_are_named_by_token():
    with pytest.raises(ShapeError, match="partly filled"):
        check_paged_gather.strict(GATHER_PITFALLS[4][0])
    with pytest.raises(ShapeError, match="heads axis comes first"):
        check_paged_gather.strict(GATHER_PITFALLS[5][0])

    def last_token_wrong(pool, table, length):
        keys = own_gather(pool, table, length).clone()
        keys[:, -1] = 0
        return keys

    with pytest.raises(CheckError, match="token 9 should come from block 6, offset 1"):
        check_paged_gather.strict(last_token_wrong)


def test_the_librarys_gather_is_refused(capsys):
    def library_gather(pool, table, length):
        p = BlockPool(
            1,
            pool.shape[1],
            pool.shape[3],
            n_blocks=pool.shape[0],
            block_size=pool.shape[2],
        )
        p.k[0].copy_(pool)
        cache = PagedKVCache(p)
        seq, _ = cache.add_sequence()
        cache.tokens[seq] = [0] * length
        cache.block_tables[seq] = list(table)
        return cache.gather(0, seq)[0]

    assert check_paged_gather(library_gather) is False
    printed = capsys.readouterr().out
    assert (
        "calls the library's transformer_course.paged_cache.PagedKVCache.gather"
        in printed
    )
    assert check_paged_gather(library_gather, library_ok=True) is True  # the numbers


# ------------------------------------------------------ the speculative accept rule


def own_accept(draft, p, q, generator=None):
    px = p.gather(-1, draft[:, None])[:, 0]
    qx = q.gather(-1, draft[:, None])[:, 0]
    kept = torch.rand(px.shape, generator=generator) < px / qx
    residual = (p - q).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
    drawn = torch.multinomial(residual, 1, generator=generator)[:, 0]
    return torch.where(kept, draft, drawn)


def accept_loop(draft, p, q, generator=None):
    """Right, one row at a time, drawing only for a rejected row, ignoring generator."""
    out = []
    for x, pi, qi in zip(draft.tolist(), p, q):
        if torch.rand(()) < min(1.0, float(pi[x] / qi[x])):
            out.append(x)
        else:
            r = (pi - qi).clamp_min(0)
            out.append(int(torch.multinomial(r / r.sum(), 1)))
    return torch.tensor(out)


def accept_inverse_cdf(draft, p, q, generator=None):
    """Right, with its own uniform draws: keep if u * q < p, else invert the CDF of the
    residual (no torch.multinomial), as int32."""
    px = p.gather(-1, draft[:, None])[:, 0]
    qx = q.gather(-1, draft[:, None])[:, 0]
    u, v = torch.rand(2, draft.shape[0], generator=generator)
    residual = (p - q).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p)
    drawn = (residual.cumsum(-1) < v[:, None]).sum(-1).clamp(max=p.shape[-1] - 1)
    return torch.where(u * qx < px, draft, drawn).to(torch.int32)


@param("answer", [own_accept, accept_loop, accept_inverse_cdf])
def test_right_accept_rules_pass(answer, quiet_check):
    assert quiet_check(check_speculative_accept, answer) is True


def test_the_check_leaves_the_notebooks_random_state_alone(quiet_check):
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    assert quiet_check(check_speculative_accept, accept_loop) is True
    assert torch.equal(torch.rand(3), want)


def test_the_right_rule_gives_the_models_distribution():
    """What the check's reference stands on: drafts drawn from q and the rule applied,
    the tokens' distribution is p (Leviathan et al. 2023, appendix A.1), and each
    known-wrong rule's is farther from p or keeps fewer drafts."""
    p = torch.tensor(ch11._P, dtype=torch.float64)
    q = torch.tensor(ch11._Q, dtype=torch.float64)
    right, wrong = ch11._rules(p, q)
    assert torch.allclose(q @ right, p)
    kept = (q * right.diagonal()).sum()
    for rule, message, _ in wrong:
        assert bool((ch11._total_variation(rule, right) > 3 * ch11._TOLERANCE).any())
        marginal = q @ rule
        assert (
            not torch.allclose(marginal, p) or (q * rule.diagonal()).sum() < kept - 0.1
        ), message


ACCEPT_PITFALLS = [
    (pitfalls.accept_always, "every draft is kept"),
    (pitfalls.accept_resample_from_p, "replaced by a draw from p"),
    (pitfalls.accept_ratio_inverted, "upside down"),
    (pitfalls.accept_with_probability_p, "q(x) is left out"),
    (pitfalls.accept_residual_q_minus_p, "wrong way round"),
    (pitfalls.accept_ignores_draft, "whatever the draft"),
    (pitfalls.accept_if_p_at_least_q, "a threshold"),
    (
        lambda d, p, q, g=None: torch.multinomial((p - q).clamp_min(0), 1, generator=g)[
            :, 0
        ],
        "no draft is ever kept",
    ),
]


def test_an_empty_residual_and_other_answers_are_named():
    def no_guard(draft, p, q, generator=None):  # right except where p == q
        px = p.gather(-1, draft[:, None])[:, 0]
        qx = q.gather(-1, draft[:, None])[:, 0]
        kept = torch.rand(px.shape, generator=generator) < px / qx
        drawn = torch.multinomial((p - q).clamp_min(0), 1, generator=generator)[:, 0]
        return torch.where(kept, draft, drawn)

    with pytest.raises(CheckError, match="where p == q the residual"):
        check_speculative_accept.strict(no_guard)

    def flips_kept_ties(draft, p, q, generator=None):
        out = own_accept(draft, p, q, generator)
        return torch.where((p - q).abs().sum(-1) == 0, (draft + 1) % p.shape[-1], out)

    with pytest.raises(CheckError, match="must always be kept"):
        check_speculative_accept.strict(flips_kept_ties)
    with pytest.raises(ShapeError, match="a pair"):
        check_speculative_accept.strict(
            lambda d, p, q, g=None: (torch.ones_like(d, dtype=torch.bool), d)
        )
    with pytest.raises(ShapeError, match="integer token ids"):
        check_speculative_accept.strict(lambda d, p, q, g=None: d.float())
    with pytest.raises(CheckError, match="outside the vocabulary"):
        check_speculative_accept.strict(lambda d, p, q, g=None: d + 1)
    with pytest.raises(CheckError, match="for draft 2 the tokens returned"):
        check_speculative_accept.strict(
            lambda d, p, q, g=None: torch.where(d == 2, 0, own_accept(d, p, q, g))
        )


def test_the_librarys_accept_rule_is_refused(capsys):
    def library_rule(draft, p, q, generator=None):
        return accept_or_resample(draft, p, q, generator)[1]

    assert check_speculative_accept(library_rule) is False
    assert "calls the library's transformer_course.speculative.accept_or_resample" in (
        capsys.readouterr().out
    )
    assert check_speculative_accept(library_rule, library_ok=True) is True  # numbers


# ---------------------------------------------------- KIVI: keys per channel


def own_kivi(k, bits):
    lo, hi = k.amin(0), k.amax(0)
    step = (hi - lo) / (2**bits - 1)
    return ((k - lo) / step).round() * step + lo


def kivi_codes(k, bits):  # right, through integer codes and a (1, d) scale
    lo = k.min(dim=0, keepdim=True).values
    scale = (k.max(dim=0, keepdim=True).values - lo) / (2**bits - 1)
    codes = torch.round((k - lo) / scale).to(torch.uint8)
    return codes.float() * scale + lo


@param("answer", [own_kivi, kivi_codes])
def test_right_kivi_keys_pass(answer, quiet_check):
    assert quiet_check(check_kivi_keys, answer) is True


def test_the_kivi_reference_agrees_with_the_librarys_quantize():
    k = ch11._keys_group(torch.Generator().manual_seed(0))
    want, steps = ch11._kivi_reference(k, 4)
    assert torch.allclose(dequantize(*quantize(k, 4, 0)), want, atol=1e-6)
    assert bool(((want - k).abs() <= steps / 2 + 1e-6).all())  # the stated bound


KIVI_PITFALLS = [
    (pitfalls.kivi_keys_per_token, "how KIVI quantizes values"),
    (pitfalls.kivi_keys_one_scale, "one scale for the whole group"),
    (pitfalls.kivi_keys_symmetric, "a symmetric scale"),
    (pitfalls.kivi_keys_truncated, "truncated, not rounded"),
    (pitfalls.kivi_keys_2_to_the_bits, "one more than 4 bits hold"),
    (lambda k, bits: own_kivi(k, 8), "bits is ignored"),
    (lambda k, bits: own_kivi(k, bits) + 0.01, "on channel 4's grid"),
]


def test_kivi_keys_of_the_wrong_shape_are_a_shape_error():
    with pytest.raises(ShapeError):
        check_kivi_keys.strict(lambda k, bits: own_kivi(k, bits).T)


def test_the_librarys_quantize_is_refused(capsys):
    def library_kivi(k, bits):
        return dequantize(*quantize(k, bits, 0))

    assert check_kivi_keys(library_kivi) is False
    assert "calls the library's transformer_course.kv_quant.quantize" in (
        capsys.readouterr().out
    )


# --------------------------------------------------------------------- Chinese


@pytest.fixture
def chinese():
    set_language("zh")
    yield
    set_language(None)


CJK = range(0x4E00, 0xA000)


# every known-wrong answer of the three checks, with the words its message must hold
MISTAKES = [
    (check, wrong, message)
    for check, pitfalls in [
        (check_paged_gather, GATHER_PITFALLS),
        (check_speculative_accept, ACCEPT_PITFALLS),
        (check_kivi_keys, KIVI_PITFALLS),
    ]
    for wrong, message in pitfalls
]
MISTAKE_IDS = (
    [f"gather{i}" for i in range(len(GATHER_PITFALLS))]
    + [f"accept{i}" for i in range(len(ACCEPT_PITFALLS))]
    + [f"kivi{i}" for i in range(len(KIVI_PITFALLS))]
)


@param("check, wrong, message", MISTAKES, ids=MISTAKE_IDS)
def test_each_mistake_gets_its_own_message(check, wrong, message, capsys):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert len(printed.strip().splitlines()) == 2 and "Traceback" not in printed
    with pytest.raises(CheckError):
        check.strict(wrong)


@param("check, wrong, message", MISTAKES, ids=MISTAKE_IDS)
def test_each_mistake_speaks_chinese(check, wrong, message, chinese, capsys):
    assert check(wrong) is False
    text, hint = capsys.readouterr().out.strip().splitlines()
    assert text.startswith("✗ ") and any(ord(c) in CJK for c in text), text
    assert hint.startswith("提示：") and any(ord(c) in CJK for c in hint), hint


def test_a_pass_speaks_chinese(chinese, capsys):
    assert check_paged_gather(own_gather) and check_speculative_accept(own_accept)
    assert check_kivi_keys(own_kivi)
    printed = capsys.readouterr().out.splitlines()
    assert all(line.startswith("通过：") for line in printed), printed
