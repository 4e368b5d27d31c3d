"""KV cache, greedy decoding, beam search and sampling (chapters 6 and 7)."""

import pytest
import torch

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
from transformer_course.model import DecoderOnlyLM, TransformerConfig, make_model

param = pytest.mark.parametrize


def _model(norm_first=True, positional="sinusoidal"):
    cfg = TransformerConfig(
        src_vocab_size=20,
        tgt_vocab_size=12,
        d_model=32,
        n_heads=4,
        d_ff=64,
        dropout=0.0,
        max_len=16,
        norm_first=norm_first,
        positional=positional,
    )
    torch.manual_seed(0)
    model = make_model(cfg).eval()
    with torch.no_grad():  # sharper outputs that depend on the source, and an EOS
        model.decoder.out.weight *= 3.0  # (id 2) likely enough that rows end at
        model.decoder.out.bias[2] += 1.0  # different steps
    return model


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
    "norm_first, positional",
    [
        (False, "sinusoidal"),
        (True, "sinusoidal"),
        (True, "learned"),
        (True, "rope"),
        (True, "alibi"),
    ],
)
def test_cached_logits_equal_uncached(norm_first, positional):
    model = _model(norm_first, positional)
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


def test_greedy_with_cache_equals_without():
    model, src = _model(), torch.randint(4, 20, (3, 5))
    assert greedy_decode(model, src, 10) == greedy_decode(
        model, src, 10, use_cache=False
    )


@param("norm_first", [False, True])
def test_beam_one_equals_greedy(norm_first):
    model, src = _model(norm_first), torch.randint(4, 20, (16, 6))
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
def test_padded_batch_equals_one_at_a_time(decode):
    model = _model()
    rows = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    batch = torch.zeros(3, 5, dtype=torch.long)
    for i, r in enumerate(rows):
        batch[i, : len(r)] = torch.tensor(r)
    together = decode(model, batch)
    alone = [decode(model, torch.tensor([r]))[0] for r in rows]
    assert together == alone
    # known wrong: padding read as a real token (id 4 instead of pad 0) changes outputs
    assert decode(model, batch.masked_fill(batch == 0, 4)) != alone


def test_beam_search_finds_higher_likelihood_than_greedy_on_average():
    model, src = _model(), torch.randint(4, 20, (16, 5))

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


def test_length_penalty():
    assert length_penalty_gnmt(torch.tensor(7.0), 0.0) == 1.0
    assert length_penalty_gnmt(torch.tensor(7.0), 1.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(_model(), torch.tensor([[5]]), beam_size=0)


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


# -------------------------- filters that keep more than asked (issue 12, item 3)


def _kept(logits, **kw):
    return filter_logits(logits, **kw).isfinite()


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
