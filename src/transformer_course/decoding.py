"""Generating text: the KV cache, greedy decoding, beam search and batched generation.

Derived in chapter 6 (greedy and beam search for the translator) and used in chapter 7
(``generate`` from the decoder-only LM, KV cache cost). Shape letters: B batch,
K beam size, H heads, S sequence length so far, d_k head size, V vocabulary.

Every decoder here feeds only the newest token to the model at each step and keeps
the keys and values of the earlier tokens in a ``KVCache`` per layer, so a step costs
O(S) instead of re-running the whole prefix (O(S^2)).

Sources: Vaswani et al. 2017, section 6.1 (beam size 4, length penalty 0.6);
Wu et al. 2016, "Google's Neural Machine Translation System", section 7, equation (14)
(length penalty); Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"
(top-p / nucleus sampling); Fan et al. 2018 (top-k sampling).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_course.data import BOS_ID, EOS_ID, PAD_ID
from transformer_course.kv_cache import KVCache
from transformer_course.training import in_eval_mode

Tensor = torch.Tensor


def new_caches(model, capacity: int = 64, *, cache=KVCache) -> list[KVCache]:
    """One empty cache per decoder layer of a ``Transformer`` or ``DecoderOnlyLM``.

    ``capacity`` is the tokens each ``KVCache`` preallocates (it doubles when full);
    pass the longest sequence a decoder will cache and it never grows. ``cache`` is
    the class (``ConcatKVCache`` for the copy-per-step version, which takes no
    capacity).
    """
    layers = model.decoder.layers if hasattr(model, "decoder") else model.layers
    if cache is KVCache:
        return [KVCache(capacity) for _ in layers]
    return [cache() for _ in layers]


def _strip(row: list[int]) -> list[int]:
    """Tokens up to (not including) the first EOS, without BOS/PAD."""
    out = []
    for t in row:
        if t == EOS_ID:
            break
        if t not in (BOS_ID, PAD_ID):
            out.append(t)
    return out


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def greedy_decode(model, src: Tensor, max_len: int | None = None, *, use_cache=True):
    """Translate a batch by always taking the most likely next token.

    Args:
        model: a ``Transformer``.
        src: source ids (B, S), right-padded with the pad id.
        max_len: most tokens to generate (default: what positions allow).
        use_cache: feed one token a step with a KV cache (True), or re-run the whole
            prefix every step (False, for the equivalence test and the benchmark).

    Returns:
        One list of token ids per source row, without BOS and EOS.
    """
    memory, src_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    B = src.shape[0]
    max_len = max_len or model.cfg.max_len - 1
    tokens = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    caches = new_caches(model) if use_cache else None
    for _ in range(max_len):
        step_in = tokens[:, -1:] if use_cache else tokens  # (B, 1) or (B, t)
        logits = model.decode(step_in, memory, src_mask, caches=caches)[:, -1]  # (B, V)
        nxt = logits.argmax(-1).masked_fill(done, PAD_ID)  # finished rows get padding
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, t + 1)
        done |= nxt == EOS_ID
        if done.all():
            break
    return [_strip(row) for row in tokens.tolist()]


def length_penalty_gnmt(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, equation 14); 1 when alpha = 0."""
    return ((5.0 + length) / 6.0) ** alpha


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def beam_search(
    model,
    src: Tensor,
    max_len: int | None = None,
    *,
    beam_size: int = 4,
    length_penalty: float = 0.6,
):
    """Translate a batch keeping the ``beam_size`` best partial translations.

    Each step extends every hypothesis by every token, scores it by its total
    log-probability, and keeps the K best per source; a hypothesis that produced EOS
    is finished and carries its score unchanged. At the end each finished hypothesis
    is ranked by log P(Y | X) / lp(Y) (GNMT length penalty, ``alpha = length_penalty``;
    0 means no penalty, and then short hypotheses are favoured). With ``beam_size=1``
    this is greedy decoding.

    Args:
        model: a ``Transformer``; src: (B, S) ids; max_len: most tokens to generate.
        beam_size: K >= 1. length_penalty: alpha >= 0.

    Returns:
        One list of token ids per source row (the best hypothesis), without BOS/EOS.

    Raises:
        ValueError: for beam_size < 1 or a negative length_penalty.
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size: expected an int >= 1, got {beam_size!r}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty: expected alpha >= 0, got {length_penalty}")
    B, K = src.shape[0], beam_size
    memory, src_mask = model.encode(src)  # (B, S, D)
    memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, D)
    src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
    max_len = max_len or model.cfg.max_len - 1
    dev = src.device
    tokens = torch.full((B * K, 1), BOS_ID, dtype=torch.long, device=dev)  # (B*K, 1)
    scores = torch.zeros(B, K, device=dev)
    scores[:, 1:] = float("-inf")  # all K beams start identical: keep only one
    done = torch.zeros(B * K, dtype=torch.bool, device=dev)
    caches = new_caches(model)
    for _ in range(max_len):
        logits = model.decode(tokens[:, -1:], memory, src_mask, caches=caches)[:, -1]
        logp = F.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        V = logp.shape[-1]
        logp[done] = float("-inf")  # a finished hypothesis only extends with PAD,
        logp[done, PAD_ID] = 0.0  # at no cost
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)  # (B, K*V)
        scores, flat = cand.topk(K, dim=-1)  # (B, K)
        beam, tok = flat // V, flat % V  # which hypothesis, which token
        rows = (torch.arange(B, device=dev)[:, None] * K + beam).view(-1)  # (B*K,)
        tokens = torch.cat([tokens[rows], tok.view(-1, 1)], dim=1)  # (B*K, t + 1)
        for cache in caches:
            cache.reorder(rows)
        done = done[rows] | (tok.view(-1) == EOS_ID)
        if done.all():
            break
    length = ((tokens != PAD_ID) & (tokens != BOS_ID)).sum(-1).view(B, K)  # with EOS
    final = scores / length_penalty_gnmt(length.float(), length_penalty)  # (B, K)
    best = final.argmax(-1)  # (B,)
    rows = (torch.arange(B, device=dev) * K + best).tolist()
    return [_strip(tokens[r].tolist()) for r in rows]


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def generate(
    model,
    ids: Tensor,
    max_new_tokens: int,
    *,
    attention_mask: Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue a batch of prompts with a ``DecoderOnlyLM``, one token a step, KV-cached.

    The prompts go through the model once; each later step feeds only the newest token
    of every row and reads the earlier ones from the caches. A step divides the logits
    by ``temperature`` (0 = always the most likely token), keeps the ``top_k`` most
    likely tokens and/or the smallest set whose probability reaches ``top_p``
    (``filter_logits``), renormalises and draws. Prompts of different lengths are
    left-padded and marked by ``attention_mask``; each row then generates what its
    prompt alone would.

    Args:
        model: a ``DecoderOnlyLM``.
        ids: prompts (B, T), T >= 1, left-padded with any id where ``attention_mask``
            is False.
        max_new_tokens: most tokens to add (>= 0).
        attention_mask: bool (B, T), True = real token (default: all real).
        temperature: >= 0. top_k: >= 1 or None. top_p: in (0, 1] or None.
        eos_id: a row that produces it is finished: its later tokens are
            ``model.cfg.pad_id``; generation stops early when every row is finished.
        generator: a seeded ``torch.Generator`` for reproducible draws.

    Returns:
        ids (B, T + n), the prompts followed by n <= max_new_tokens new tokens.

    Raises:
        ValueError: a negative temperature or max_new_tokens, top_k < 1, top_p outside
            (0, 1]; as ``DecoderOnlyLM`` for bad ids or mask.

    Sources: Holtzman et al. 2020 (top-p); Fan et al. 2018 (top-k); Radford et al. 2019.
    """
    if temperature < 0:
        raise ValueError(f"temperature: expected >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k: expected an int >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a probability in (0, 1], got {top_p}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected >= 0, got {max_new_tokens}")
    B = ids.shape[0]
    keep = (
        torch.ones_like(ids, dtype=torch.bool)
        if attention_mask is None
        else attention_mask
    )
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)  # rows past their EOS
    caches = new_caches(model)
    step_in = ids  # the whole prompts first, then one token a step
    for _ in range(max_new_tokens):
        logits = model(step_in, attention_mask=keep, caches=caches)[:, -1]  # (B, V)
        logits = logits.float()
        if temperature == 0:
            nxt = logits.argmax(-1)  # (B,)
        else:
            probs = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)
        nxt = nxt.masked_fill(done, model.cfg.pad_id)  # finished rows get padding
        ids = torch.cat([ids, nxt[:, None]], dim=1)  # (B, T + 1)
        keep = torch.cat([keep, ~done[:, None]], dim=1)  # padding is no real token
        if eos_id is not None:
            done |= nxt == eos_id
        if done.all():
            break
        step_in = nxt[:, None]  # (B, 1)
    return ids


