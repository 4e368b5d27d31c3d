"""Generating text: the KV cache, greedy decoding, beam search and batched generation.

Derived in chapter 6 (greedy and beam search for the translator) and used in chapter 7
(``generate`` from the decoder-only LM, KV cache cost). Shape letters: B batch,
K beam size, H heads, S sequence length so far, d_k head size, V vocabulary.

One convention for every decoder: ``max_new_tokens`` bounds the tokens added;
``use_cache=True`` feeds only the newest token each step and keeps the earlier keys
and values in a ``KVCache`` per layer (O(S) a step), ``use_cache=False`` re-runs the
whole prefix (O(S^2), the same tokens); ``eos_token_id`` is one stop id or a
collection of them; finished rows are padded with ``model.cfg.pad_id``.

Sources: Vaswani et al. 2017, section 6.1 (beam size 4, length penalty 0.6);
Wu et al. 2016, "Google's Neural Machine Translation System", section 7, equation (14)
(length penalty); Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"
(top-p / nucleus sampling); Fan et al. 2018 (top-k sampling).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.nn.functional as F

from transformer_course import _validation
from transformer_course.data import BOS_ID, EOS_ID
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


def _stop_ids(eos_token_id, device) -> Tensor | None:
    """The stop tokens as a 1-D tensor (None: no stop token)."""
    if eos_token_id is None:
        return None
    _validation.token_id_set("eos_token_id", eos_token_id)
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, device=device)


def _strip(row: list[int], bos: int, stop: set[int], pad: int) -> list[int]:
    """Tokens up to (not including) the first stop token, without BOS/padding."""
    out = []
    for t in row:
        if t in stop:
            break
        if t not in (bos, pad):
            out.append(t)
    return out


def _steps(model, max_new_tokens) -> int:
    if max_new_tokens is None:
        return model.cfg.max_len - 1  # what the positions allow after BOS
    _validation.positive_int("max_new_tokens", max_new_tokens, 0)
    return max_new_tokens


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def greedy_decode(
    model,
    src: Tensor,
    max_new_tokens: int | None = None,
    *,
    use_cache: bool = True,
    bos_token_id: int = BOS_ID,
    eos_token_id: int | Collection[int] = EOS_ID,
) -> list[list[int]]:
    """Translate a batch by always taking the most likely next token.

    Args:
        model: a ``Transformer`` (or any model with ``encode``, ``decode`` and ``cfg``).
        src: source ids (B, S), right-padded with ``model.cfg.pad_id``.
        max_new_tokens: most tokens after BOS (default ``cfg.max_len - 1``).
        use_cache: KV caches (True) or the whole prefix every step (False).
        bos_token_id, eos_token_id: the start id and the stop id(s); the defaults are
            the ids every tokenizer of ``data`` reserves.

    Returns:
        One list of token ids per source row, without BOS, EOS and padding.

    Raises:
        TypeError / ValueError: a negative or non-int ``max_new_tokens``, a bad
            ``eos_token_id``; as the model for bad ``src``.
    """
    n_new = _steps(model, max_new_tokens)
    stop = _stop_ids(eos_token_id, src.device)
    pad = model.cfg.pad_id
    memory, memory_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    B = src.shape[0]
    tokens = torch.full((B, 1), bos_token_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    caches = new_caches(model) if use_cache else None
    for _ in range(n_new):
        step_in = tokens[:, -1:] if use_cache else tokens  # (B, 1) or (B, t)
        out = model.decode(step_in, memory, memory_mask, caches=caches)  # (B, t, V)
        logits = out[:, -1].clone()  # (B, V)
        # Padding is never a next token: the decoder hides a padded target key when it
        # reads the whole prefix but not from a cache, so the two paths would part.
        logits[:, pad] = float("-inf")
        nxt = logits.argmax(-1).masked_fill(done, pad)  # finished rows get padding
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, t + 1)
        done |= torch.isin(nxt, stop)
        if done.all():
            break
    stop_set = set(stop.tolist())
    return [_strip(row, bos_token_id, stop_set, pad) for row in tokens.tolist()]


def length_penalty_gnmt(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, equation 14); 1 when alpha = 0."""
    return ((5.0 + length) / 6.0) ** alpha


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def beam_search(
    model,
    src: Tensor,
    max_new_tokens: int | None = None,
    *,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    use_cache: bool = True,
    bos_token_id: int = BOS_ID,
    eos_token_id: int | Collection[int] = EOS_ID,
) -> list[list[int]]:
    """Translate a batch keeping the ``beam_size`` best partial translations.

    Each step extends every hypothesis by every token, scores it by its total
    log-probability, and keeps the K best per source; a hypothesis that produced EOS
    is finished and carries its score unchanged. At the end each hypothesis is ranked
    by log P(Y | X) / lp(Y) (GNMT length penalty, ``alpha = length_penalty``; 0 means
    no penalty, and then short hypotheses are favoured). With ``beam_size=1`` this is
    greedy decoding.

    Convention: a finished hypothesis **keeps its slot** in the beam (as chapter 6's
    inline search), so after the first EOS fewer than K stay live and the length
    penalty only re-ranks the K that survived on raw log-probability. Hugging Face
    draws 2K candidates a step and keeps K live ones (HF #16095, ParlAI #2058); with a
    large ``length_penalty`` it can return a longer translation that this search
    dropped unfinished (``tests/lib/test_decoding.py`` pins such a case).

    Args:
        model, src, max_new_tokens, use_cache, bos_token_id, eos_token_id: as
            ``greedy_decode`` (the caches are reordered with the beams).
        beam_size: K >= 1. length_penalty: alpha >= 0.

    Returns:
        One list of token ids per source row (the best hypothesis), without BOS/EOS.

    Raises:
        TypeError / ValueError: beam_size not an int >= 1, a negative
            length_penalty, bad max_new_tokens or eos_token_id.
    """
    n_new = _steps(model, max_new_tokens)
    _validation.positive_int("beam_size", beam_size)
    _validation.non_negative("length_penalty", length_penalty)
    stop = _stop_ids(eos_token_id, src.device)
    pad = model.cfg.pad_id
    B, K = src.shape[0], beam_size
    memory, memory_mask = model.encode(src)  # (B, S, D)
    memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, D)
    memory_mask = memory_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
    dev = src.device
    tokens = torch.full((B * K, 1), bos_token_id, dtype=torch.long, device=dev)
    scores = torch.zeros(B, K, device=dev)
    scores[:, 1:] = float("-inf")  # all K beams start identical: keep only one
    done = torch.zeros(B * K, dtype=torch.bool, device=dev)
    caches = new_caches(model) if use_cache else None
    for _ in range(n_new):
        step_in = tokens[:, -1:] if use_cache else tokens  # (B*K, 1) or (B*K, t)
        logits = model.decode(step_in, memory, memory_mask, caches=caches)[:, -1]
        logp = F.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        V = logp.shape[-1]
        logp[:, pad] = float("-inf")  # padding is never a next token (greedy_decode)
        logp[done] = float("-inf")  # a finished hypothesis only extends with padding,
        logp[done, pad] = 0.0  # at no cost
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)  # (B, K*V)
        scores, flat = cand.topk(K, dim=-1)  # (B, K)
        beam, tok = flat // V, flat % V  # which hypothesis, which token
        rows = (torch.arange(B, device=dev)[:, None] * K + beam).view(-1)  # (B*K,)
        tokens = torch.cat([tokens[rows], tok.view(-1, 1)], dim=1)  # (B*K, t + 1)
        for cache in caches or ():
            cache.reorder(rows)
        done = done[rows] | torch.isin(tok.view(-1), stop)
        if done.all():
            break
    length = ((tokens != pad) & (tokens != bos_token_id)).sum(-1).view(B, K)  # + EOS
    final = scores / length_penalty_gnmt(length.float(), length_penalty)  # (B, K)
    best = final.argmax(-1)  # (B,)
    rows = (torch.arange(B, device=dev) * K + best).tolist()
    stop_set = set(stop.tolist())
    return [_strip(tokens[r].tolist(), bos_token_id, stop_set, pad) for r in rows]


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def generate(
    model,
    ids: Tensor,
    max_new_tokens: int,
    *,
    attention_mask: Tensor | None = None,
    use_cache: bool = True,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Collection[int] | None = None,
    generator: torch.Generator | None = None,
    cache: type = KVCache,
) -> Tensor:
    """Continue a batch of prompts with a ``DecoderOnlyLM``, one token a step.

    The one greedy/sampling loop of the library: chapters, tests and benchmarks call
    it. The prompts go through the model first; then, with ``use_cache``, each step
    feeds only the newest token of every row. A step divides the logits by
    ``temperature`` (0 = always the most likely token), keeps the ``top_k`` most
    likely tokens and/or the smallest set whose probability reaches ``top_p``
    (``filter_logits``), renormalises and draws. Prompts of different lengths are
    **left**-padded and marked by ``attention_mask`` (Hugging Face's name and meaning:
    True = real token); each row then generates what its prompt alone would. The steps
    run under ``torch.inference_mode`` (no autograd records at all, less work per
    operation than ``torch.no_grad``); the ids returned are an ordinary tensor.

    Args:
        model: a ``DecoderOnlyLM``.
        ids: prompts (B, T), T >= 1, left-padded with any id where ``attention_mask``
            is False.
        max_new_tokens: most tokens to add (>= 0).
        attention_mask: bool (B, T), True = real token (default: all real). Every
            row's last position must be real: generation continues from it.
        use_cache: KV caches (True) or the whole sequence every step (False).
        temperature: >= 0. top_k: an int >= 1 or None. top_p: in (0, 1] or None.
        eos_token_id: a stop token id or a collection of them: a row that produces
            any of them is finished and its later tokens are ``model.cfg.pad_id``;
            generation stops early when every row is finished.
        generator: a seeded ``torch.Generator`` for reproducible draws.
        cache: the cache class with ``use_cache``: ``KVCache`` (preallocated for the
            prompt and ``max_new_tokens``, written in place) or ``ConcatKVCache`` (the
            copy-per-step version chapter 7 and the benchmark compare it with).

    Returns:
        ids (B, T + n), the prompts followed by n <= max_new_tokens new tokens.

    Raises:
        ValueError: a negative temperature or max_new_tokens, top_k < 1, top_p outside
            (0, 1], an empty ``eos_token_id``, an ``attention_mask`` whose row ends in
            padding (a right-padded prompt: the model would continue from the pad,
            Hugging Face transformers PR #19067); as ``DecoderOnlyLM`` for bad ids.
        TypeError: non-int counts, a non-bool ``attention_mask``.

    Sources: Holtzman et al. 2020 (top-p); Fan et al. 2018 (top-k); Radford et al. 2019;
    the loop's shape is Raschka's ``generate_text_simple`` (LLMs from Scratch, ch. 4).
    """
    _validation.positive_int("max_new_tokens", max_new_tokens, 0)
    _validation.non_negative("temperature", temperature)
    _sampling_args(top_k, top_p)
    _validation.integer_tensor("ids", ids)  # the model checks shape and range
    if attention_mask is not None:  # None: every token real, no mask to build
        _validation.keep_mask("attention_mask", attention_mask, tuple(ids.shape))
        _validation.left_padded("attention_mask", attention_mask)
    stop = _stop_ids(eos_token_id, ids.device)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)  # finished
    capacity = ids.shape[1] + max_new_tokens  # known before the first step
    caches = new_caches(model, capacity, cache=cache) if use_cache else None
    step_in = ids  # the whole prompts first, then (with a cache) one token a step
    with torch.inference_mode():  # no autograd bookkeeping at all: less per op
        for _ in range(max_new_tokens):
            logits = model(
                step_in, attention_mask=attention_mask, caches=caches, logits_to_keep=1
            )[:, -1].float()  # (B, V): only the last position predicts the next token
            nxt = _next_token(logits, temperature, top_k, top_p, generator)  # (B,)
            nxt = nxt.masked_fill(done, model.cfg.pad_id)  # finished rows get padding
            ids = torch.cat([ids, nxt[:, None]], dim=1)  # (B, T + 1)
            if attention_mask is not None:  # a finished row's padding is no real token
                attention_mask = torch.cat([attention_mask, ~done[:, None]], dim=1)
            if stop is not None:
                done |= torch.isin(nxt, stop)
            if done.all():
                break
            step_in = nxt[:, None] if use_cache else ids  # (B, 1) or (B, T + 1)
    return ids.clone()  # a normal tensor again, which the caller may change in place


def _next_token(logits: Tensor, temperature, top_k, top_p, generator) -> Tensor:
    """Logits (B, V) -> token ids (B,): the most likely (temperature 0) or a draw."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _sampling_args(top_k, top_p) -> None:
    if top_k is not None:
        _validation.positive_int("top_k", top_k)
    if top_p is not None:
        _validation.nucleus_mass("top_p", top_p)


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
        TypeError: a top_k that is not an int. ValueError: top_k < 1 or top_p outside
            (0, 1].

    Sources: Fan et al. 2018 (top-k); Holtzman et al. 2020, section 3.1 (top-p).
    """
    _sampling_args(top_k, top_p)
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
