"""Chapter 8, attention beyond text: patches and the CLIP-style contrastive loss.

The references are written out here (loops over patches; the loss with explicit sums),
so a check does not trust the library code it is testing a learner against.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from transformer_course.contrastive import contrastive_loss
from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids, loops_over
from transformer_course.vision import patchify


def _loop_patches(images: Tensor, p: int, channels_last: bool = False) -> Tensor:
    """(B, C, H, W) -> (B, N, C * p * p), each patch flattened as (C, p, p), or as
    (p, p, C) with ``channels_last``."""
    B, _, H, W = images.shape
    out = []
    for r in range(H // p):
        for c in range(W // p):
            patch = images[
                :, :, r * p : (r + 1) * p, c * p : (c + 1) * p
            ]  # (B, C, p, p)
            out.append(
                (patch.permute(0, 2, 3, 1) if channels_last else patch).reshape(B, -1)
            )
    return torch.stack(out, dim=1)  # (B, N, C * p * p)


@exercise_check
@forbids(patchify)
def check_patchify(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 8, exercise "find the bug: patchify colour images": ``fn(images, p)``
    must turn (B, C, H, W) images into (B, N, C * p * p) square patches in row-major
    patch order, each patch flattened as (C, p, p), the order of a ``Conv2d(C, D, p,
    stride=p)`` patch embedding's weight (Dosovitskiy et al. 2021, section 3.1).

    Raises:
        CheckError: for a wrong shape, the plain ``reshape`` / ``view`` that cuts rows
            into strips, a column-major patch order, channels last inside a patch, the
            height and width swapped, a loop over patches or images, a call to the
            library's ``patchify``, or any other difference.
    """
    images = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    want = _loop_patches(images, 4)  # (2, 6, 48)
    got = fn(images, 4)
    if not isinstance(got, Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        fail(
            "expected a tensor of shape {want_shape} (B, N, C * p * p), got {shape}",
            "N = (H / p) * (W / p) patches, each holding p * p pixels of all C "
            "channels.",
            kind=ShapeError,
            want_shape=tuple(want.shape),
            shape=shape,
        )
    if torch.equal(got, want):
        small, large = torch.zeros(1, 3, 8, 8), torch.zeros(3, 3, 16, 16)
        if loops_over(fn, (small, 4), (large, 4)):
            fail(
                "your function runs more operations for more images or more patches: "
                "it loops, which the exercise asks you not to do",
                "one reshape gives each patch row, patch column and pixel its own "
                "axis; one permute puts them in order.",
            )
        return passed("square colour patches in row-major order, flattened (C, p, p)")
    if torch.equal(got, images.reshape(2, -1, 48)):
        fail(
            "each 'patch' is 48 consecutive numbers in memory (pixel rows of one "
            "channel), not a 4 x 4 square of all 3 channels: a reshape keeps the "
            "memory order",
            "a square patch takes p pixels from each of p rows, in every channel: "
            "give the rows and the columns their own patch and within-patch axes "
            "before flattening.",
        )
    if torch.equal(got, _loop_patches(images, 4, channels_last=True)):
        fail(
            "the right squares in the right order, but each patch is flattened "
            "(p, p, C), channels last",
            "the exercise asks for (C, p, p), the order of a Conv2d patch "
            "embedding's weight: the channel axis goes first within a patch.",
        )
    if torch.equal(got, _loop_patches(images.transpose(2, 3), 4)):
        fail(
            "your patches are the squares of the transposed image: the height and "
            "width axes were swapped",
            "images are (B, C, H, W): the first spatial axis is the rows.",
        )
    per_patch = want.reshape(2, 6, 3, 4, 4)  # (B, N, C, p_h, p_w)
    if torch.equal(got, per_patch.transpose(-2, -1).reshape(2, 6, 48)):
        fail(
            "the right squares in the right order, but each patch is flattened "
            "(C, p_w, p_h): within a channel, column by column",
            "flatten each channel of a patch row by row, (C, p_h, p_w), as the "
            "Conv2d weight is laid out.",
        )
    if torch.equal(
        got, per_patch[:, :, :1].expand(-1, -1, 3, -1, -1).reshape(2, 6, 48)
    ):
        fail(
            "every channel of a patch holds the first channel's pixels: the "
            "channels were not taken from the image, channel 0 was repeated",
            "each of the C channels contributes its own p x p pixels: "
            "images[:, c] for every c.",
        )
    same_set = all(any(torch.equal(a, b) for b in want[0]) for a in got[0])
    if same_set:
        fail(
            "the patches are the right squares, in the wrong order",
            "patch n = r * (W / p) + c: left to right, then top to bottom.",
        )
    fail(
        "the patches differ from the squares of the image",
        "compare fn(x, 4)[0, 0] with x[0, :, :4, :4].flatten().",
    )


def _hand_loss(img: Tensor, txt: Tensor, scale: float) -> float:
    i = F.normalize(img.double(), dim=-1)
    t = F.normalize(txt.double(), dim=-1)
    B = len(i)
    total = 0.0
    for k in range(B):  # image k among the texts, and text k among the images
        row = [scale * float(i[k] @ t[j]) for j in range(B)]
        col = [scale * float(i[j] @ t[k]) for j in range(B)]
        total += -row[k] + math.log(sum(math.exp(v) for v in row))
        total += -col[k] + math.log(sum(math.exp(v) for v in col))
    return total / (2 * B)


MAX_SCALE = 100.0  # CLIP clips the logit scale at 100 (Radford et al. 2021, 2.5)


@exercise_check
@forbids(contrastive_loss)
def check_clip_loss(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> bool:
    """Chapter 8, exercise "InfoNCE with CLIP's learned temperature": ``fn(image_emb,
    text_emb, log_scale)`` on (B, E) embeddings (not yet normalised) and the learned
    parameter as CLIP stores it, the log of the logit scale (a 0-d tensor), must return
    CLIP's symmetric loss with the scale exp(log_scale) clipped at 100 (Radford et al.
    2021, figure 3 and section 2.5).

    Raises:
        CheckError: for a non-scalar result, inputs changed in place (``backward``
            then fails in training), missing L2 normalisation or one over the batch
            axis, log_scale used as the scale, a scale that is not clipped, missing or
            divided by, the one-sided loss (images to texts only), the two directions
            summed, not averaged, a clip from below (clamp(min=100)) or at log(100)
            after exp, a loss with no gradient with respect to log_scale (``.item()``,
            ``math.exp``: the temperature is never learned), a call to the library's
            ``contrastive_loss``, or any other difference.
    """
    g = torch.Generator().manual_seed(8)
    img, txt = 3 * torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    for log_scale in (math.log(4.0), 5.0):  # scale 4, and exp(5) = 148 clipped to 100
        _check_clip_once(fn, img, txt, log_scale)
    return passed(
        "symmetric InfoNCE on normalised embeddings, scale exp(log_scale) clipped at 100"
    )


def _check_scale_gradient(loss: Tensor, log_scale: Tensor, img, txt) -> None:
    """A right value is not enough: CLIP learns log_scale, so the loss must carry its
    gradient (learner trial 2026-12-03: ``.item()`` and ``math.exp`` passed)."""
    grad = None
    if loss.requires_grad:
        (grad,) = torch.autograd.grad(loss.sum(), log_scale, allow_unused=True)
    ref = log_scale.detach().clone().requires_grad_(True)
    i, t = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    labels = torch.arange(len(img))
    logits = ref.exp().clamp(max=MAX_SCALE) * i @ t.T
    want = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    (want_grad,) = torch.autograd.grad(want, ref)
    if grad is None or float(grad) == 0.0:
        fail(
            "the loss is right, but it has no gradient with respect to log_scale "
            "(expected d loss / d log_scale = {want:.3f}): the scale was taken out "
            "of the graph, so CLIP's temperature would never be learned",
            "keep the scale a tensor: log_scale.exp().clamp(max=100), not .item(), "
            "math.exp or float().",
            want=float(want_grad),
        )
    if not math.isclose(float(grad), float(want_grad), rel_tol=1e-3, abs_tol=1e-5):
        fail(
            "the loss is right, but its gradient with respect to log_scale is "
            "{got:.4f}, expected {want:.4f}",
            "compute the scale from log_scale with torch operations only, "
            "exp then clamp(max=100).",
            got=float(grad),
            want=float(want_grad),
        )


def _check_clip_once(fn, img: Tensor, txt: Tensor, log_scale: float) -> None:
    scale = min(math.exp(log_scale), MAX_SCALE)
    want = _hand_loss(img, txt, scale)
    img_in, txt_in = img.clone(), txt.clone()
    versions = img_in._version, txt_in._version
    log_scale_in = torch.tensor(log_scale, requires_grad=True)  # a parameter, learned
    got = fn(img_in, txt_in, log_scale_in)
    if (img_in._version, txt_in._version) != versions or not (
        torch.equal(img_in, img) and torch.equal(txt_in, txt)
    ):
        fail(
            "your function changed its input embeddings in place (e.g. with /=): in "
            "training, backward() then fails, because autograd needs the embeddings "
            "as the encoders produced them",
            "normalise into new tensors (x = x / ...), leaving the arguments as "
            "they are.",
        )
    if not isinstance(got, Tensor) or got.numel() != 1:
        fail(
            "expected a scalar loss tensor",
            "return the mean of the two losses.",
            kind=ShapeError,
        )
    loss, got = got, float(got.detach())
    if math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5):
        if scale < MAX_SCALE:  # not clipped: the loss must depend on log_scale
            _check_scale_gradient(loss, log_scale_in, img, txt)
        return
    fields = {"log_scale": log_scale, "got": got, "want": want}
    value = gettext(
        "log_scale = {log_scale:.3f}: loss = {got:.5f}, expected {want:.5f}"
    ).format(**fields)
    if math.isclose(got, _hand_loss(img, txt, log_scale), rel_tol=1e-4):
        fail(
            "{value}: log_scale was used as the scale itself",
            "CLIP learns the log of the scale, so that it stays positive: "
            "exponentiate it first.",
            value=value,
        )
    if scale < math.exp(log_scale) and math.isclose(
        got, _hand_loss(img, txt, math.exp(log_scale)), rel_tol=1e-4
    ):
        fail(
            "{value}: the scale exp({log_scale:g}) = {exp:.1f} was not clipped at 100",
            "CLIP clips the scale so that training stays stable: the largest scale "
            "it allows is 100.",
            value=value,
            log_scale=log_scale,
            exp=math.exp(log_scale),
        )
    for clipped, message, hint in (
        (
            max(math.exp(log_scale), MAX_SCALE),
            N_(
                "{value}: the scale is {scale:.1f}, at least 100 instead of at most "
                "100: clamp(min=...) raises small scales"
            ),
            N_("clip from above: the largest scale allowed is 100 (clamp(max=100))."),
        ),
        (
            min(math.exp(log_scale), math.log(MAX_SCALE)),
            N_(
                "{value}: the scale is {scale:.2f}: the clip at log(100) = 4.61 was "
                "applied after exp, to the scale itself"
            ),
            N_(
                "clip log_scale at log(100) before exp, or the scale exp(log_scale) "
                "at 100 after it."
            ),
        ),
    ):
        if not math.isclose(clipped, scale) and math.isclose(
            got, _hand_loss(img, txt, clipped), rel_tol=1e-4
        ):
            fail(message, hint, value=value, scale=clipped)
    labels = torch.arange(len(img))
    i, t = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)

    def both(logits: Tensor) -> Tensor:  # the two cross-entropies, not yet averaged
        return F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)

    i0, t0 = F.normalize(img, dim=0), F.normalize(txt, dim=0)
    for wrong, message, hint in (
        (
            both(scale * img @ txt.T) / 2,
            N_("the embeddings are not L2-normalised"),
            N_("F.normalize(x, dim=-1)."),
        ),
        (
            F.cross_entropy(scale * i @ t.T, labels),
            N_("only the image-to-text direction is scored"),
            N_("add the cross-entropy of logits.T (texts choosing images) and halve."),
        ),
        (
            both(i @ t.T) / 2,
            N_("the cosine similarities are not multiplied by the scale"),
            N_("the scale multiplies the cosines before the softmax."),
        ),
        (
            both(i @ t.T / scale) / 2,
            N_("the cosine similarities are divided by the scale"),
            N_(
                "the scale is the inverse of a temperature: a larger scale must "
                "make the softmax sharper."
            ),
        ),
        (
            both(scale * i @ t.T),
            N_(
                "{value}, twice the expected: the two directions are added, not averaged"
            ),
            N_("the loss is the mean of the image-to-text and text-to-image terms."),
        ),
        (
            both(scale * i0 @ t0.T) / 2,
            N_(
                "each embedding dimension was normalised over the batch (dim=0), "
                "not each embedding over its features"
            ),
            N_(
                "cosine similarity divides each row by its own length: which axis "
                "holds one embedding's features?"
            ),
        ),
    ):
        if math.isclose(got, float(wrong), rel_tol=1e-4):
            fail(message, hint, value=value)
    fail(
        "log_scale = {log_scale:.3f}: loss = {got:.5f}, expected {want:.5f}",
        "compute the loss of B = 2 pairs by hand: the normalised embeddings, the "
        "scaled cosines, then each row's and each column's cross-entropy.",
        **fields,
    )
