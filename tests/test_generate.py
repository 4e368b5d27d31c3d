"""The decoder-only LM serving a batch: left padding, positions from real tokens only,
KV-cached chunks, and ``decoding.generate`` (chapter 7), for every positional kind."""

import pytest
import torch

from transformer_course.decoding import generate, new_caches
from transformer_course.model import DecoderOnlyLM

param = pytest.mark.parametrize
KINDS = ["sinusoidal", "learned", "rope", "alibi"]
PROMPTS = [[5, 6, 7, 8, 9], [3], [4, 10, 11]]


def _lm(tiny_config, kind):
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


@param("kind", KINDS)
def test_left_padded_logits_equal_each_prompt_alone(kind, tiny_config):
    lm = _lm(tiny_config, kind)
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
    lm = _lm(tiny_config, kind)
    ids, keep = _left_pad(PROMPTS)
    T = ids.shape[1]
    batch = generate(lm, ids, 6, attention_mask=keep)
    assert batch.shape == (3, T + 6)
    for b, p in enumerate(PROMPTS):
        alone = generate(lm, torch.tensor([p]), 6)
        assert torch.equal(batch[b, T:], alone[0, len(p) :])


@param("kind", KINDS)
def test_chunk_on_top_of_a_cache_equals_the_full_forward(kind, tiny_config):
    lm = _lm(tiny_config, kind)
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
    lm = _lm(tiny_config, "sinusoidal")
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
    lm = _lm(tiny_config, "rope")
    ids, keep = _left_pad(PROMPTS)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(lm, ids, -1)
    with pytest.raises(ValueError, match="attention_mask"):
        generate(lm, ids, 2, attention_mask=keep[:, 1:])
    with pytest.raises(TypeError, match="attention_mask"):
        generate(lm, ids, 2, attention_mask=keep.long())


def test_generate_raises_on_right_padded_prompt(tiny_config):
    # Hugging Face transformers PR #19067: a right-padded prompt continues from the pad
    lm = _lm(tiny_config, "sinusoidal")
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
    lm = _lm(tiny_config, kind)
    ids, keep = _left_pad(PROMPTS)
    cached = generate(lm, ids, 6, attention_mask=keep)
    assert torch.equal(
        generate(lm, ids, 6, attention_mask=keep, use_cache=False), cached
    )


def test_generate_stops_on_any_of_several_eos_tokens(tiny_config):
    lm = _lm(tiny_config, "sinusoidal")
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
    lm = _lm(tiny_config, "sinusoidal")
    ids = torch.tensor([[5, 6, 7], [4, 10, 11]])  # same length: no attention_mask
    free = generate(lm, ids, 6)
    eos = int(free[0, 3])  # row 0 stops at once
    out = generate(lm, ids, 6, eos_token_id=eos)
    assert (out[0, 4:] == lm.cfg.pad_id).all()
    hits = (free[1, 3:] == eos).nonzero()
    n = int(hits[0]) + 1 if len(hits) else 6
    # row 1 goes on as it would alone
    assert torch.equal(out[1, 3 : 3 + n], free[1, 3 : 3 + n])
