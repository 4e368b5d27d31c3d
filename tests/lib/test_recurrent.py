"""The recurrent baselines of chapter 1: the copy task, the LSTM encoder-decoder with and
without additive attention, greedy decoding and the accuracy measure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_course.additive import additive_attention
from transformer_course.data import BOS_ID
from transformer_course.model import make_model
from transformer_course.recurrent import (
    FIRST_SYMBOL,
    LSTMSeq2Seq,
    copy_accuracy,
    copy_batch,
    copy_batches,
    greedy_copy,
)

V = FIRST_SYMBOL + 6


param = pytest.mark.parametrize


class _Oracle(nn.Module):
    """Predicts the right next symbol (the source, shifted) when ``right``."""

    def __init__(self, right: bool):
        super().__init__()
        self.right = right

    def forward(self, src, tgt_in):
        answer = src if self.right else src.flip(1)
        return nn.functional.one_hot(answer, V).float()  # (B, L, V)


def test_copy_batch_target_is_bos_then_source():
    src, tgt = copy_batch(4, 7, V, generator=torch.Generator().manual_seed(0))
    assert src.shape == (4, 7) and tgt.shape == (4, 8)
    assert src.dtype == torch.long
    assert (tgt[:, 0] == BOS_ID).all() and torch.equal(tgt[:, 1:], src)
    assert src.min() >= FIRST_SYMBOL and src.max() < V  # never a special id


@param(
    "kwargs,name",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"length": 0}, "length"),
        ({"vocab_size": FIRST_SYMBOL}, "vocab_size"),
    ],
)
def test_copy_batch_rejects_bad_sizes(kwargs, name):
    args = {"batch_size": 2, "length": 3, "vocab_size": V} | kwargs
    with pytest.raises(ValueError, match=name):
        copy_batch(**args)
    with pytest.raises(TypeError, match=f"{name}: expected an int, got float"):
        copy_batch(**(args | {name: 2.0}))


def test_copy_batches_draws_lengths_in_range():
    stream = copy_batches(2, 3, 5, V, generator=torch.Generator().manual_seed(0))
    lengths = {next(stream)[0].shape[1] for _ in range(60)}
    assert lengths == {3, 4, 5}
    with pytest.raises(ValueError, match="max_len"):
        next(copy_batches(2, 5, 3, V))


@param("attention", [False, True])
def test_shapes_and_teacher_forcing(attention):
    torch.manual_seed(0)
    model = LSTMSeq2Seq(V, 8, 16, attention=attention, d_attn=8)
    src, tgt = copy_batch(3, 5, V)
    memory, (h, c) = model.encode(src)
    assert memory.shape == (3, 5, 16) and h.shape == c.shape == (1, 3, 16)
    logits = model(src, tgt[:, :-1])
    assert logits.shape == (3, 5, V)
    assert torch.allclose(logits, model.decode(tgt[:, :-1], memory, (h, c)))


def test_without_attention_the_decoder_sees_only_the_final_state():
    """The bottleneck: changing every encoder output but the final state changes
    nothing without attention, and changes the output with it."""
    torch.manual_seed(0)
    src, tgt = copy_batch(2, 6, V)
    for attention, should_change in ((False, False), (True, True)):
        model = LSTMSeq2Seq(V, 8, 16, attention=attention, d_attn=8)
        memory, state = model.encode(src)
        a = model.decode(tgt[:, :-1], memory, state)
        b = model.decode(tgt[:, :-1], torch.randn_like(memory), state)
        assert (not torch.allclose(a, b)) == should_change


def test_decoder_matches_a_hand_written_lstm_and_additive_attention():
    torch.manual_seed(0)
    model = LSTMSeq2Seq(V, 8, 16, attention=True, d_attn=8)
    src, tgt = copy_batch(2, 5, V)
    lstm_enc = nn.LSTM(8, 16, batch_first=True)
    lstm_enc.load_state_dict(model.encoder.state_dict())
    memory, state = lstm_enc(model.embed(src))
    lstm_dec = nn.LSTM(8, 16, batch_first=True)
    lstm_dec.load_state_dict(model.decoder.state_dict())
    dec, _ = lstm_dec(model.embed(tgt[:, :-1]), state)
    context, weights = additive_attention(
        dec, memory, memory, model.w_q, model.w_k, model.w_score
    )
    want = model.out(torch.cat([dec, context], -1))
    assert torch.allclose(model(src, tgt[:, :-1]), want, atol=1e-6)
    assert torch.allclose(model.attn_weights, weights)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 5))
    wrong = model.out(torch.cat([dec, memory], -1))  # known-wrong: no attention
    assert not torch.allclose(model(src, tgt[:, :-1]), wrong, atol=1e-3)


@param(
    "bad,error,match",
    [
        (torch.ones(2, 3), TypeError, "integer"),
        (torch.ones(2, 3, 1, dtype=torch.long), ValueError, r"\(B, L\)"),
        (torch.full((2, 3), V), ValueError, "expected ids in"),
    ],
)
def test_bad_ids_are_rejected_with_the_argument_name(bad, error, match):
    model = LSTMSeq2Seq(V, 8, 16)
    with pytest.raises(error, match=match):
        model.encode(bad)
    with pytest.raises(error, match="tgt"):
        model.decode(bad, *model.encode(copy_batch(2, 3, V)[0]))


@param("kind", ["lstm", "lstm+attention", "transformer"])
def test_greedy_copy_agrees_with_teacher_forcing_on_its_own_output(kind, tiny_config):
    """Feeding the greedy output back with teacher forcing must give the same argmax
    at every position; holds for any model, trained or not."""
    torch.manual_seed(0)
    if kind == "transformer":
        cfg = tiny_config(src_vocab_size=V, tgt_vocab_size=V)
        model = make_model(cfg).eval()
    else:
        model = LSTMSeq2Seq(V, 8, 16, attention=kind == "lstm+attention").eval()
    src, _ = copy_batch(3, 6, V)
    out = greedy_copy(model, src)
    assert out.shape == (3, 6)
    fed = torch.cat([torch.full((3, 1), BOS_ID), out[:, :-1]], 1)
    assert torch.equal(model(src, fed).argmax(-1), out)


def test_copy_accuracy_scores_right_and_wrong_answers():
    gen = torch.Generator().manual_seed(0)
    assert copy_accuracy(_Oracle(True), 9, V, generator=gen) == 1.0
    assert copy_accuracy(_Oracle(False), 9, V, generator=gen) < 0.5  # known-wrong
