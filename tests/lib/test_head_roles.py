"""The MiniLM encoder built from this library's MultiHeadAttention equals Hugging Face's
BertModel (eager attention) with the same real weights, offline."""

import os

import pytest
import torch

from transformer_course import head_roles as R
from transformer_course import pretrained as P

os.environ.setdefault("HF_HUB_OFFLINE", "1")


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


def synthetic_heads(S=5):
    """(1, 3, S, S): head 0 looks at the previous token (row 0 at [CLS]), head 1 is
    uniform, head 2 looks only at [CLS]."""
    prev = torch.zeros(S, S)
    prev[0, 0] = 1.0
    prev[torch.arange(1, S), torch.arange(S - 1)] = 1.0
    uniform = torch.full((S, S), 1.0 / S)
    cls = torch.zeros(S, S)
    cls[:, 0] = 1.0
    return torch.stack([prev, uniform, cls])[None]


def test_role_scores_on_known_heads():
    ids = torch.tensor([101, 1996, 25000, 2000, 102])  # "rare" word at position 2
    s = R._roles_one(synthetic_heads(), ids)
    assert torch.allclose(s["previous token"][0], torch.tensor([1.0, 0.2, 0.25]))
    assert torch.allclose(s["broad"][0], torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)
    assert torch.allclose(s["[CLS]"][0], torch.tensor([0.4, 0.2, 1.0]))
    assert torch.allclose(s["rare token"][0], torch.tensor([0.2, 0.2, 0.0]))
    assert torch.allclose(s["next token"][0], torch.tensor([0.0, 0.2, 0.0]))
    assert torch.allclose(s["[SEP]"][0], torch.tensor([0.0, 0.2, 0.0]))


def test_rank_heads_finds_the_planted_head():
    w = torch.rand(6, 12, 7, 7) * 0.1
    w[4, 7, 3, 1] = 0.9
    w[2, 0, 3, 1] = 0.5
    top = R.rank_heads(w, query=3, key=1, k=2)
    assert [(layer, head) for layer, head, _ in top] == [(4, 7), (2, 0)]
    assert abs(top[0][2] - 0.9) < 1e-6
    with pytest.raises(ValueError, match="query"):
        R.rank_heads(w, query=7, key=1)
    with pytest.raises(ValueError, match="weights"):
        R.rank_heads(w[0], query=0, key=1)


def test_real_head_roles(ours):
    scores = R.head_role_scores(R.EXAMPLE_SENTENCES[:6], ours)
    assert set(scores) == set(R.HEAD_ROLES)
    for role, s in scores.items():
        assert s.shape == (6, 12), role
        assert (s >= 0).all() and (s <= 1 + 1e-5).all(), role
    # the real model has a clear previous-token head and clear [CLS] heads
    assert scores["previous token"].max() > 0.5
    assert scores["[CLS]"].max() > 0.5


def test_vocabulary_is_ordered_by_frequency():
    tok = P.load_minilm_tokenizer()
    assert tok.id_to_token(R.FIRST_WORD_ID) == "the"
    assert [tok.id_to_token(R.FIRST_WORD_ID + i) for i in range(3)] == [
        "the",
        "of",
        "and",
    ]


def test_top_it_animal_head_prefers_animal_over_street(ours):
    tokens, w = P.attention_maps(SENTENCES[0], ours)
    it, animal, street = (tokens.index(t) for t in ("it", "animal", "street"))
    (layer, head, weight), *_ = R.rank_heads(w, it, animal, k=3)
    assert weight == pytest.approx(float(w[layer, head, it, animal]))
    assert weight == pytest.approx(float(w[:, :, it, animal].max()))
    assert w[layer, head, it, animal] > 5 * w[layer, head, it, street]
