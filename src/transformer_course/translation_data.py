"""The translation corpus of chapter 6: English number words -> German (or French).

The words are generated with ``num2words``: real language, deterministic, learnable on a
CPU in minutes, and German reorders units and tens ("forty-two" -> "zweiundvierzig").
The numbers are split into train / validation / test *by value*, so no held-out number
was seen in training. Tokenizers and batching are in ``data``; ``train_translator`` is
the chapter's training recipe (the benchmark calls the same function).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import torch
from num2words import num2words

from transformer_course import _validation
from transformer_course.data import (
    BOS_ID,
    EOS_ID,
    CharTokenizer,
    HFTokenizer,
    batches,
)
from transformer_course.training import (
    History,
    fit,
    make_criterion,
    noam_scheduler,
    translation_loss,
)


@cache
def _num2words(n: int, lang: str) -> str:
    return num2words(n, lang=lang)


def number_words(n: int, lang: str = "en") -> str:
    """The number ``n`` (0 <= n < 1,000,000) written out in words, as ``num2words``
    writes it, for ``lang`` "en", "de" or "fr".

    ``num2words`` is slow (about 0.3 ms a number in German), so a number
    n = 1000 a + b is assembled from two cached calls: the words of 1000 a, and the
    words that follow "one thousand" in 1000 + b ("... and one", "..., nine hundred").
    The tests check this equals ``num2words(n, lang=lang)``.

    Raises:
        ValueError: for an unknown language or n outside [0, 1,000,000).
    """
    if lang not in ("en", "de", "fr"):
        raise ValueError(f"lang: expected 'en', 'de' or 'fr', got {lang!r}")
    if not 0 <= n < 1_000_000:
        raise ValueError(f"n: expected 0 <= n < 1,000,000, got {n}")
    a, b = divmod(n, 1000)
    if a == 0:
        return _num2words(b, lang)
    rest = _num2words(1000 + b, lang)[len(_num2words(1000, lang)) :] if b else ""
    return _num2words(1000 * a, lang) + rest


BASIC_NUMBERS = (*range(1, 21), *range(30, 100, 10), 100, 1000)
"""The numbers whose words are a building block: 1 to 20, the round tens, 100 and
1000. Each is the only number written with its word *standing alone* ("one" -> "eins",
not the "ein" of "einundzwanzig"; "one thousand" -> "eintausend" with nothing after
it); no other number can teach a model that form, so ``make_translation_data`` keeps
them in the training split."""


def split_numbers(
    max_number: int = 100_000,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    *,
    in_train: Iterable[int] = (),
) -> dict[str, list[int]]:
    """Split the numbers 1 .. max_number - 1 into train / valid / test by value.

    A seeded random permutation is cut by ``fractions``: every number lands in exactly
    one split, so a held-out number was never seen in training. Zero is left out: it is
    the only number spelled with "zero" / "null", a word no other number could teach.
    The numbers ``in_train`` (e.g. ``BASIC_NUMBERS``) go to the training split; the
    others fill the rest of it in permutation order, so the split sizes do not change.

    Raises:
        ValueError: for ``max_number`` < 3, fractions that are not three positive
            numbers summing to 1, or ``in_train`` numbers outside 1 .. max_number - 1
            or more of them than the training split holds.
    """
    if max_number < 3:
        raise ValueError(f"max_number: expected at least 3, got {max_number}")
    if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(
            f"fractions: expected three positive numbers summing to 1, got {fractions}"
        )
    keep = sorted(set(in_train))
    if keep and not 1 <= keep[0] <= keep[-1] < max_number:
        raise ValueError(
            f"in_train: expected numbers in 1 .. {max_number - 1}, got {keep[0]} .. "
            f"{keep[-1]}"
        )
    perm = torch.randperm(max_number - 1, generator=torch.Generator().manual_seed(seed))
    perm = (perm + 1).tolist()
    n_train = int(fractions[0] * len(perm))
    n_valid = int(fractions[1] * len(perm))
    if len(keep) > n_train:
        raise ValueError(
            f"in_train: expected at most {n_train} numbers (the training split), "
            f"got {len(keep)}"
        )
    kept = set(keep)
    rest = [n for n in perm if n not in kept]
    n_rest = n_train - len(keep)
    cuts = {
        "train": keep + rest[:n_rest],
        "valid": rest[n_rest : n_rest + n_valid],
        "test": rest[n_rest + n_valid :],
    }
    return {name: sorted(part) for name, part in cuts.items()}


TRANSLATOR_STEPS = 500
"""Chapter 6's training steps: about 80 s on two idle CPU cores (0.16 s a step)."""
TRANSLATOR_AVERAGE = 150
"""``train_translator`` returns the mean of the weights after each of its last this
many steps."""


