"""Speculative decoding: a cheap drafter proposes k tokens, the model checks them all
in one forward pass, and the output is what the model alone would have produced.

Built in chapter 11 ("Serving"). Shape letters: k draft tokens, V vocabulary.

A decoding step of a small model on one sequence is bound by reading the weights and
the cache, not by arithmetic, so checking k + 1 tokens in one pass costs little more
than producing one. The model's logits at the k + 1 positions say what it would have
chosen after each draft prefix: greedy decoding keeps the drafts up to the first one
the model would not have chosen and adds the model's own token there (so at least one
token a pass, and exactly plain greedy's tokens). With sampling, draft token x drawn
from the drafter's q is kept with probability min(1, p(x) / q(x)); at the first
rejection a token is drawn from norm(max(0, p - q)), and if all k are kept one more is
drawn from p. Every kept token then has the model's distribution p exactly (Leviathan
et al. 2023, theorem 3.5 / appendix A.1; Chen et al. 2023, theorem 1). The cache holds
the rejected drafts' keys after the pass; it is cropped back (``KVCache.crop``).

Drafters: ``PromptLookupDrafter`` copies what followed the first occurrence of the last
n tokens (prompt lookup decoding, Saxena 2023; ``prompt_lookup_num_tokens`` in
Hugging Face transformers): free, and right whenever the answer repeats its input
(editing, extraction, code). ``ModelDrafter`` runs a smaller model, e.g.
``first_layers(model, n)``, the model's own first n layers with its final norm and head
(self-speculation: Zhang et al. 2023, "Draft & Verify"; Elhoushi et al. 2024,
"LayerSkip").

Sources: Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via
Speculative Decoding", algorithm 1; Chen et al. 2023, "Accelerating Large Language
Model Decoding with Speculative Sampling", algorithm 2.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course import _validation
from transformer_course.decoding import (
    _sampling_args,
    _stop_ids,
    filter_logits,
    new_caches,
)
from transformer_course.model import DecoderOnlyLM
from transformer_course.training import in_eval_mode

Tensor = torch.Tensor


class Drafter(Protocol):
    """``propose(tokens, k, generator)`` -> (up to k draft tokens following the list
    ``tokens``, their draft distributions q (n, V) float, or None when each draft was
    certain: q one-hot on it)."""

    def propose(self, tokens: list[int], k: int, generator=None): ...


class PromptLookupDrafter:
    """Drafts by copying: find the first occurrence of the last n tokens (n from
    ``max_ngram`` down to ``min_ngram``) that has tokens after it, and propose the up
    to k tokens that followed it; nothing when no n-gram recurs. Deterministic (q is
    one-hot). The first occurrence, as transformers' prompt lookup takes it, is most
    often in the prompt, which is what an answer that repeats its input copies (on
    SmolLM2's copy prompts it keeps more drafts than the latest occurrence does).

    ``min_ngram`` is 2 by default, as vLLM's n-gram drafter asks for at least
    ``prompt_lookup_min`` matching tokens (transformers' prompt lookup goes down to 1):
    a lone recurring token (a space, a comma) is weak evidence, and a pass that checks
    wrong drafts costs more than a plain step (on one CPU thread SmolLM2's pass over 2
    tokens costs 1.5 to 1.7 passes over 1). On chapter 11's benchmark prompts it
    proposes fewer drafts and keeps a larger share of them, and it slows answers that
    repeat nothing less (``benchmarks/serving_bench.py``).

    Raises TypeError / ValueError unless 1 <= min_ngram <= max_ngram are ints.
    Source: Saxena 2023, "Prompt Lookup Decoding" (transformers' prompt lookup); vLLM's
    ``SpeculativeConfig`` (``prompt_lookup_min``, ``prompt_lookup_max``).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        _validation.positive_int("min_ngram", min_ngram)
        _validation.positive_int("max_ngram", max_ngram, min_ngram)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: list[int], k: int, generator=None):
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n):  # the first occurrence with a sequel
                if tokens[start : start + n] == tail:
                    return tokens[start + n : start + n + k], None
        return [], None


def first_layers(model: DecoderOnlyLM, n_layers: int) -> DecoderOnlyLM:
    """A ``DecoderOnlyLM`` made of ``model``'s embedding, first ``n_layers`` layers,
    final norm and output head: the same modules (no copy of the weights), a drafter
    for self-speculation. Raises ValueError unless 1 <= n_layers <= cfg.n_layers."""
    _validation.positive_int("n_layers", n_layers)
    if n_layers > model.cfg.n_layers:
        raise ValueError(
            f"n_layers: expected at most the model's {model.cfg.n_layers}, got {n_layers}"
        )
    shallow = DecoderOnlyLM.__new__(DecoderOnlyLM)
    nn.Module.__init__(shallow)
    shallow.cfg = replace(model.cfg, n_layers=n_layers)
    shallow.embed, shallow.norm, shallow.out = model.embed, model.norm, model.out
    shallow.layers = nn.ModuleList(list(model.layers)[:n_layers])
    return shallow.train(model.training)


class ModelDrafter:
    """Drafts with a (smaller) ``DecoderOnlyLM`` of the same vocabulary, one token a
    step with its own KV cache, kept between calls for the tokens that stayed.

    ``temperature`` 0 drafts its most likely tokens (q one-hot, returned as None);
    otherwise it draws from softmax(filter_logits(logits / temperature, top_k, top_p))
    and returns those distributions as q (n, V). Raises as ``generate`` for bad
    sampling arguments.
    """

    def __init__(self, model, *, temperature: float = 0.0, top_k=None, top_p=None):
        _validation.non_negative("temperature", temperature)
        _sampling_args(top_k, top_p)
        self.model, self.temperature, self.top_k, self.top_p = (
            model,
            temperature,
            top_k,
            top_p,
        )
        self.caches, self.cached = None, []  # tokens whose keys the caches hold

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, generator=None):
        if self.caches is None:
            self.caches = new_caches(self.model, 256)  # doubles when full
        same = 0  # the cached prefix that ``tokens`` still starts with
        while (
            same < min(len(self.cached), len(tokens) - 1)
            and self.cached[same] == tokens[same]
        ):
            same += 1
        for cache in self.caches:
            cache.crop(same)
        feed, draft, qs = tokens[same:], [], []
        device = self.model.out.weight.device
        while len(draft) < k:
            x = torch.tensor([feed], device=device)
            logits = self.model(x, caches=self.caches, logits_to_keep=1)[0, -1].float()
            if self.temperature == 0:
                draft.append(int(logits.argmax()))
            else:
                kept = filter_logits(
                    logits[None] / self.temperature, self.top_k, self.top_p
                )
                q = F.softmax(kept, dim=-1)[0]
                draft.append(int(torch.multinomial(q, 1, generator=generator)))
                qs.append(q)
            feed = draft[-1:]
        self.cached = tokens + draft[:-1]
        return draft, (torch.stack(qs) if qs else None)


