"""What the heads of a real model do: head roles measured on real sentences.

Chapter 3 ("Multi-head attention") finds heads that attend to the previous or next
token, to [CLS] or [SEP], to the rarest word, or broadly, in all-MiniLM-L6-v2
(``pretrained.py``). Shape letters: L layers, H heads, S tokens, B sentences.

Sources: Clark et al. 2019, "What Does BERT Look At? An Analysis of BERT's Attention";
Voita et al. 2019, "Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned".
"""

from __future__ import annotations

import math

import torch

from transformer_course.pretrained import (
    MiniLMEncoder,
    load_minilm_encoder,
    tokenize_batch,
)

Tensor = torch.Tensor


#: Real English sentences for measuring head roles (chapter 3): varied length, syntax
#: and vocabulary, including the Winograd-style pair of Vaswani et al.'s figure.
EXAMPLE_SENTENCES: tuple[str, ...] = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "The trophy doesn't fit into the brown suitcase because it is too large.",
    "She gave the book to her brother, who had asked for it last week.",
    "Paris is the capital and most populous city of France.",
    "The committee postponed the vote until the chairman returned from abroad.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "After the storm, the fishermen repaired their nets on the quiet beach.",
    "A small dog chased the red ball across the garden.",
    "The museum acquired a rare manuscript written in medieval Latin.",
    "He plays the violin every evening after dinner.",
    "The engineers tested the bridge before opening it to traffic.",
    "Most volcanoes in Iceland lie along the Mid-Atlantic Ridge.",
    "The children laughed when the clown slipped on a banana peel.",
    "My grandmother bakes bread with flour from the local mill.",
    "The spacecraft sent photographs of Saturn's rings back to Earth.",
    "If it rains tomorrow, the concert will move indoors.",
    "The lawyer argued that the contract was never signed.",
    "Tigers are solitary hunters that mostly hunt at night.",
    "The old lighthouse keeper wrote letters to his daughter every winter.",
)

#: Id of "the" in the WordPiece vocabulary: from here on the words are listed roughly
#: from most to least frequent in BERT's training text, so a larger id means a rarer
#: word (chapter 3 prints the first entries to show it).
FIRST_WORD_ID = 1996


def rank_heads(weights: Tensor, query: int, key: int, k: int = 3) -> list[tuple]:
    """The ``k`` (layer, head) pairs that put the most weight from token ``query`` on
    token ``key``, largest first.

    Args:
        weights: (L, H, S, S) as returned by ``attention_maps``.
        query, key: token positions in [0, S).

    Returns:
        A list of ``(layer, head, weight)`` with weight a float.

    Raises:
        ValueError: if ``weights`` is not 4-D or a position is out of range.
    """
    if not isinstance(weights, Tensor) or weights.dim() != 4:
        got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights)
        raise ValueError(f"weights: expected shape (L, H, S, S), got {got}")
    L, H, S, _ = weights.shape
    for name, pos in (("query", query), ("key", key)):
        if not 0 <= pos < S:
            raise ValueError(f"{name}: expected a position in [0, {S}), got {pos}")
    link = weights[:, :, query, key].reshape(-1)  # (L * H,)
    top = link.topk(min(k, L * H))
    return [
        (int(i) // H, int(i) % H, float(w)) for w, i in zip(top.values, top.indices)
    ]


HEAD_ROLES = ("previous token", "next token", "[CLS]", "[SEP]", "rare token", "broad")


def _roles_one(w: Tensor, ids: Tensor) -> dict[str, Tensor]:
    """Role scores (L, H) of one sentence's weights w (L, H, S, S) and ids (S,)."""
    S = w.shape[-1]
    words = torch.nonzero(ids >= FIRST_WORD_ID).flatten()
    rare = int(words[ids[words].argmax()]) if len(words) else 0
    entropy = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (L, H, S)
    return {
        "previous token": w.diagonal(-1, -2, -1).mean(-1),  # w[i, i-1]
        "next token": w.diagonal(1, -2, -1).mean(-1),  # w[i, i+1]
        "[CLS]": w[..., :, 0].mean(-1),
        "[SEP]": w[..., :, S - 1].mean(-1),
        "rare token": w[..., :, rare].mean(-1),
        "broad": (entropy / math.log(S)).mean(-1),
    }


@torch.no_grad()
def head_role_scores(
    sentences=EXAMPLE_SENTENCES, model: MiniLMEncoder | None = None
) -> dict[str, Tensor]:
    """How much each head of each layer behaves like the head types of Clark et al.
    (2019) and Voita et al. (2019), averaged over ``sentences``.

    Scores, each (L, H), averaged over the queries of a sentence and then over the
    sentences: "previous token" / "next token" (weight from token i to i - 1 / i + 1),
    "[CLS]" / "[SEP]" (weight on the first / last token), "rare token" (weight on the
    sentence's rarest word, the one with the largest id >= ``FIRST_WORD_ID``), "broad"
    (entropy of the weights divided by log S: 1 = uniform, 0 = one key).

    Raises:
        TypeError / ValueError: as ``tokenize_batch``.
    """
    model = load_minilm_encoder() if model is None else model
    ids, keep, _ = tokenize_batch(list(sentences))
    device = next(model.parameters()).device
    att = model(ids.to(device), keep.to(device)).attentions.float().cpu()  # (L,B,H,S,S)
    totals = {role: 0.0 for role in HEAD_ROLES}
    for b in range(ids.shape[0]):
        n = int(keep[b].sum())
        scores = _roles_one(att[:, b, :, :n, :n], ids[b, :n])
        for role in HEAD_ROLES:
            totals[role] = totals[role] + scores[role] / ids.shape[0]
    return totals
