"""decoding: greedy and beam search for the translator and the one batched
``generate`` loop of the decoder-only LM, cached against uncached, left padding,
stop tokens, and the KV cache (preallocated, grown, reset, reordered)."""

import functools
import math

import pytest
import torch

from transformer_course import decoding
from transformer_course.data import BOS_ID
from transformer_course.decoding import (
    KVCache,
    beam_search,
    filter_logits,
    generate,
    greedy_decode,
    length_penalty_gnmt,
    new_caches,
)
from transformer_course.kv_cache import ConcatKVCache
from transformer_course.model import DecoderOnlyLM, make_model

param = pytest.mark.parametrize


def _model(tiny_config, norm_first=True, positional="sinusoidal"):
    cfg = tiny_config(norm_first=norm_first, positional=positional)
    torch.manual_seed(0)
    model = make_model(cfg).eval()
    with torch.no_grad():  # sharper outputs that depend on the source, and an EOS
        model.decoder.out.weight *= 3.0  # (id 2) likely enough that rows end at
        model.decoder.out.bias[2] += 1.0  # different steps
    return model


class ForgetfulCache(KVCache):
    """Known wrong: writes each step's keys but forgets to advance ``length``."""

    def update(self, k, v):
        length = self.length
        out = super().update(k, v)
        self._length = length
        return out


class StaleResetCache(KVCache):
    """Known wrong: ``reset`` keeps the old length (the write pointer is not rewound)."""

    def reset(self):
        pass


def _lm(tiny_config, max_len=160):
    torch.manual_seed(0)
    return DecoderOnlyLM(tiny_config(max_len=max_len)).double().eval()


def _stepwise(lm, ids, caches, prompt=3):
    """Logits of ``ids`` fed as a ``prompt``-token chunk, then one token a step."""
    with torch.no_grad():
        out = [lm(ids[:, :prompt], caches=caches)]
        out += [
            lm(ids[:, t : t + 1], caches=caches) for t in range(prompt, ids.shape[1])
        ]
    return torch.cat(out, dim=1)  # (B, T, V)


def _matches_full(lm, ids, caches) -> bool:
    with torch.no_grad():
        full = lm(ids)
    return torch.allclose(_stepwise(lm, ids, caches), full, atol=1e-10)


TABLE = {
    (): {2: 0.4, 3: 0.35, 4: 0.25},
    (3,): {3: 0.5, 4: 0.45, 2: 0.05},
    (3, 3): {2: 0.1, 3: 0.45, 4: 0.45},
    (3, 4): {2: 1.0},
}


