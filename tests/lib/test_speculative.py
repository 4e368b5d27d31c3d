"""speculative: greedy speculative decoding equals plain greedy ``generate`` token for
token on 20 prompts of different kinds with two drafters (and not without the cache
rollback); the sampling rule keeps the model's distribution by a chi-square test
(and a rule without the residual distribution fails it); drafters; bad inputs."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course.decoding import generate
from transformer_course.kv_cache import KVCache
from transformer_course.model import DecoderOnlyLM, output_projection
from transformer_course.speculative import (
    ModelDrafter,
    PromptLookupDrafter,
    accept_or_resample,
    first_layers,
    speculative_generate,
)

param = pytest.mark.parametrize
V, MAX_LEN, N_NEW = 40, 48, 8


def _model(tiny_config, seed=0, **kw):
    cfg = tiny_config(
        tgt_vocab_size=kw.pop("vocab", V),
        max_len=MAX_LEN,
        n_layers=3,
        n_kv_heads=2,
        positional="rope",
        norm="rms",
        activation="swiglu",
        bias=False,
        **kw,
    )
    torch.manual_seed(seed)
    return DecoderOnlyLM(cfg).eval()


def _twenty_prompts():
    """Prompts of different kinds: random, repeating, constant, a single token, a
    copy of themselves, one that reaches max_len."""
    g = torch.Generator().manual_seed(7)

    def rand(n):
        return torch.randint(1, V, (n,), generator=g).tolist()

    prompts = [rand(n) for n in (1, 2, 5, 9, 17, 30)]  # random
    prompts += [rand(3) * 4, rand(2) * 6, rand(5) * 3]  # repeating patterns
    prompts += [[7] * 6, [3] * 20]  # constant runs
    prompts += [x + x for x in (rand(4), rand(8), rand(12))]  # copies of themselves
    prompts += [rand(6) + [5, 6, 7] + rand(4) + [5, 6, 7], [1, 2, 3, 1, 2, 4, 1, 2]]
    prompts += [rand(MAX_LEN - N_NEW), rand(MAX_LEN - N_NEW - 1)]  # to max_len
    prompts += [[9], list(range(1, 11))]
    assert len(prompts) == 20
    return prompts


@param("k", [1, 3, 6])
def test_greedy_speculative_equals_greedy_token_for_token(tiny_config, k):
    model = _model(tiny_config)
    drafters = [PromptLookupDrafter(), ModelDrafter(first_layers(model, 1))]
    accepted = 0
    for prompt in _twenty_prompts():
        ids = torch.tensor([prompt])
        ref = generate(model, ids, N_NEW)
        for drafter in drafters:
            out, stats = speculative_generate(model, ids, N_NEW, drafter, k=k)
            assert torch.equal(out, ref), (prompt, drafter)
            assert stats.new_tokens == N_NEW == stats.accepted + stats.passes
            assert 0 <= stats.accepted <= stats.drafted
            accepted += stats.accepted
    assert accepted > 0  # drafts were kept, so the passes verified several tokens


def test_a_stop_token_ends_speculative_output_as_it_ends_generate(tiny_config):
    model = _model(tiny_config)
    for prompt in _twenty_prompts()[:8]:
        ids = torch.tensor([prompt])
        eos = generate(model, ids, N_NEW)[
            0, len(prompt) + 2
        ].item()  # the third new one
        ref = generate(model, ids, N_NEW, eos_token_id=eos)
        out, _ = speculative_generate(
            model, ids, N_NEW, PromptLookupDrafter(), eos_token_id=eos
        )
        n = ref.shape[1]  # generate stops when the row is done
        assert torch.equal(out, ref[:, :n]) and out[0, -1] == eos


def test_without_the_cache_rollback_the_output_differs(tiny_config, monkeypatch):
    model = _model(tiny_config)
    monkeypatch.setattr(KVCache, "crop", lambda self, length: None)  # known wrong
    differs = 0
    for prompt in _twenty_prompts():
        ids = torch.tensor([prompt])
        try:
            out, _ = speculative_generate(model, ids, N_NEW, PromptLookupDrafter())
        except ValueError:  # positions past max_len: also a failure to match
            differs += 1
            continue
        differs += not torch.equal(out, generate(model, ids, N_NEW))
    assert differs > 0  # (4 of the 20 with these seeds)


def _chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit, bins expecting under 5 draws merged."""
    expected = probs.double() * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(float(len(obs) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))  # P(chi2_df >= stat)