@dataclass
class TranslationData:
    """The number-words corpus: texts, tokenizers and token ids for each split.

    Attributes:
        numbers, src_texts, tgt_texts: dicts split name -> list (same order).
        src_tok, tgt_tok: the tokenizers, trained on (an evenly spaced sample of
            about ``TOKENIZER_TEXTS``) training texts only.
        src_ids, tgt_ids: dicts split name -> list of id lists. Target sequences are
            ``[BOS] + tokens + [EOS]``; source sequences carry no special tokens.
        max_len: the longest source or target sequence in any split.
    """

    numbers: dict[str, list[int]]
    src_texts: dict[str, list[str]]
    tgt_texts: dict[str, list[str]]
    src_tok: CharTokenizer | HFTokenizer
    tgt_tok: CharTokenizer | HFTokenizer
    src_ids: dict[str, list[list[int]]]
    tgt_ids: dict[str, list[list[int]]]
    max_len: int


def _make_tokenizer(kind: str, texts: list[str], vocab_size: int):
    if kind == "char":
        return CharTokenizer(texts)
    if kind == "word":
        return HFTokenizer.train_words(texts)
    if kind == "bpe":
        return HFTokenizer.train_bpe(texts, vocab_size)
    raise ValueError(f"tokenizer: expected 'char', 'word' or 'bpe', got {kind!r}")


TOKENIZER_TEXTS = 10_000  # tokenizers are trained on about this many training texts


