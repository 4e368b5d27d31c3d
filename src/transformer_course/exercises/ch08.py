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
from transformer_course.exercises._method import loops_over, own_code
from transformer_course.vision import patchify


def _loop_patches(images: Tensor, p: int) -> Tensor:
    B, H, W = images.shape
    out = [
        images[:, r * p : (r + 1) * p, c * p : (c + 1) * p].reshape(B, p * p)
        for r in range(H // p)
        for c in range(W // p)
    ]
    return torch.stack(out, dim=1)  # (B, N, p * p)


@exercise_check
def check_patchify(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """Chapter 8, exercise "find the bug: patchify": ``fn(images, p)`` must turn
    (B, H, W) images into (B, N, p * p) square patches, row-major patch order.

    Raises:
        CheckError: for a wrong shape, the plain ``reshape`` / ``view`` that cuts rows
            into strips, a column-major patch order, a loop over patches or images,
            a call to the library's ``patchify``, or any other difference.
    """
    fn = own_code(fn, patchify)
    images = torch.arange(2 * 8 * 12, dtype=torch.float32).reshape(2, 8, 12)
    want = _loop_patches(images, 4)  # (2, 6, 16)
    got = fn(images, 4)
    if not isinstance(got, Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        fail(
            f"expected a tensor of shape {tuple(want.shape)} (B, N, p * p), got "
            f"{shape}",
            "N = (H / p) * (W / p) patches of p * p pixels each.",
            kind=ShapeError,
        )
    if torch.equal(got, want):
        small, large = torch.zeros(1, 8, 8), torch.zeros(3, 16, 16)
        if loops_over(fn, (small, 4), (large, 4)):
            fail(
                "your function runs more operations for more images or more patches: "
                "it loops, which the exercise asks you not to do",
                "one reshape gives each patch row, patch column and pixel its own "
                "axis; one permute puts them in order.",
            )
        return passed("square patches in row-major order")
    if torch.equal(got, images.reshape(2, -1, 16)):
        fail(
            "each 'patch' is 16 consecutive pixels of one image row (a strip), not a "
            "4 x 4 square: a reshape keeps the memory order of the pixels",
            "a square patch takes p pixels from each of p rows: give the rows and "
            "the columns their own patch and within-patch axes before flattening.",
        )
    if torch.equal(got, _loop_patches(images.transpose(1, 2), 4)):
        fail(
            "your patches are the squares of the transposed image: the height and "
            "width axes were swapped",
            "images are (B, H, W): the first spatial axis is the rows.",
        )
    same_set = all(any(torch.equal(a, b) for b in want[0]) for a in got[0])
    if same_set:
        fail(
            "the patches are the right squares, in the wrong order",
            "patch n = r * (W / p) + c: left to right, then top to bottom.",
        )
    fail(
        "the patches differ from the squares of the image",
        "compare fn(x, 4)[0, 0] with x[0, :4, :4].flatten().",
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


@exercise_check
def check_clip_loss(fn: Callable[[Tensor, Tensor, float], Tensor]) -> bool:
    """Chapter 8, exercise "the symmetric InfoNCE loss": ``fn(image_emb, text_emb,
    logit_scale)`` on (B, E) embeddings (not yet normalised) must return CLIP's loss.

    Raises:
        CheckError: for a non-scalar result, inputs changed in place (``backward``
            then fails in training), missing L2 normalisation or one over the batch
            axis, a scale that is missing, divided by or exponentiated, the one-sided
            loss (images to texts only), the two directions summed, not averaged, a
            call to the library's ``contrastive_loss``, or any other difference.
    """
    fn = own_code(fn, contrastive_loss)
    g = torch.Generator().manual_seed(8)
    img, txt = 3 * torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    scale = 4.0
    want = _hand_loss(img, txt, scale)
    img_in, txt_in = img.clone(), txt.clone()
    versions = img_in._version, txt_in._version
    got = fn(img_in, txt_in, scale)
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
    got = float(got)
    if math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5):
        return passed("symmetric InfoNCE on normalised embeddings, scaled")
    labels = torch.arange(6)
    unnorm = (
        F.cross_entropy(scale * img @ txt.T, labels)
        + F.cross_entropy(scale * txt @ img.T, labels)
    ) / 2
    i, t = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    one_sided = F.cross_entropy(scale * i @ t.T, labels)
    unscaled = (F.cross_entropy(i @ t.T, labels) + F.cross_entropy(t @ i.T, labels)) / 2

    def both(logits: Tensor) -> Tensor:  # the two cross-entropies, not yet averaged
        return F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)

    i0, t0 = F.normalize(img, dim=0), F.normalize(txt, dim=0)
    for wrong, message, hint in (
        (unnorm, "the embeddings are not L2-normalised", "F.normalize(x, dim=-1)."),
        (
            one_sided,
            "only the image-to-text direction is scored",
            "add the cross-entropy of logits.T (texts choosing images) and halve.",
        ),
        (
            unscaled,
            "the cosine similarities are not multiplied by logit_scale",
            "the scale multiplies the cosines before the softmax.",
        ),
        (
            both(i @ t.T / scale) / 2,
            "the cosine similarities are divided by logit_scale",
            (
                "logit_scale is the inverse of a temperature: a larger scale must make "
                "the softmax sharper."
            ),
        ),
        (
            both(math.exp(scale) * i @ t.T) / 2,
            "the cosines are multiplied by exp(logit_scale)",
            (
                "here logit_scale is the scale itself, not its logarithm (CLIP's code "
                "stores the log and exponentiates it; this exercise passes the result)."
            ),
        ),
        (
            both(scale * i @ t.T),
            (
                f"loss = {got:.5f}, twice the expected {want:.5f}: the two directions are "
                "added, not averaged"
            ),
            "the loss is the mean of the image-to-text and text-to-image terms.",
        ),
        (
            both(scale * i0 @ t0.T) / 2,
            (
                "each embedding dimension was normalised over the batch (dim=0), not "
                "each embedding over its features"
            ),
            (
                "cosine similarity divides each row by its own length: which axis holds "
                "one embedding's features?"
            ),
        ),
    ):
        if math.isclose(got, float(wrong), rel_tol=1e-4):
            fail(message, hint)
    fail(
        f"loss = {got:.5f}, expected {want:.5f}",
        "compute the loss of B = 2 pairs by hand: the normalised embeddings, the "
        "scaled cosines, then each row's and each column's cross-entropy.",
    )