def filter_logits(
    logits: Tensor, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Set to -inf every logit outside the top k and outside the nucleus of mass top_p.

    Shapes: (B, V) -> (B, V). Tokens are ranked by logit, ties broken by the lower
    index (as ``argmax`` breaks them), so exactly ``min(top_k, V)`` tokens survive
    ``top_k`` and ``top_k=1`` keeps the ``argmax`` token: sampling then equals greedy
    decoding. ``top_p`` keeps the smallest prefix of that ranking whose probability
    reaches ``top_p`` (a token survives when the mass ranked before it is below
    ``top_p``; sums within 1e-6 of ``top_p`` count as reaching it, so four equal
    logits keep 1, 2, 3, 4 tokens for top_p = 0.25, 0.5, 0.75, 1). The most likely
    token always survives.

    Raises:
        ValueError: for top_k < 1 or top_p outside (0, 1].

    Sources: Fan et al. 2018 (top-k); Holtzman et al. 2020, section 3.1 (top-p).
    """
    if top_k is not None and (
        isinstance(top_k, bool) or int(top_k) != top_k or top_k < 1
    ):
        raise ValueError(f"top_k: expected an int >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a probability in (0, 1], got {top_p}")
    # rank by logit, equal logits by index: a stable sort keeps the lower index first
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # (B, V)
    rank = torch.arange(logits.shape[-1], device=logits.device)  # (V,)
    drop_sorted = torch.zeros_like(sorted_logits, dtype=torch.bool)  # (B, V)
    if top_k is not None:
        drop_sorted |= rank >= top_k
    if top_p is not None and top_p < 1:
        kept = sorted_logits.masked_fill(drop_sorted, float("-inf"))
        probs = F.softmax(kept.double(), dim=-1)  # (B, V)
        mass_before = probs.cumsum(-1) - probs  # probability ranked before each token
        drop_sorted |= mass_before >= top_p - 1e-6
    drop_sorted[..., 0] = False  # the most likely token always survives
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))