def _p_and_q(tiny_config):
    """The next-token distributions after one prompt of a tiny model (p) and of a
    different tiny model (q), sharpened by temperature 0.5 so they differ."""
    target, draft = _model(tiny_config, 0, vocab=12), _model(tiny_config, 1, vocab=12)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        p = F.softmax(target(ids)[0, -1] / 0.5, dim=-1)
        q = F.softmax(draft(ids)[0, -1] / 0.5, dim=-1)
    return p, q


def _resample_from_p(draft, p, q, generator=None):
    """Known wrong: accepts by min(1, p/q) but on rejection draws from p itself, not
    from norm(max(0, p - q)): tokens q over-proposes come out too often."""
    kept, _ = accept_or_resample(draft, p, q, generator)
    drawn = torch.multinomial(p, 1, generator=generator)[:, 0]
    return kept, torch.where(kept, draft, drawn)


def test_the_accept_rule_keeps_the_models_distribution(tiny_config):
    p, q = _p_and_q(tiny_config)
    assert 0.5 * (p - q).abs().sum() > 0.3  # the drafter is a poor guess of p
    n = 20000
    g = torch.Generator().manual_seed(0)
    draft = torch.multinomial(q, n, replacement=True, generator=g)  # (n,) drafts ~ q
    P, Q = p.expand(n, -1), q.expand(n, -1)
    kept, token = accept_or_resample(draft, P, Q, g)
    assert _chi_square_p_value(torch.bincount(token, minlength=12), p) > 1e-3
    rate = kept.float().mean()  # the acceptance rate is sum_x min(p, q)
    assert abs(rate - torch.minimum(p, q).sum()) < 0.02
    _, wrong = _resample_from_p(draft, P, Q, g)
    assert _chi_square_p_value(torch.bincount(wrong, minlength=12), p) < 1e-6
    # known wrong too: keeping every draft gives the drafter's distribution q
    assert _chi_square_p_value(torch.bincount(draft, minlength=12), p) < 1e-6


def test_a_one_hot_draft_is_kept_with_probability_p(tiny_config):
    p, _ = _p_and_q(tiny_config)
    n = 4000
    g = torch.Generator().manual_seed(1)
    draft = torch.full((n,), int(p.argmin()), dtype=torch.long)  # a certain drafter
    kept, token = accept_or_resample(draft, p.expand(n, -1), None, g)
    assert abs(kept.float().mean() - p.min()) < 0.02
    assert _chi_square_p_value(torch.bincount(token, minlength=12), p) > 1e-3


def test_sampled_speculative_first_tokens_follow_the_model(tiny_config):
    target = _model(tiny_config, 0, vocab=12)
    drafter = ModelDrafter(_model(tiny_config, 1, vocab=12), temperature=0.5)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        p = F.softmax(target(ids)[0, -1] / 0.5, dim=-1)
    g = torch.Generator().manual_seed(2)
    first = []
    for _ in range(300):
        out, _ = speculative_generate(
            target, ids, 2, drafter, k=1, temperature=0.5, generator=g
        )
        first.append(int(out[0, 5]))
    counts = torch.bincount(torch.tensor(first), minlength=12)
    assert _chi_square_p_value(counts, p) > 1e-3


def test_prompt_lookup_copies_what_followed_the_first_occurrence():
    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=1)
    assert drafter.propose([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3) == ([3, 9, 1], None)
    assert drafter.propose([8, 1, 2, 3, 9, 1, 2], 8) == ([3, 9, 1, 2], None)
    assert drafter.propose([5, 6, 7, 8], 3) == ([], None)  # nothing recurs
    assert drafter.propose([5, 6, 7, 5], 4) == ([6, 7, 5], None)  # 1-gram fallback
    with pytest.raises(ValueError, match="max_ngram: expected an int >= 2"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_prompt_lookup_needs_two_matching_tokens_by_default():
    """A lone recurring token proposes nothing (vLLM's prompt_lookup_min); a 2-gram
    does, and a 3-gram is preferred to it."""
    drafter = PromptLookupDrafter()
    assert (drafter.max_ngram, drafter.min_ngram) == (3, 2)
    assert drafter.propose([5, 6, 7, 5], 4) == ([], None)
    assert drafter.propose([5, 6, 7, 8, 6, 7], 2) == ([8, 6], None)
    # "1 2" first recurs at 0, "0 1 2" at 3: the longer match decides
    assert drafter.propose([1, 2, 4, 0, 1, 2, 9, 0, 1, 2], 1) == ([9], None)


def test_first_layers_share_the_models_weights(tiny_config):
    model = _model(tiny_config)
    shallow = first_layers(model, 2)
    assert shallow.cfg.n_layers == 2 and shallow.layers[1] is model.layers[1]
    assert shallow.out.weight is model.out.weight and len(model.layers) == 3
    with pytest.raises(ValueError, match="at most the model's 3, got 4"):
        first_layers(model, 4)


def test_kv_cache_crop_keeps_a_prefix():
    cache = KVCache(8)
    k = torch.arange(12.0).view(1, 1, 6, 2)
    cache.update(k, k)
    cache.crop(2)
    keys, _ = cache.update(k[:, :, 4:], k[:, :, 4:])
    assert torch.equal(keys, torch.cat([k[:, :, :2], k[:, :, 4:]], dim=2))
    with pytest.raises(ValueError, match="at most the 4 cached tokens, got 5"):
        cache.crop(5)
    with pytest.raises(ValueError, match="length: expected an int >= 0"):
        cache.crop(-1)


def test_bad_inputs_raise_clear_errors(tiny_config):
    model = _model(tiny_config)
    drafter = PromptLookupDrafter()
    with pytest.raises(ValueError, match=r"one prompt of shape \(1, T\)"):
        speculative_generate(model, torch.ones(2, 3, dtype=torch.long), 2, drafter)
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        speculative_generate(model, torch.ones(1, 3, dtype=torch.long), 2, drafter, k=0)
    with pytest.raises(TypeError, match="ids: expected an integer"):
        speculative_generate(model, torch.ones(1, 3), 2, drafter)
    with pytest.raises(ValueError, match="temperature: expected a number >= 0"):
        ModelDrafter(model, temperature=-1.0)


def _copy_run(model, **kw):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5]])
    return ids, *speculative_generate(model, ids, 16, PromptLookupDrafter(), k=4, **kw)