def accept_or_resample(
    draft: Tensor, p: Tensor, q: Tensor | None, generator=None
) -> tuple[Tensor, Tensor]:
    """The speculative sampling rule for n draft tokens at once.

    Row i keeps ``draft[i]`` with probability min(1, p_i(x) / q_i(x)); otherwise it
    draws a token from norm(max(0, p_i - q_i)), the part of p that q under-proposes
    (p itself where that is zero, which happens only when p = q and the draft is kept
    for sure). The rows are independent: a caller keeps drafts up to the first
    rejection and takes that row's drawn token.

    Shapes: draft (n,) long; p, q (n, V) probabilities (q None: one-hot on the draft).
    Returns (kept (n,) bool, token (n,) long: the draft where kept, else the draw).
    Source: Leviathan et al. 2023, algorithm 1; Chen et al. 2023, algorithm 2.
    """
    if q is None:
        q = F.one_hot(draft, p.shape[-1]).to(p.dtype)  # (n, V)
    px = p.gather(-1, draft[:, None])[:, 0]  # (n,)
    qx = q.gather(-1, draft[:, None])[:, 0]
    u = torch.rand(px.shape, generator=generator, device=p.device)
    kept = u * qx < px  # u < p(x) / q(x), without dividing by a zero
    residual = (p - q).clamp_min(0)  # (n, V)
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    drawn = torch.multinomial(residual, 1, generator=generator)[:, 0]  # renormalised
    return kept, torch.where(kept, draft, drawn)


@dataclass(frozen=True)
class SpeculativeStep:
    """One pass: the sequence had ``start`` tokens, the drafter proposed
    ``draft``, the first ``accepted`` of them were kept, and the model added ``token``
    (its correction of the first rejected draft, or one more token when all were
    kept)."""

    start: int
    draft: tuple[int, ...]
    accepted: int
    token: int


