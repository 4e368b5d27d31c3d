"""Chapter 8's self-checks: the library's own code passes, each known-wrong variant
fails with the message that names its mistake (``check.strict``) and returns False
(``check``)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from transformer_course.contrastive import contrastive_loss
from transformer_course.exercises import (
    CheckError,
    ShapeError,
    check_clip_loss,
    check_patchify,
)
from transformer_course.vision import patchify


def _column_major(images, p):
    B, H, W = images.shape
    x = images.reshape(B, H // p, p, W // p, p).permute(0, 3, 1, 2, 4)
    return x.reshape(B, -1, p * p)  # patches top to bottom, then left to right


def test_patchify_check(quiet_check):
    assert quiet_check(check_patchify, patchify) is True
    with pytest.raises(CheckError, match="strip"):  # the tutorial's plain view
        check_patchify.strict(lambda x, p: x.reshape(x.shape[0], -1, p * p))
    with pytest.raises(CheckError, match="wrong order"):
        check_patchify.strict(_column_major)
    with pytest.raises(ShapeError, match="shape"):
        check_patchify.strict(lambda x, p: x.reshape(x.shape[0], -1))
    with pytest.raises(CheckError, match="differ"):
        check_patchify.strict(lambda x, p: patchify(x, p) + 1)
    assert quiet_check(check_patchify, _column_major) is False


def _unnormalised(img, txt, scale):
    labels = torch.arange(len(img))
    logits = scale * img @ txt.T
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def test_clip_loss_check(quiet_check):
    assert quiet_check(check_clip_loss, contrastive_loss) is True
    with pytest.raises(CheckError, match="image-to-text"):
        check_clip_loss.strict(functools.partial(contrastive_loss, symmetric=False))
    with pytest.raises(CheckError, match="not L2-normalised"):
        check_clip_loss.strict(_unnormalised)
    with pytest.raises(CheckError, match="logit_scale"):
        check_clip_loss.strict(lambda i, t, s: contrastive_loss(i, t, 1.0))
    with pytest.raises(ShapeError, match="scalar"):
        check_clip_loss.strict(
            lambda i, t, s: F.normalize(i, dim=-1) @ F.normalize(t, dim=-1).T
        )
    with pytest.raises(CheckError, match="expected"):  # the scale applied twice
        check_clip_loss.strict(lambda i, t, s: contrastive_loss(i, t, s * s))
    assert quiet_check(check_clip_loss, _unnormalised) is False