def test_the_first_pass_reads_the_prompt_and_checks_its_drafts(tiny_config):
    model = _model(tiny_config)
    widths = []  # new tokens of each call of the model
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(args[0].shape[1]), with_kwargs=True
    )
    try:
        ids, out, stats = _copy_run(model, record=True)
    finally:
        hook.remove()
    assert torch.equal(out, generate(model, ids, 16))
    first = stats.steps[0]
    assert first.start == ids.shape[1] and len(first.draft) > 0  # the prompt recurs
    assert widths[0] == ids.shape[1] + len(first.draft)  # no pass for the prompt alone
    assert len(widths) == stats.passes == len(stats.steps)
    assert widths[1:] == [1 + len(st.draft) for st in stats.steps[1:]]


@param("temperature", [0.0, 1.0])
def test_the_record_rebuilds_the_output_and_changes_nothing(tiny_config, temperature):
    model = _model(tiny_config)
    g = torch.Generator().manual_seed(3)
    ids, out, stats = _copy_run(
        model, record=True, temperature=temperature, generator=g
    )
    g = torch.Generator().manual_seed(3)
    _, plain, plain_stats = _copy_run(model, temperature=temperature, generator=g)
    assert plain_stats.steps is None  # not recorded unless asked for
    assert torch.equal(plain, out)  # recording changes nothing
    tokens, start = ids[0].tolist(), ids.shape[1]
    for st in stats.steps:
        assert st.start == len(tokens) and 0 <= st.accepted <= len(st.draft)
        tokens += [*st.draft[: st.accepted], st.token]
    assert tokens[: out.shape[1]] == out[0].tolist()
    assert len(tokens) - start >= stats.new_tokens  # more only after a stop token
    assert len(stats.steps) == stats.passes
    assert sum(len(st.draft) for st in stats.steps) == stats.drafted
    assert sum(st.accepted for st in stats.steps) == stats.accepted
    with pytest.raises(TypeError, match="record: expected True or False, got 'yes'"):
        _copy_run(model, record="yes")


def test_the_output_projection_of_a_few_rows_is_the_linear_layer(monkeypatch):
    torch.manual_seed(0)
    out = torch.nn.Linear(24, 300)
    products = []  # torch.mm's calls: the (V, D) @ (D, N) layout used
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: products.append(a.shape) or mm(a, b))
    for shape in [(1, 1), (1, 2), (2, 3), (1, 5), (4, 4), (1, 17), (3, 9)]:
        x = torch.randn(*shape, 24)
        products.clear()
        y = output_projection(out, x)
        assert y.shape == (*shape, 300) and y.is_contiguous()
        torch.testing.assert_close(y, out(x), rtol=1e-5, atol=1e-5)
        assert products == ([(300, 24)] if 1 < x[..., 0].numel() <= 16 else [])
    seen = []  # a hooked head (a trace) is called as a module, its hook runs
    out.register_forward_hook(lambda module, args, y: seen.append(y.shape))
    products.clear()
    output_projection(out, torch.randn(1, 5, 24))
    assert seen == [(1, 5, 300)] and products == []
