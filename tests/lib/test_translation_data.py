"""Tokenizers, the number-words corpus and its split, batching, the Shakespeare loader
(chapters 6 and 7)."""

import random

import pytest
from num2words import num2words

from transformer_course.data import (
    BOS_ID,
    EOS_ID,
)
from transformer_course.translation_data import (
    BASIC_NUMBERS,
    make_translation_data,
    number_words,
    split_numbers,
    training_stream,
)

param = pytest.mark.parametrize


def _disjoint(splits: dict[str, list[int]]) -> bool:
    seen = [set(v) for v in splits.values()]
    return sum(map(len, seen)) == len(set().union(*seen))


def _basic_in_train(splits: dict[str, list[int]], basic=BASIC_NUMBERS) -> bool:
    return set(basic) <= set(splits["train"])


def test_split_by_value_is_disjoint_and_complete():
    splits = split_numbers(10_000, seed=0)
    assert _disjoint(splits)
    assert set().union(*map(set, splits.values())) == set(range(1, 10_000))
    assert [len(v) for v in splits.values()] == [7999, 999, 1001]
    assert split_numbers(10_000, seed=0) == splits  # deterministic
    # known wrong: a split with a shared number is caught by the same check
    assert not _disjoint({"train": [1, 2, 3], "test": [3, 4]})
    with pytest.raises(ValueError, match="fractions"):
        split_numbers(100, (0.5, 0.5, 0.5))


def test_split_keeps_basic_numbers_in_train():
    plain = split_numbers(100_000, seed=0)
    kept = split_numbers(100_000, seed=0, in_train=BASIC_NUMBERS)
    # known wrong: the plain random split holds out some basic numbers (seed 0: 1, 5)
    assert not _basic_in_train(plain)
    assert {1, 5} <= set(plain["test"])
    assert _basic_in_train(kept) and _disjoint(kept)
    assert set().union(*map(set, kept.values())) == set(range(1, 100_000))
    assert [len(v) for v in kept.values()] == [len(v) for v in plain.values()]
    # the cuts move by at most len(BASIC_NUMBERS) places: the test split barely changes
    assert len(set(kept["test"]) - set(plain["test"])) <= len(BASIC_NUMBERS)
    # every standalone word form is a training source by itself
    data = make_translation_data(2_000, seed=0)
    assert _basic_in_train(data.numbers)
    assert {"one", "five", "one thousand"} <= set(data.src_texts["train"])
    assert "five" not in make_translation_data(2_000, in_train=()).src_texts["train"]
    with pytest.raises(ValueError, match="in_train"):
        split_numbers(100, in_train=[0, 1])
    with pytest.raises(ValueError, match="in_train"):
        split_numbers(10, in_train=range(1, 10))


@param("lang", ["en", "de", "fr"])
def test_number_words_equal_num2words(lang):
    rng = random.Random(lang)
    for n in [
        0,
        1,
        42,
        100,
        101,
        1000,
        1001,
        21_000,
        70_001,
        99_999,
        123_456,
        *rng.sample(range(1_000_000), 300),
    ]:
        assert number_words(n, lang) == num2words(n, lang=lang), n
    with pytest.raises(ValueError, match="n:"):
        number_words(1_000_000)


def test_translation_data_small():
    data = make_translation_data(12_000, tgt_vocab_size=60)
    assert _disjoint(data.numbers)
    n = data.numbers["test"][0]
    i = 0
    assert data.src_texts["test"][i] == num2words(n)
    assert data.tgt_texts["test"][i] == num2words(n, lang="de")
    tgt = data.tgt_ids["test"][i]
    assert tgt[0] == BOS_ID and tgt[-1] == EOS_ID
    assert data.tgt_tok.decode(tgt) == data.tgt_texts["test"][i]
    assert data.max_len == max(len(s) for v in data.tgt_ids.values() for s in v)


def test_training_stream_repeats_the_rare_pairs():
    data = make_translation_data(12_000, tgt_vocab_size=60)
    src, tgt = training_stream(
        data, small_repeats=10, basic_repeats=20, round_repeats=4
    )
    train = data.numbers["train"]
    by_source = {tuple(s): n for s, n in zip(data.src_ids["train"], train)}
    counts = {n: 0 for n in train}
    for s in src:
        counts[by_source[tuple(s)]] += 1
    for n in train:  # once, plus each rule that picks it
        want = 1 + 10 * (n < 1000) + 20 * (n in BASIC_NUMBERS)
        want += 4 * (n >= 1000 and n % 100 == 0)
        assert counts[n] == want, n
    assert len(src) == len(tgt) and src[: len(train)] == data.src_ids["train"]
    pairs = dict(
        zip(map(tuple, data.src_ids["train"]), map(tuple, data.tgt_ids["train"]))
    )
    assert all(
        pairs[tuple(s)] == tuple(t) for s, t in zip(src, tgt)
    )  # pairs kept together
    plain, _ = training_stream(data, small_repeats=0, basic_repeats=0, round_repeats=0)
    assert plain == data.src_ids["train"]
    with pytest.raises(ValueError, match="round_repeats"):
        training_stream(data, round_repeats=-1)
