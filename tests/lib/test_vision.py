"""Chapter 8: patches, the image encoder, the captioner and the digit images."""

from __future__ import annotations

import pytest
import torch

from transformer_course.attention import MultiHeadAttention
from transformer_course.data import BOS_ID
from transformer_course.decoding import beam_search, greedy_decode
from transformer_course.digit_images import (
    DIGIT_SIZE,
    number_images,
    split_digit_images,
)
from transformer_course.model import set_attention_backend
from transformer_course.vision import (
    Captioner,
    ImageEncoder,
    PatchEmbedding,
    cell_of_patch,
    cross_attention,
    patchify,
)


def loop_patches(images, p):
    """The definition, one patch at a time: row-major patches, row-major pixels."""
    B, H, W = images.shape
    out = []
    for r in range(H // p):
        for c in range(W // p):
            out.append(
                images[:, r * p : (r + 1) * p, c * p : (c + 1) * p].reshape(B, -1)
            )
    return torch.stack(out, dim=1)  # (B, N, p * p)


@pytest.mark.parametrize("shape,p", [((2, 8, 32), 4), ((1, 6, 9), 3), ((3, 4, 4), 2)])
def test_patch_order_matches_the_loop(shape, p):
    x = torch.randn(*shape)
    assert torch.equal(patchify(x, p), loop_patches(x, p))


def test_the_wrong_view_is_not_patchify():
    """The find-the-bug: a plain reshape cuts pixel rows into strips, not squares."""
    x = torch.arange(2 * 8 * 32, dtype=torch.float32).reshape(2, 8, 32)
    wrong = x.reshape(2, -1, 16)  # same shape as the right answer
    assert wrong.shape == patchify(x, 4).shape
    assert not torch.equal(wrong, loop_patches(x, 4))


def test_patch_zero_is_the_top_left_square():
    x = torch.arange(64.0).reshape(1, 8, 8)
    assert patchify(x, 4)[0, 0].tolist() == [
        0,
        1,
        2,
        3,
        8,
        9,
        10,
        11,
        16,
        17,
        18,
        19,
        24,
        25,
        26,
        27,
    ]
    assert patchify(x, 4)[0, 1, 0].item() == 4  # next patch: to the right


def test_patchify_rejects_bad_input():
    with pytest.raises(ValueError, match="patch_size"):
        patchify(torch.zeros(1, 8, 30), 4)
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        patchify(torch.zeros(8, 32), 4)
    with pytest.raises(TypeError, match="floating-point"):
        patchify(torch.zeros(1, 8, 32, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="images"):
        PatchEmbedding((8, 32), 4, 16)(torch.zeros(1, 8, 16))


def test_cell_of_patch():
    cells = cell_of_patch((2, 8), 4)
    assert cells.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    with pytest.raises(ValueError, match="n_cells"):
        cell_of_patch((2, 8), 3)


def small_captioner(tiny_config, pool=False):
    # these sizes and seed give an untrained model that never emits the padding id
    # mid-caption, where cached and uncached greedy decoding part ways (pad is hidden
    # as a key only in the uncached prefix)
    cfg = tiny_config(d_model=16, n_heads=2, d_ff=32, n_layers=1)
    torch.manual_seed(0)
    return Captioner(cfg, (8, 16), 4, pool=pool).eval()


@pytest.mark.parametrize("pool", [False, True])
def test_caption_decoding_with_and_without_the_kv_cache_agree(pool, tiny_config):
    model = small_captioner(tiny_config, pool)
    images = torch.rand(5, 8, 16)
    cached = greedy_decode(model, images, 8, use_cache=True)
    uncached = greedy_decode(model, images, 8, use_cache=False)
    assert cached == uncached
    assert any(len(c) > 0 for c in cached)
    assert beam_search(model, images, 8, beam_size=1, length_penalty=0.0) == cached


def test_pooled_encoder_has_one_vector_and_the_grid_has_n(tiny_config):
    cfg = tiny_config(d_model=16, n_layers=1)  # d_model: the 16 asserted below
    x = torch.rand(3, 8, 16)
    assert ImageEncoder(cfg, (8, 16), 4)(x).shape == (3, 8, 16)
    assert ImageEncoder(cfg, (8, 16), 4, pool=True)(x).shape == (3, 1, 16)


def test_cross_attention_rows_sum_to_one(tiny_config):
    model = small_captioner(tiny_config)
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 0]])
    w = cross_attention(model, torch.rand(2, 8, 16), tgt)
    assert w.shape == (2, 3, 8)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3), atol=1e-5)


def test_digit_image_split_is_disjoint_and_complete():
    """The 1,797 images of load_digits are all different, so the splits may share no
    image at all (a split of composed number images would share digit images)."""
    splits = split_digit_images()
    sets = {k: {tuple(im.flatten().tolist()) for im in v[0]} for k, v in splits.items()}
    assert sum(len(s) for s in sets.values()) == 1797
    assert sets["train"].isdisjoint(sets["test"])
    assert sets["train"].isdisjoint(sets["valid"])
    assert sets["valid"].isdisjoint(sets["test"])
    for images, labels in splits.values():
        assert set(labels.tolist()) == set(range(10))  # every digit in every split
    with pytest.raises(ValueError, match="fractions"):
        split_digit_images((0.5, 0.5, 0.5))


def test_number_images_place_each_digit_in_its_cell():
    images, labels = split_digit_images()["test"]
    g = torch.Generator().manual_seed(0)
    x = number_images([4231, 7, 50], images, labels, shift=0, generator=g)
    assert x.shape == (3, DIGIT_SIZE, 32)
    assert x[1, :, :24].abs().sum() == 0  # 7: three blank cells, then the digit
    assert x[2, :, :16].abs().sum() == 0
    cells = x[0].reshape(8, 4, 8).permute(1, 0, 2)  # (cells, 8, 8)
    for cell, digit in zip(cells, (4, 2, 3, 1)):  # each cell is an image of its digit
        assert any(torch.equal(cell, im) for im in images[labels == digit])
    with pytest.raises(ValueError, match="numbers"):
        number_images([10_000], images, labels)


def test_cross_attention_of_an_sdpa_model_uses_naive_and_restores_the_backend(
    tiny_config,
):
    model = small_captioner(tiny_config)
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 0]])
    images = torch.rand(2, 8, 16)
    want = cross_attention(model, images, tgt)  # built with the "naive" backend
    set_attention_backend(model, "sdpa")
    got = cross_attention(model, images, tgt)
    assert torch.allclose(got, want, atol=1e-6)
    backends = {m.backend for m in model.modules() if isinstance(m, MultiHeadAttention)}
    assert backends == {"sdpa"}  # given back, not left on "naive"
