"""The full Transformer (chapter 6): layer parity with PyTorch, masks, bad input."""

import pytest
import torch
from torch import nn

from transformer_course.interop import load_torch_layer
from transformer_course.layers import FeedForward, TransformerLayer
from transformer_course.masks import causal_mask, from_key_padding_mask
from transformer_course.model import DecoderOnlyLM, TransformerConfig, make_model

param = pytest.mark.parametrize
D, H, FF = 16, 4, 32


def _kpm():
    return torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)


@param("norm_first", [False, True])
def test_encoder_layer_equals_pytorch(norm_first):
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    ours = load_torch_layer(TransformerLayer(D, H, FF, norm_first=norm_first), ref)
    ours.eval()
    x = torch.randn(2, 5, D)
    want = ref(x, src_key_padding_mask=_kpm())
    got = ours(x, from_key_padding_mask(_kpm()))
    torch.testing.assert_close(got[0, :3], want[0, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    # known wrong: the other norm placement with the same weights is far off
    other = load_torch_layer(TransformerLayer(D, H, FF, norm_first=not norm_first), ref)
    assert (other(x, from_key_padding_mask(_kpm())) - want)[1].abs().max() > 1e-2


@param("norm_first", [False, True])
def test_decoder_layer_equals_pytorch(norm_first):
    ref = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    ours = TransformerLayer(D, H, FF, cross_attention=True, norm_first=norm_first)
    ours = load_torch_layer(ours, ref).eval()
    memory, y = torch.randn(2, 5, D), torch.randn(2, 4, D)
    future = nn.Transformer.generate_square_subsequent_mask(4)  # float, -inf = blocked
    want = ref(y, memory, tgt_mask=future, memory_key_padding_mask=_kpm())
    kpm = from_key_padding_mask(_kpm())
    got = ours(y, causal_mask(4), memory=memory, memory_mask=kpm)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # known wrong: forgetting the causal mask lets positions see the future
    leaky = ours(y, None, memory=memory, memory_mask=kpm)
    assert (leaky - want)[:, :-1].abs().max() > 1e-3


def test_feed_forward_is_position_wise():
    ff = FeedForward(D, FF)
    x = torch.randn(3, 7, D)
    torch.testing.assert_close(ff(x)[:, 2], ff(x[:, 2]))


@param("norm_first", [False, True])
def test_padding_does_not_change_real_positions(norm_first, tiny_config):
    model = make_model(tiny_config(norm_first=norm_first)).eval()
    src = torch.tensor([[5, 6, 7]])
    tgt = torch.tensor([[1, 8, 9]])
    alone = model(src, tgt)
    padded = model(torch.tensor([[5, 6, 7, 0, 0]]), torch.tensor([[1, 8, 9, 0]]))
    torch.testing.assert_close(padded[:, :3], alone, atol=1e-5, rtol=1e-5)
    # known wrong: the pad token read as a real token changes the result
    assert (model(torch.tensor([[5, 6, 7, 4, 4]]), tgt) - alone).abs().max() > 1e-4


def test_embeddings_scaled_and_tied(tiny_config):
    model = make_model(tiny_config(tie_embeddings=True))
    assert model.decoder.out.weight is model.decoder.embed.tokens.weight
    emb = model.encoder.embed
    assert emb.scale == pytest.approx(32**0.5)
    assert (
        not make_model(tiny_config()).decoder.out.weight
        is make_model(tiny_config()).decoder.embed.tokens.weight
    )


@param(
    "bad, err, words",
    [
        (torch.zeros(2, 0, dtype=torch.long), ValueError, "L >= 1"),  # empty source
        (torch.full((1, 13), 5), ValueError, "max_len = 12"),  # too long
        (torch.tensor([[5, 25]]), ValueError, "token id 25"),  # unknown token
        (torch.tensor([[5.0, 6.0]]), TypeError, "integer"),
        (torch.tensor([5, 6]), ValueError, "(B, L)"),
    ],
)
def test_bad_source_gives_clear_error(bad, err, words, tiny_config):
    model = make_model(tiny_config(max_len=12))
    with pytest.raises(err, match="src") as info:
        model.encode(bad)
    assert words in str(info.value)


def test_config_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="n_heads"):
        TransformerConfig(d_model=30, n_heads=4)


def test_decoder_only_lm_is_causal(tiny_config):
    lm = DecoderOnlyLM(tiny_config()).eval()
    ids = torch.tensor([[4, 5, 6, 7, 8]])
    changed = ids.clone()
    changed[0, 3] = 9
    a, b = lm(ids), lm(changed)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert (a[:, 3:] - b[:, 3:]).abs().max() > 1e-4  # the check can see a change


def test_logits_to_keep_projects_only_the_last_positions(tiny_config):
    lm = DecoderOnlyLM(tiny_config()).eval()
    ids = torch.tensor([[4, 5, 6, 7, 8], [9, 4, 5, 6, 7]])
    full = lm(ids)  # (B, T, V)
    assert lm(ids, logits_to_keep=2).shape == (2, 2, full.shape[-1])
    torch.testing.assert_close(lm(ids, logits_to_keep=1), full[:, -1:])
    torch.testing.assert_close(lm(ids, logits_to_keep=2), full[:, -2:])
    with pytest.raises(ValueError, match="logits_to_keep"):
        lm(ids, logits_to_keep=0)


def test_cross_and_self_attention_weights_are_kept(tiny_config):
    model = make_model(tiny_config()).eval()
    model(torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 8, 9]]))
    layer = model.decoder.layers[0]
    assert layer.cross_attn_weights.shape == (1, 4, 3, 4)
    assert layer.cross_attn_weights[..., 3].abs().max() == 0  # padding key
    w = layer.self_attn_weights[0, 0]
    assert torch.equal(w.triu(1), torch.zeros_like(w))  # causal


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
def test_every_positional_kind_makes_the_model_order_aware(positional, tiny_config):
    model = make_model(tiny_config(positional=positional)).eval()
    src = torch.tensor([[5, 6, 7, 8]])
    tgt = torch.tensor([[1, 9, 10]])
    with torch.no_grad():
        memory, _ = model.encode(src)
        swapped, _ = model.encode(src[:, [1, 0, 2, 3]])
    # a permuted source gives other encodings of the same tokens (known wrong: "none")
    assert (memory[0, 0] - swapped[0, 1]).abs().max() > 1e-3
    assert model(src, tgt).shape == (1, 3, tiny_config().tgt_vocab_size)
    blind = make_model(tiny_config(positional="none")).eval()
    with torch.no_grad():
        a, _ = blind.encode(src)
        b, _ = blind.encode(src[:, [1, 0, 2, 3]])
    torch.testing.assert_close(a[0, 0], b[0, 1])  # no positions: order is invisible
    with pytest.raises(ValueError, match="positional"):
        tiny_config(positional="relative")