@dataclass
class SpeculativeStats:
    """``drafted`` draft tokens proposed, ``accepted`` of them kept, ``passes`` forward
    passes of the model (the first reads the prompt and checks the first drafts, as
    transformers' assisted generation does; each adds its kept drafts and one token of
    the model's, so ``new_tokens`` = ``accepted`` + ``passes`` unless a stop token
    ends a pass early), ``new_tokens`` tokens produced;
    ``steps``: one ``SpeculativeStep`` per verifying pass when recorded
    (``speculative_generate(..., record=True)``), else None."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    new_tokens: int = 0
    steps: list[SpeculativeStep] | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / max(self.passes, 1)  # plain decoding: 1


@in_eval_mode  # eval mode, no gradients; the model's mode is restored
def speculative_generate(
    model,
    ids: Tensor,
    max_new_tokens: int,
    drafter: Drafter,
    *,
    k: int = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Collection[int] | None = None,
    generator: torch.Generator | None = None,
    accept=accept_or_resample,
    record: bool = False,
) -> tuple[Tensor, SpeculativeStats]:
    """Continue one prompt with ``model``, ``drafter`` proposing up to ``k`` tokens a
    pass; greedy (``temperature`` 0) output equals ``decoding.generate``'s token for
    token, and sampled output has its distribution (module docstring).

    Args:
        model: a ``DecoderOnlyLM``. ids: the prompt, (1, T) integer.
        max_new_tokens: most tokens to add (>= 0). drafter: a ``Drafter``.
        k: most draft tokens a pass (>= 1; fewer near ``max_new_tokens`` and
            ``cfg.max_len``). temperature, top_k, top_p, eos_token_id, generator: as
            ``generate`` (a row that produces a stop token ends there).
        accept: the sampling rule (``accept_or_resample``; tests pass wrong ones).
        record: keep each pass's drafts, how many were kept and the model's token in
            ``stats.steps`` (for ``viz.animations.speculative_animation``).

    Returns:
        (ids (1, T + n) with n <= max_new_tokens, a ``SpeculativeStats``).

    Raises:
        TypeError / ValueError: as ``generate``; ids with more than one row; k < 1.
    """
    _validation.positive_int("max_new_tokens", max_new_tokens, 0)
    _validation.positive_int("k", k)
    _validation.non_negative("temperature", temperature)
    _sampling_args(top_k, top_p)
    _validation.integer_tensor("ids", ids)
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(
            f"ids: expected one prompt of shape (1, T), got {tuple(ids.shape)}"
        )
    stop = _stop_ids(eos_token_id, ids.device)
    stop = set() if stop is None else set(stop.tolist())
    if not isinstance(record, bool):
        raise TypeError(f"record: expected True or False, got {record!r}")
    tokens, n_prompt, stats = ids[0].tolist(), ids.shape[1], SpeculativeStats()
    if record:
        stats.steps = []
    caches = new_caches(model, n_prompt + max_new_tokens + k)
    cached = 0  # tokens whose keys the caches hold: after each pass, all but the last
    with torch.inference_mode():
        while len(tokens) - n_prompt < max_new_tokens:
            room = min(k, max_new_tokens - (len(tokens) - n_prompt) - 1)
            room = min(room, model.cfg.max_len - len(tokens))
            draft, q = (
                drafter.propose(tokens, room, generator) if room > 0 else ([], None)
            )
            draft, q = draft[:room], (None if q is None else q[: len(draft[:room])])
            n = len(draft)
            # the first pass reads the prompt and checks the first drafts with it
            x = torch.tensor([tokens[cached:] + draft], device=ids.device)
            logits = model(x, caches=caches, logits_to_keep=1 + n)[
                0
            ].float()  # (1 + n, V)
            stats.passes += 1
            if temperature == 0:
                target = logits.argmax(-1).tolist()
                kept = 0
                while kept < n and draft[kept] == target[kept]:
                    kept += 1
                new = draft[:kept] + [target[kept]]
            else:
                p = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
                kept, last = n, None
                if n:
                    ok, token = accept(
                        torch.tensor(draft, device=p.device), p[:n], q, generator
                    )
                    bad = (~ok).nonzero()
                    if len(bad):
                        kept = int(bad[0])
                        last = int(token[kept])
                if last is None:  # every draft kept: one more token from the model
                    last = int(torch.multinomial(p[n], 1, generator=generator))
                new = draft[:kept] + [last]
            stats.drafted, stats.accepted = stats.drafted + n, stats.accepted + kept
            if record:
                step = SpeculativeStep(
                    len(tokens), tuple(map(int, draft)), kept, new[-1]
                )
                stats.steps.append(step)
            cached = len(tokens) + kept
            for cache in caches:  # drop the rejected drafts' keys and values
                cache.crop(cached)
            for token in new:
                tokens.append(token)
                if token in stop:
                    break
            if stop.intersection(new):
                break
    stats.new_tokens = len(tokens) - n_prompt
    return torch.tensor([tokens], dtype=ids.dtype, device=ids.device), stats
