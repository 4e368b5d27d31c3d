"""Chapter 8's self-checks: the library's own code passes, each known-wrong variant
fails with the message that names its mistake (``check.strict``) and returns False
(``check``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_course.contrastive import contrastive_loss
from transformer_course.exercises import (
    CheckError,
    ShapeError,
    check_clip_loss,
    check_patchify,
    pitfalls,
)
from transformer_course.vision import patchify


def _column_major(images, p):
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 4, 2, 1, 3, 5)
    return x.reshape(B, -1, C * p * p)  # patches top to bottom, then left to right


def _patches(images, p):  # the chapter's solution
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, -1, C * p * p)


def _scale(log_scale):
    return log_scale.exp().clamp(max=100.0)


def _clip(img, txt, log_scale):  # a learner's own, right
    i, t = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    logits = _scale(log_scale) * i @ t.T
    labels = torch.arange(len(img))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def test_patchify_check(quiet_check):
    assert quiet_check(check_patchify, _patches) is True
    with pytest.raises(CheckError, match="memory order"):  # the plain view
        check_patchify.strict(lambda x, p: x.reshape(x.shape[0], -1, 3 * p * p))
    with pytest.raises(CheckError, match="wrong order"):
        check_patchify.strict(_column_major)
    with pytest.raises(ShapeError, match="shape"):
        check_patchify.strict(lambda x, p: x.reshape(x.shape[0], -1))
    with pytest.raises(CheckError, match="differ"):
        check_patchify.strict(lambda x, p: _patches(x, p) + 1)
    assert quiet_check(check_patchify, _column_major) is False


def _unnormalised(img, txt, log_scale):
    labels = torch.arange(len(img))
    logits = _scale(log_scale) * img @ txt.T
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def test_clip_loss_check(quiet_check):
    assert quiet_check(check_clip_loss, _clip) is True
    with pytest.raises(CheckError, match="image-to-text"):
        check_clip_loss.strict(_one_sided)
    with pytest.raises(CheckError, match="not L2-normalised"):
        check_clip_loss.strict(_unnormalised)
    with pytest.raises(CheckError, match="not multiplied by the scale"):
        check_clip_loss.strict(lambda i, t, s: _clip(i, t, torch.tensor(0.0)))
    with pytest.raises(ShapeError, match="scalar"):
        check_clip_loss.strict(
            lambda i, t, s: F.normalize(i, dim=-1) @ F.normalize(t, dim=-1).T
        )
    with pytest.raises(CheckError, match="expected"):  # the scale applied twice
        check_clip_loss.strict(lambda i, t, s: _clip(i, t, 2 * s))
    assert quiet_check(check_clip_loss, _unnormalised) is False


# ------------------------------------------- the learner trial of 2026-12-01, chapter 8


def _one_sided(img, txt, log_scale):
    i, t = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    return F.cross_entropy(_scale(log_scale) * i @ t.T, torch.arange(len(img)))


def _clip_variant(
    *, logits_of, combine=lambda a, b: (a + b) / 2, dim=-1, second_t=True
):
    def fn(img, txt, log_scale):
        i, t = F.normalize(img, dim=dim), F.normalize(txt, dim=dim)
        logits = logits_of(i @ t.T, log_scale)
        labels = torch.arange(len(img))
        second = logits.T if second_t else logits
        return combine(F.cross_entropy(logits, labels), F.cross_entropy(second, labels))

    return fn


def _in_place(img, txt, log_scale):
    img /= img.norm(dim=-1, keepdim=True)
    txt /= txt.norm(dim=-1, keepdim=True)
    logits = _scale(log_scale) * img @ txt.T
    labels = torch.arange(len(img))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _patch_loop(images, p):
    B, C, H, W = images.shape
    return torch.stack(
        [
            images[:, :, r : r + p, c : c + p].reshape(B, C * p * p)
            for r in range(0, H, p)
            for c in range(0, W, p)
        ],
        1,
    )


def _channels_last(images, p):
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(B, -1, C * p * p)


def _pixels_transposed(images, p):
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 5, 3)
    return x.reshape(B, -1, C * p * p)


def _rows_split_the_other_way(images, p):
    B, C, H, W = images.shape
    x = images.reshape(B, C, p, H // p, W // p, p).permute(0, 3, 4, 1, 2, 5)
    return x.reshape(B, -1, C * p * p)


TRIAL = [
    (check_patchify, lambda x, p: x.view(x.shape[0], -1, 3 * p * p), "memory order"),
    (check_patchify, lambda x, p: x.reshape(x.shape[0], -1, p * p), "shape"),
    (check_patchify, _column_major, "wrong order"),
    (check_patchify, _channels_last, "channels last"),
    (check_patchify, _pixels_transposed, "(C, p_w, p_h)"),  # generic until 2026-12-03
    (check_patchify, _rows_split_the_other_way, "differ from the squares"),
    (check_patchify, lambda x, p: _patches(x.transpose(2, 3), p), "transposed image"),
    (check_patchify, _patch_loop, "it loops"),
    (check_patchify, patchify, "calls the library's"),
    (check_clip_loss, _unnormalised, "not L2-normalised"),
    (check_clip_loss, _one_sided, "image-to-text"),
    (
        check_clip_loss,
        _clip_variant(logits_of=lambda c, s: _scale(s) * c, second_t=False),
        "image-to-text",
    ),
    (check_clip_loss, _clip_variant(logits_of=lambda c, s: c / _scale(s)), "divided"),
    (
        check_clip_loss,
        _clip_variant(logits_of=lambda c, s: s * c),
        "used as the scale itself",
    ),
    (
        check_clip_loss,
        _clip_variant(logits_of=lambda c, s: s.exp() * c),
        "not clipped at 100",
    ),
    (
        check_clip_loss,
        _clip_variant(logits_of=lambda c, s: _scale(s) * c, combine=lambda a, b: a + b),
        "added, not averaged",
    ),
    (
        check_clip_loss,
        _clip_variant(logits_of=lambda c, s: _scale(s) * c, dim=0),
        "dim=0",
    ),
    (check_clip_loss, _in_place, "in place"),
    (check_clip_loss, contrastive_loss, "calls the library's"),
]


@pytest.mark.parametrize(
    "check, wrong, message", TRIAL, ids=[str(i) for i in range(len(TRIAL))]
)
def test_each_trial_mistake_of_chapter_8_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert "Traceback" not in printed
    assert len(printed.strip().splitlines()) == 2, printed


def test_in_place_normalisation_really_breaks_training():
    """The reason the check refuses it: backward through an in-place division fails."""
    leaf = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="inplace"):
        _in_place(leaf * 1, torch.randn(4, 3), torch.tensor(0.7)).backward()


# ----------------------------------------------- learner trial 2026-12-03 (issue 39)
TRIAL_2026_12_03 = [
    # findings 1b and 1c: accepted in the trial (the check's log_scale had no grad)
    (pitfalls.clip_loss_scale_item, "no gradient with respect to log_scale"),
    (pitfalls.clip_loss_math_exp, "no gradient with respect to log_scale"),
    # finding 5: generic in the trial
    (pitfalls.clip_loss_clamp_min, "at least 100 instead of at most"),
    (pitfalls.clip_loss_clamp_log_after_exp, "applied after exp"),
]


@pytest.mark.parametrize(
    "wrong, message", TRIAL_2026_12_03, ids=[w.__name__ for w, _ in TRIAL_2026_12_03]
)
def test_each_mistake_of_the_2026_12_03_trial_gets_its_own_message(
    wrong, message, capsys
):
    assert check_clip_loss(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert len(printed.strip().splitlines()) == 2, printed


def test_the_detached_scale_really_gets_no_gradient():
    """Why the check refuses it: the right answer's log_scale has a gradient."""
    img, txt = torch.randn(4, 3), torch.randn(4, 3)
    for fn, has_grad in ((_clip, True), (pitfalls.clip_loss_scale_item, False)):
        log_scale = torch.tensor(1.0, requires_grad=True)
        loss = fn(img, txt, log_scale)
        assert loss.requires_grad is has_grad


@pytest.mark.parametrize(
    "wrong, message",
    [
        (
            lambda x, p: (
                _patches(x, p)
                .reshape(x.shape[0], -1, x.shape[1], p, p)
                .transpose(-2, -1)
                .flatten(2)
            ),
            "(C, p_w, p_h)",
        ),
        (
            lambda x, p: _patches(x[:, :1].expand_as(x).contiguous(), p),
            "channel 0 was repeated",
        ),
    ],
    ids=["columns-first", "first-channel"],
)
def test_the_patchify_answers_of_the_2026_12_03_trial_are_named(wrong, message):
    """Finding 5: both got "the patches differ from the squares of the image"."""
    with pytest.raises(
        CheckError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        check_patchify.strict(wrong)