class _TableTranslator(torch.nn.Module):
    """Next-token probabilities looked up by the prefix after BOS. Ids: 0 padding,
    1 BOS, 2 EOS, 3 "A", 4 "B"; an unlisted prefix gives A, B, EOS a third each."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg  # the decoders read max_len and pad_id

    def encode(self, src):
        B = src.shape[0]
        return torch.zeros(B, 1, 1), torch.ones(B, 1, 1, 1, dtype=torch.bool)

    def decode(self, tgt, memory, mask, *, caches=None):
        assert caches is None  # the whole prefix every step
        rows = []
        for row in tgt.tolist():
            probs = torch.full((5,), 1e-9)
            for t, p in TABLE.get(
                tuple(row[1:]), {2: 1 / 3, 3: 1 / 3, 4: 1 / 3}
            ).items():
                probs[t] = p
            rows.append(probs.log())
        return torch.stack(rows)[:, None]  # (B, 1, V): the last position's logits


def _penalised_score(tokens: list[int], alpha: float) -> float:
    """log P(tokens) / lp(len(tokens)) under the table (tokens end with EOS)."""
    logp = sum(math.log(TABLE[tuple(tokens[:i])][t]) for i, t in enumerate(tokens))
    return logp / float(length_penalty_gnmt(torch.tensor(len(tokens)), alpha))


def _kept(logits, **kw):
    return filter_logits(logits, **kw).isfinite()


KINDS = ["sinusoidal", "learned", "rope", "alibi"]


PROMPTS = [[5, 6, 7, 8, 9], [3], [4, 10, 11]]


def _lm_generate(tiny_config, kind):
    torch.manual_seed(0)
    cfg = tiny_config(positional=kind, max_len=24)
    return DecoderOnlyLM(cfg).double().eval()  # float64: no near-ties in argmax


def _left_pad(prompts, pad_id=0):
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id)  # (B, T)
    keep = torch.zeros(len(prompts), T, dtype=torch.bool)  # True = real token
    for b, p in enumerate(prompts):
        ids[b, T - len(p) :] = torch.tensor(p)
        keep[b, T - len(p) :] = True
    return ids, keep


def test_kv_cache_appends_along_sequence_axis():
    cache = KVCache()
    assert cache.length == 0
    k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    cache.update(k, v)
    k_all, _v_all = cache.update(k[:, :, :1], v[:, :, :1])
    assert k_all.shape == (2, 3, 5, 5) and cache.length == 5
    torch.testing.assert_close(k_all[:, :, 4], k[:, :, 0])
    with pytest.raises(ValueError, match="k"):
        cache.update(torch.randn(2, 3, 1, 6), torch.randn(2, 3, 1, 6))  # wrong d_k


@param(
    "make",
    [lambda: KVCache(), lambda: KVCache(2), lambda: KVCache(40, grow=False)],
    ids=["default", "capacity 2, grows", "fixed 40"],
)
def test_preallocated_cache_logits_equal_the_full_forward(make, tiny_config):
    lm = _lm(tiny_config)
    ids = torch.randint(3, 12, (2, 40))
    assert _matches_full(lm, ids, [make() for _ in lm.layers])
    assert _matches_full(lm, ids, new_caches(lm, cache=ConcatKVCache))


def test_cache_that_forgets_to_advance_its_length_is_caught(tiny_config):
    lm = _lm(tiny_config)
    ids = torch.randint(3, 12, (2, 12))
    assert not _matches_full(lm, ids, [ForgetfulCache() for _ in lm.layers])


def test_kv_cache_writes_in_place_and_doubles_when_full():
    cache, concat = KVCache(4), ConcatKVCache()
    rows = torch.randn(2, 3, 20, 5)  # (B, H, S, d_k)
    storages = set()
    for t in range(20):
        k_all, v_all = cache.update(rows[:, :, t : t + 1], -rows[:, :, t : t + 1])
        k_ref, _ = concat.update(rows[:, :, t : t + 1], -rows[:, :, t : t + 1])
        storages.add(k_all.untyped_storage().data_ptr())
        assert cache.length == concat.length == t + 1
        torch.testing.assert_close(k_all, k_ref, rtol=0, atol=0)
        torch.testing.assert_close(v_all, -rows[:, :, : t + 1], rtol=0, atol=0)
    assert len(storages) == 4  # buffers of 4, 8, 16 and 32 tokens: 3 copies in all
    assert cache.k.shape == (2, 3, 20, 5)
    # known wrong: torch.cat makes a new tensor (a copy of everything) every step
    ptrs = {concat.update(rows[:, :, :1], rows[:, :, :1])[0].data_ptr() for _ in "ab"}
    assert len(ptrs) == 2


def test_kv_cache_overflow_raises_without_grow_and_grows_with_it():
    fixed = KVCache(4, grow=False)
    fixed.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    fixed.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))  # exactly full
    with pytest.raises(ValueError, match="holds 4 tokens"):
        fixed.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert fixed.length == 4  # the failed write changed nothing
    with pytest.raises(ValueError, match="holds 4 tokens"):  # a first chunk too long
        KVCache(4, grow=False).update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))
    grows = KVCache(4)
    k = torch.randn(1, 2, 9, 4)
    assert torch.equal(grows.update(k, k)[0], k)  # a first chunk past the capacity
    with pytest.raises(ValueError, match="capacity"):
        KVCache(0)
    with pytest.raises(TypeError, match="capacity: expected an int, got float"):
        KVCache(64.0)


def test_second_generation_after_reset_equals_a_fresh_one(tiny_config):
    lm = _lm(tiny_config)
    first, second = torch.randint(3, 12, (2, 30)), torch.randint(3, 12, (2, 9))
    caches = new_caches(lm, capacity=8)
    _stepwise(lm, first, caches)
    for cache in caches:
        cache.reset()
    assert caches[0].length == 0 and caches[0].k is None
    fresh = _stepwise(lm, second, new_caches(lm, capacity=8))
    torch.testing.assert_close(_stepwise(lm, second, caches), fresh, rtol=0, atol=0)
    for cache in caches:  # a reset cache takes another batch size too
        cache.reset()
    assert _matches_full(lm, second[:1], caches)
    # known wrong: a reset that keeps the write pointer attends to the old tokens
    stale = [StaleResetCache(8) for _ in lm.layers]
    _stepwise(lm, first, stale)
    for cache in stale:
        cache.reset()
    assert not torch.allclose(_stepwise(lm, second, stale), fresh)


def test_kv_cache_reorder_keeps_rows_even_when_repeated():
    cache = KVCache(8)
    k, v = torch.randn(4, 2, 5, 3), torch.randn(4, 2, 5, 3)
    cache.update(k, v)
    index = torch.tensor([2, 2, 0, 3])  # beam search: a parent kept twice, one dropped
    cache.reorder(index)
    torch.testing.assert_close(cache.k, k[index], rtol=0, atol=0)
    torch.testing.assert_close(cache.v, v[index], rtol=0, atol=0)
    new = torch.randn(4, 2, 1, 3)
    k_all, _ = cache.update(new, new)  # the next step writes after the kept rows
    torch.testing.assert_close(k_all, torch.cat([k[index], new], 2), rtol=0, atol=0)
    cache.reorder(torch.tensor([1]))  # fewer rows: a smaller buffer
    assert cache.k.shape == (1, 2, 6, 3)
    with pytest.raises(ValueError, match="index"):
        cache.reorder(torch.tensor([1]))  # row 1 of a one-row cache
    with pytest.raises(ValueError, match="index"):
        cache.reorder(torch.tensor([0.0]))


def test_kv_cache_rejects_tensors_unlike_the_cached_ones():
    cache = KVCache()
    cache.update(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match="float64"):
        cache.update(torch.randn(2, 3, 1, 5).double(), torch.randn(2, 3, 1, 5).double())
    with pytest.raises(ValueError, match=r"\(1, 3, 1, 5\)"):
        cache.update(torch.randn(1, 3, 1, 5), torch.randn(1, 3, 1, 5))
    with pytest.raises(TypeError, match="k, v"):
        cache.update([1.0], torch.randn(2, 3, 1, 5))


@param("beam_size", [1, 3])
def test_beam_search_with_the_preallocated_cache_equals_the_concat_one(
    beam_size, monkeypatch, tiny_config
):
    model, src = _model(tiny_config), torch.randint(4, 20, (8, 6))
    new = decoding.new_caches
    monkeypatch.setattr(decoding, "new_caches", functools.partial(new, capacity=2))
    grown = beam_search(model, src, 12, beam_size=beam_size)  # grows while reordering
    monkeypatch.setattr(
        decoding, "new_caches", functools.partial(new, cache=ConcatKVCache)
    )
    assert grown == beam_search(model, src, 12, beam_size=beam_size)
    monkeypatch.setattr(
        decoding, "new_caches", functools.partial(new, cache=ForgetfulCache)
    )
    assert beam_search(model, src, 12, beam_size=beam_size) != grown  # known wrong


def test_left_padded_generate_equals_recomputing_every_step(tiny_config):
    lm = _lm(tiny_config)
    prompts = [[5, 6, 7, 8, 9], [3], [4, 10, 11]]
    T = max(map(len, prompts))
    ids = torch.zeros(3, T, dtype=torch.long)
    keep = torch.zeros(3, T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, T - len(p) :], keep[b, T - len(p) :] = torch.tensor(p), True
    cached = generate(lm, ids, 100, attention_mask=keep)  # the cache grows past 64
    seq, mask = ids, keep
    with torch.no_grad():
        for _ in range(100):  # recompute: the whole sequence every step, no cache
            nxt = lm(seq, attention_mask=mask)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            mask = torch.cat([mask, torch.ones_like(nxt, dtype=torch.bool)], 1)
    assert torch.equal(cached, seq)


@param(
    "norm_first, positional",
    [
        (False, "sinusoidal"),
        (True, "sinusoidal"),
        (True, "learned"),
        (True, "rope"),
        (True, "alibi"),
    ],
)
def test_cached_logits_equal_uncached(norm_first, positional, tiny_config):
    model = _model(tiny_config, norm_first, positional)
    src, tgt = torch.randint(4, 20, (2, 6)), torch.randint(3, 12, (2, 7))
    full = model(src, tgt)
    memory, mask = model.encode(src)
    caches = new_caches(model)
    steps = torch.cat(
        [
            model.decode(tgt[:, i : i + 1], memory, mask, caches=caches)
            for i in range(7)
        ],
        1,
    )
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    # known wrong: a fresh cache each step forgets the prefix and puts every token at
    # position 0 (pitfall P16)
    wrong = torch.cat(
        [
            model.decode(tgt[:, i : i + 1], memory, mask, caches=new_caches(model))
            for i in range(7)
        ],
        1,
    )
    assert (wrong - full)[:, 1:].abs().max() > 1e-3


def test_lm_cached_logits_equal_uncached(tiny_config):
    lm = DecoderOnlyLM(tiny_config()).eval()
    ids = torch.randint(3, 12, (2, 8))
    caches = new_caches(lm)
    prompt = lm(ids[:, :4], caches=caches)  # a 4-token prompt, then one at a time
    rest = [lm(ids[:, i : i + 1], caches=caches) for i in range(4, 8)]
    torch.testing.assert_close(
        torch.cat([prompt, *rest], 1), lm(ids), atol=1e-5, rtol=1e-5
    )


def test_greedy_with_cache_equals_without(tiny_config):
    model, src = _model(tiny_config), torch.randint(4, 20, (3, 5))
    assert greedy_decode(model, src, 10) == greedy_decode(
        model, src, 10, use_cache=False
    )


def _pad_loving(tiny_config):
    """A translator whose most likely next token is often the padding id (0)."""
    model = _model(tiny_config)
    with torch.no_grad():
        model.decoder.out.bias[model.cfg.pad_id] += 4.0
    return model


def test_greedy_never_emits_padding_so_cached_equals_uncached(tiny_config):
    # Regression: a pad id chosen mid-sentence was hidden as a key when the decoder
    # re-read the prefix (use_cache=False) but not from the cache: the paths parted.
    model, src = _pad_loving(tiny_config), torch.randint(4, 20, (3, 5))
    logits = model.decode(torch.full((3, 1), BOS_ID), *model.encode(src))[:, -1]
    assert (logits.argmax(-1) == model.cfg.pad_id).any()  # the known-wrong pull
    cached = greedy_decode(model, src, 10)
    assert cached == greedy_decode(model, src, 10, use_cache=False)
    assert all(len(row) == 10 for row in cached)  # no row cut short by a pad


def test_beam_search_never_emits_padding_so_cached_equals_uncached(tiny_config):
    model, src = _pad_loving(tiny_config), torch.randint(4, 20, (3, 5))
    cached = beam_search(model, src, 10, beam_size=3)
    assert cached == beam_search(model, src, 10, beam_size=3, use_cache=False)
    assert all(len(row) == 10 for row in cached)


@param("norm_first", [False, True])
def test_beam_one_equals_greedy(norm_first, tiny_config):
    model, src = _model(tiny_config, norm_first), torch.randint(4, 20, (16, 6))
    with torch.no_grad():  # EOS likelier still, so that some rows stop early
        model.decoder.out.bias[2] += 1.0
    greedy = greedy_decode(model, src, 10)
    assert beam_search(model, src, 10, beam_size=1, length_penalty=0.6) == greedy
    assert any(len(g) < 10 for g in greedy)  # some rows stop early: EOS is handled


@param(
    "decode",
    [
        lambda m, s: greedy_decode(m, s, 10),
        lambda m, s: beam_search(m, s, 10, beam_size=3),
    ],
)
def test_padded_batch_equals_one_at_a_time(decode, tiny_config):
    model = _model(tiny_config)
    rows = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    batch = torch.zeros(3, 5, dtype=torch.long)
    for i, r in enumerate(rows):
        batch[i, : len(r)] = torch.tensor(r)
    together = decode(model, batch)
    alone = [decode(model, torch.tensor([r]))[0] for r in rows]
    assert together == alone
    # known wrong: padding read as a real token (id 4 instead of pad 0) changes outputs
    assert decode(model, batch.masked_fill(batch == 0, 4)) != alone


def test_beam_search_finds_higher_likelihood_than_greedy_on_average(tiny_config):
    model, src = _model(tiny_config), torch.randint(4, 20, (16, 5))

    def logp(outs):
        tgt = [[BOS_ID, *o, 2] for o in outs]
        total = 0.0
        for s, t in zip(src, tgt):
            logits = model(s[None], torch.tensor([t[:-1]]))
            total += logits.log_softmax(-1)[0, range(len(t) - 1), t[1:]].sum().item()
        return total

    greedy = logp(greedy_decode(model, src, 12))
    beam = logp(beam_search(model, src, 12, beam_size=4, length_penalty=0.0))
    assert beam >= greedy - 1e-4


def test_length_penalty(tiny_config):
    assert length_penalty_gnmt(torch.tensor(7.0), 0.0) == 1.0
    assert length_penalty_gnmt(torch.tensor(7.0), 1.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(_model(tiny_config), torch.tensor([[5]]), beam_size=0)
    with pytest.raises(TypeError, match="beam_size"):
        beam_search(_model(tiny_config), torch.tensor([[5]]), beam_size=2.0)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(_model(tiny_config), torch.tensor([[5]]), length_penalty=-0.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(_model(tiny_config), torch.tensor([[5]]), -1)


def test_beam_search_with_cache_equals_without(tiny_config):
    model, src = _model(tiny_config), torch.randint(4, 20, (4, 6))
    cached = beam_search(model, src, 10, beam_size=3)
    assert beam_search(model, src, 10, beam_size=3, use_cache=False) == cached


def test_translators_take_special_ids_from_arguments_and_config(tiny_config):
    model, src = _model(tiny_config), torch.randint(4, 20, (6, 5))
    plain = greedy_decode(model, src, 10)
    eos = 5  # another end of sentence: every row stops at its first 5
    cut = greedy_decode(model, src, 10, eos_token_id=[2, eos])
    for p, c in zip(plain, cut):
        assert c == (p[: p.index(eos)] if eos in p else p)
    assert cut != plain  # known wrong: the default EOS alone does not cut them
    assert beam_search(model, src, 10, beam_size=1, eos_token_id=[2, eos]) == cut
    # a different start token changes the translations: it is really read
    assert greedy_decode(model, src, 10, bos_token_id=3) != plain


def test_beam_search_finished_hypothesis_keeps_its_slot(tiny_config):
    # ParlAI #2058, HF #16095: the convention is pinned. With K = 2, "EOS" ends at
    # step 1 and keeps a slot, so only one hypothesis stays live and "A B" (third at
    # step 2 on raw log-probability) is dropped; a search keeping K live hypotheses
    # finishes "A B EOS", which wins under a length penalty of 3.
    model = _TableTranslator(tiny_config(max_len=8, pad_id=0))
    src, alpha = torch.zeros(1, 1, dtype=torch.long), 3.0
    kw = {"length_penalty": alpha, "use_cache": False}
    assert beam_search(model, src, 4, beam_size=2, **kw) == [[]]  # "EOS" alone
    assert _penalised_score([3, 4, 2], alpha) > _penalised_score([2], alpha)
    # known wrong for the other convention: with K = 3, "A B" stays live and wins
    assert beam_search(model, src, 4, beam_size=3, **kw) == [[3, 4]]


def test_filter_logits_top_k_and_top_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = filter_logits(logits, top_p=0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    assert filter_logits(logits, top_p=0.85).isfinite().tolist() == [
        [True, True, True, False]
    ]
    assert filter_logits(logits, top_k=1).isfinite().tolist() == [
        [True, False, False, False]
    ]
    assert filter_logits(logits, top_p=0.1).isfinite().sum() == 1  # best token survives


def test_generate_temperature_zero_and_top_k_one_are_greedy(tiny_config):
    lm = DecoderOnlyLM(tiny_config()).eval()
    prompt = torch.tensor([[4, 5, 6]])
    greedy = generate(lm, prompt, 5)  # temperature 0 by default
    assert greedy.shape == (1, 8)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(
        generate(lm, prompt, 5, temperature=1.0, top_k=1, generator=g), greedy
    )
    hot = generate(
        lm, prompt, 5, temperature=5.0, generator=torch.Generator().manual_seed(1)
    )
    assert not torch.equal(hot, greedy)  # sampling really samples
    with pytest.raises(ValueError, match="top_p"):
        generate(lm, prompt, 2, top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        generate(lm, prompt, 2, temperature=-1.0)


def test_cache_cannot_grow_past_max_len(tiny_config):
    lm = DecoderOnlyLM(tiny_config(max_len=6)).eval()
    caches = new_caches(lm)
    lm(torch.randint(3, 12, (1, 6)), caches=caches)  # exactly max_len: fine
    with pytest.raises(ValueError, match="after 6 cached tokens"):
        lm(torch.tensor([[4]]), caches=caches)


def test_filter_keeps_exactly_top_k_with_ties():
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert _kept(tied, top_k=1).tolist() == [[False, True, False, False]]  # argmax's
    # many ties: integer logits in a small range
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (64, 10), generator=gen).float()
    for k in range(1, 11):
        kept = _kept(logits, top_k=k)
        assert (kept.sum(-1) == k).all(), k
        # the survivors are the k best, ties broken by the lower index like topk/argmax
        order = logits.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        assert kept.gather(-1, order).all()
    assert torch.equal(_kept(logits, top_k=1).float().argmax(-1), logits.argmax(-1))
    # known wrong: "every logit >= the k-th value" keeps the ties (the old filter)
    kth = logits.topk(1, dim=-1).values[:, -1:]
    assert ((logits >= kth).sum(-1) > 1).any()


@param("seed", range(20))
def test_filter_top_k_one_sampling_is_greedy_for_any_seed(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 2, (8, 6), generator=gen).float()  # ties in every row
    probs = torch.softmax(filter_logits(logits, top_k=1), -1)
    drawn = torch.multinomial(probs, 1, generator=gen)[:, 0]
    assert torch.equal(drawn, logits.argmax(-1))


@param("V", [3, 4, 5, 7, 10])
def test_filter_nucleus_boundary_is_pinned(V):
    logits = torch.zeros(1, V)  # V equal tokens, each of probability 1 / V
    for j in range(1, V + 1):  # mass j / V is reached by exactly j tokens
        assert _kept(logits, top_p=j / V).sum().item() == j, (V, j)
    if V == 4:
        kept = [_kept(logits, top_p=p).sum().item() for p in (0.25, 0.5, 0.75, 1.0)]
        assert kept == [1, 2, 3, 4]
    # just above a boundary needs one more token
    assert _kept(logits, top_p=1 / V + 1e-3).sum().item() == 2


def test_filter_top_k_then_top_p_and_bad_arguments():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top_k=2 renormalises to 4/7, 3/7: top_p 0.5 keeps one, top_p 0.6 keeps two
    assert _kept(logits, top_k=2, top_p=0.5).tolist() == [[True, False, False, False]]
    assert _kept(logits, top_k=2, top_p=0.6).tolist() == [[True, True, False, False]]
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(logits, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(logits, top_p=0.0)


@param("kind", KINDS)
def test_left_padded_logits_equal_each_prompt_alone(kind, tiny_config):
    lm = _lm_generate(tiny_config, kind)
    ids, keep = _left_pad(PROMPTS)
    with torch.no_grad():
        batch = lm(ids, attention_mask=keep)  # (B, T, V)
        for b, p in enumerate(PROMPTS):
            alone = lm(torch.tensor([p]))[0]  # (len(p), V)
            torch.testing.assert_close(batch[b, -len(p) :], alone)
        # known wrong: without the mask the padding is read as tokens
        wrong = lm(ids)[1, -1] - lm(torch.tensor([PROMPTS[1]]))[0, -1]
    assert wrong.abs().max() > 1e-3


@param("kind", KINDS)
def test_left_padded_batch_generates_what_each_prompt_alone_does(kind, tiny_config):
    lm = _lm_generate(tiny_config, kind)
    ids, keep = _left_pad(PROMPTS)
    T = ids.shape[1]
    batch = generate(lm, ids, 6, attention_mask=keep)
    assert batch.shape == (3, T + 6)
    for b, p in enumerate(PROMPTS):
        alone = generate(lm, torch.tensor([p]), 6)
        assert torch.equal(batch[b, T:], alone[0, len(p) :])


@param("kind", KINDS)
def test_chunk_on_top_of_a_cache_equals_the_full_forward(kind, tiny_config):
    lm = _lm_generate(tiny_config, kind)
    ids = torch.randint(1, 12, (2, 10))
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, :3] = False  # row 1 is left-padded
    with torch.no_grad():
        full = lm(ids, attention_mask=keep)  # (B, 10, V)
        caches = new_caches(lm)
        steps = [
            lm(ids[:, :4], attention_mask=keep[:, :4], caches=caches),
            lm(ids[:, 4:9], attention_mask=keep[:, :9], caches=caches),  # 5 at once
            lm(ids[:, 9:], attention_mask=keep, caches=caches),
        ]
        # known wrong: the chunk without the cache sees no past and starts at 0
        wrong = lm(ids[:, 4:9], attention_mask=keep[:, 4:9])
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert (wrong - full[:, 4:9]).abs().max() > 1e-3


def test_generate_stops_each_row_at_eos_and_pads_after_it(tiny_config):
    lm = _lm_generate(tiny_config, "sinusoidal")
    ids, keep = _left_pad(PROMPTS)
    T = ids.shape[1]
    free = generate(lm, ids, 8, attention_mask=keep)
    eos = int(free[0, T])  # row 0's first new token plays the end of sequence
    out = generate(lm, ids, 8, attention_mask=keep, eos_token_id=eos)
    n_new = out.shape[1] - T
    for b in range(3):
        row, ref = out[b, T:], free[b, T : T + n_new]
        hits = (ref == eos).nonzero()
        n = int(hits[0]) + 1 if len(hits) else n_new
        assert torch.equal(row[:n], ref[:n])
        assert (row[n:] == lm.cfg.pad_id).all()
    assert out[0, T] == eos and (out[0, T + 1 :] == lm.cfg.pad_id).all()
    # every row finished: generation stops at once
    one = generate(lm, ids[:1], 8, attention_mask=keep[:1], eos_token_id=eos)
    assert one.shape == (1, T + 1)


def test_generate_rejects_bad_arguments(tiny_config):
    lm = _lm_generate(tiny_config, "rope")
    ids, keep = _left_pad(PROMPTS)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(lm, ids, -1)
    with pytest.raises(ValueError, match="attention_mask"):
        generate(lm, ids, 2, attention_mask=keep[:, 1:])
    with pytest.raises(TypeError, match="attention_mask"):
        generate(lm, ids, 2, attention_mask=keep.long())


def test_generate_raises_on_right_padded_prompt(tiny_config):
    # Hugging Face transformers PR #19067: a right-padded prompt continues from the pad
    lm = _lm_generate(tiny_config, "sinusoidal")
    ids, keep = _left_pad(PROMPTS)
    right = torch.zeros_like(keep)
    for b, p in enumerate(PROMPTS):
        right[b, : len(p)] = True  # the same prompts, padded on the right
    with pytest.raises(
        ValueError, match=r"attention_mask: expected left padding.*\[1, 2\]"
    ):
        generate(lm, ids, 2, attention_mask=right)
    generate(lm, ids, 2, attention_mask=keep)  # left padding: accepted


@param("kind", KINDS)
def test_generate_without_cache_equals_with_cache(kind, tiny_config):
    lm = _lm_generate(tiny_config, kind)
    ids, keep = _left_pad(PROMPTS)
    cached = generate(lm, ids, 6, attention_mask=keep)
    assert torch.equal(
        generate(lm, ids, 6, attention_mask=keep, use_cache=False), cached
    )


def test_generate_stops_on_any_of_several_eos_tokens(tiny_config):
    lm = _lm_generate(tiny_config, "sinusoidal")
    ids, keep = _left_pad(PROMPTS)
    T = ids.shape[1]
    free = generate(lm, ids, 8, attention_mask=keep)
    first = {int(free[b, T]) for b in range(3)}  # every row's first new token
    out = generate(lm, ids, 8, attention_mask=keep, eos_token_id=first)
    assert out.shape == (3, T + 1)  # every row stopped at its first token
    one = generate(lm, ids, 8, attention_mask=keep, eos_token_id=int(free[0, T]))
    assert one.shape[1] > T + 1 or len(first) == 1  # known wrong: one id stops fewer
    with pytest.raises(ValueError, match="eos_token_id"):
        generate(lm, ids, 2, eos_token_id=[])
    with pytest.raises(ValueError, match="eos_token_id"):
        generate(lm, ids, 2, eos_token_id=[3, -1])


def test_generate_without_mask_pads_finished_rows_and_keeps_the_others(tiny_config):
    lm = _lm_generate(tiny_config, "sinusoidal")
    ids = torch.tensor([[5, 6, 7], [4, 10, 11]])  # same length: no attention_mask
    free = generate(lm, ids, 6)
    eos = int(free[0, 3])  # row 0 stops at once
    out = generate(lm, ids, 6, eos_token_id=eos)
    assert (out[0, 4:] == lm.cfg.pad_id).all()
    hits = (free[1, 3:] == eos).nonzero()
    n = int(hits[0]) + 1 if len(hits) else 6
    # row 1 goes on as it would alone
    assert torch.equal(out[1, 3 : 3 + n], free[1, 3 : 3 + n])


def test_generate_runs_without_autograd_and_returns_a_normal_tensor(tiny_config):
    """``generate`` decodes under ``torch.inference_mode``; what it returns is an
    ordinary tensor (an inference tensor refuses in-place changes outside the mode)."""
    lm = _lm_generate(tiny_config, "rope")
    modes = []
    lm.register_forward_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    out = generate(lm, torch.tensor([[1, 2, 3]]), 4)
    assert modes == [True] * 4  # known wrong: torch.no_grad alone gives False
    assert not out.is_inference()
    out[0, 0] = 5  # known wrong: an inference tensor raises RuntimeError here
    assert out[0, 0] == 5


def test_generate_looks_the_rotary_rows_up_once_a_forward(tiny_config, monkeypatch):
    """The layers share one ``RotaryEmbedding``; under ``generate``'s inference mode
    its cos/sin rows are still looked up once a forward, not once per layer for the
    queries and again for the keys (inference tensors have no version counter: the
    positions come from ``position_ids``, an ordinary tensor)."""
    torch.manual_seed(0)
    lm = DecoderOnlyLM(tiny_config(positional="rope", n_layers=3, max_len=24)).eval()
    rotary = lm.layers[0].self_attn.rotary
    assert all(layer.self_attn.rotary is rotary for layer in lm.layers)
    lookups = []
    table = type(rotary)._table  # called by every lookup that misses the last rows
    monkeypatch.setattr(
        type(rotary),
        "_table",
        lambda self, n, dev: lookups.append(n) or table(self, n, dev),
    )
    generate(lm, torch.tensor([[1, 2, 3]]), 4)
    assert len(lookups) == 4  # known wrong: 4 forwards x 3 layers x (q, k) = 24
    lookups.clear()
    with torch.inference_mode():  # a caller's inference tensor is looked up each time
        p = torch.arange(3)
        q = torch.randn(1, 4, 3, rotary.d_k)
        rotary(q, q, p, p)
    assert len(lookups) == 2