def make_translation_data(
    max_number: int = 100_000,
    *,
    target_lang: str = "de",
    src_tokenizer: str = "word",
    tgt_tokenizer: str = "bpe",
    tgt_vocab_size: int = 80,
    seed: int = 0,
    in_train: Iterable[int] = BASIC_NUMBERS,
) -> TranslationData:
    """English number words -> ``target_lang`` number words, split by value.

    Args:
        max_number: the corpus holds 1 .. max_number - 1 (at most 1,000,000).
        target_lang: "de" (default) or "fr".
        src_tokenizer / tgt_tokenizer: "word", "bpe" or "char".
        tgt_vocab_size: BPE vocabulary size (used for "bpe" only).
        seed: seed of the split.
        in_train: numbers always put in the training split (default
            ``BASIC_NUMBERS``: every word form that stands alone is seen in training;
            ``()`` gives the plain random split).

    Returns:
        A ``TranslationData``.
    """
    if target_lang not in ("de", "fr"):
        raise ValueError(f"target_lang: expected 'de' or 'fr', got {target_lang!r}")
    numbers = split_numbers(
        max_number, seed=seed, in_train=[n for n in in_train if n < max_number]
    )
    src_texts = {k: [number_words(n, "en") for n in v] for k, v in numbers.items()}
    tgt_texts = {
        k: [number_words(n, target_lang) for n in v] for k, v in numbers.items()
    }
    every = max(1, len(numbers["train"]) // TOKENIZER_TEXTS)  # a sample is enough
    src_tok = _make_tokenizer(
        src_tokenizer, src_texts["train"][::every], tgt_vocab_size
    )
    tgt_tok = _make_tokenizer(
        tgt_tokenizer, tgt_texts["train"][::every], tgt_vocab_size
    )
    src_ids = {k: src_tok.encode_batch(v) for k, v in src_texts.items()}
    tgt_ids = {
        k: [[BOS_ID, *ids, EOS_ID] for ids in tgt_tok.encode_batch(v)]
        for k, v in tgt_texts.items()
    }
    max_len = max(len(s) for ids in (*src_ids.values(), *tgt_ids.values()) for s in ids)
    return TranslationData(
        numbers, src_texts, tgt_texts, src_tok, tgt_tok, src_ids, tgt_ids, max_len
    )


def training_stream(
    data: TranslationData,
    *,
    small_repeats: int = 10,
    basic_repeats: int = 20,
    round_repeats: int = 4,
) -> tuple[list[list[int]], list[list[int]]]:
    """Chapter 6's training stream: every training pair once, then the pairs below
    1,000 ``small_repeats`` times more, the ``BASIC_NUMBERS`` ``basic_repeats`` times
    more and the round hundreds from 1,000 up (the rare targets that end right after
    "hundert"/"tausend") ``round_repeats`` times more, in that order. Rebalancing the
    data this way leaves the validation and test sets as they are.

    Returns:
        ``(src_ids, tgt_ids)``: two lists of id lists, of the same length.

    Raises:
        ValueError: if a repeat count is negative or not an int.
    """
    counts = {"small_repeats": small_repeats, "basic_repeats": basic_repeats}
    counts["round_repeats"] = round_repeats
    for name, value in counts.items():
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    rows = data.numbers["train"]
    extra = [i for i, n in enumerate(rows) if n < 1000] * small_repeats
    extra += [i for i, n in enumerate(rows) if n in BASIC_NUMBERS] * basic_repeats
    extra += [
        i for i, n in enumerate(rows) if n >= 1000 and n % 100 == 0
    ] * round_repeats
    src = data.src_ids["train"] + [data.src_ids["train"][i] for i in extra]
    tgt = data.tgt_ids["train"] + [data.tgt_ids["train"][i] for i in extra]
    return src, tgt


def train_translator(
    model,
    data: TranslationData,
    *,
    steps: int = TRANSLATOR_STEPS,
    batch_size: int = 128,
    seed: int = 0,
    max_seconds: float | None = None,
    eval_fn=None,
    eval_every: int = 0,
    progress: bool = True,
    device=None,
) -> History:
    """Chapter 6's training recipe, the one the chapter and
    ``benchmarks/translation.py`` both call: ``training_stream(data)`` in shuffled
    batches of ``batch_size`` (order seeded by ``seed``), AdamW (betas 0.9, 0.98,
    eps 1e-9, no weight decay), the Noam schedule with warmup 200, label smoothing
    0.1 and the gradient norm clipped at 1; at the end ``model`` gets the mean of its
    weights after each of the last ``TRANSLATOR_AVERAGE`` steps (all of them when
    ``steps`` is smaller; the average is PyTorch's ``AveragedModel``).

    Averaging is the paper's own last step (Vaswani et al. 2017, section 6.1: "a
    single model obtained by averaging the last 5 checkpoints"). At the end of a short
    run the rate is still large and the last weights sit wherever the last few batches
    pushed them; their mean over many steps does not depend on that, which makes
    the result much less dependent on the seed.

    Args:
        model: a ``Transformer`` (initialised by the caller, e.g. ``set_seed(seed)``
            then ``make_model(cfg)``). data: the corpus.
        steps: optimisation steps. max_seconds: a time guard for slow machines (the
            average then covers the steps done within the last
            ``TRANSLATOR_AVERAGE`` of ``steps``, or none).
        eval_fn, eval_every, progress: as ``fit`` (``eval_fn`` sees the weights of
            that step, not the average). device: where batches go.

    Returns:
        The ``History`` of ``fit``.

    Raises:
        ValueError / TypeError: for ``steps`` that is not an int >= 1; as ``fit``.
    """
    _validation.positive_int("steps", steps)
    src, tgt = training_stream(data)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0
    )
    generator = torch.Generator().manual_seed(seed)
    averaged = torch.optim.swa_utils.AveragedModel(model)  # an equal-weight mean

    def average(step: int) -> None:
        if step > steps - TRANSLATOR_AVERAGE:
            averaged.update_parameters(model)

    hist = fit(
        model,
        lambda: batches(src, tgt, batch_size, generator=generator, device=device),
        functools.partial(translation_loss, criterion=make_criterion(0.1)),
        optimizer,
        scheduler=noam_scheduler(optimizer, model.cfg.d_model, warmup=200),
        max_steps=steps,
        max_seconds=max_seconds,
        clip_norm=1.0,
        eval_fn=eval_fn,
        eval_every=eval_every,
        progress=progress,
        after_step=average,
    )
    if averaged.n_averaged > 0:
        with torch.no_grad():
            for p, mean in zip(model.parameters(), averaged.module.parameters()):
                p.copy_(mean)
    return hist
