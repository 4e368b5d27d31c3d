"""Self-checks for chapter 9's exercises ("Smaller models").

Same contract as ``checks.py``: a check prints a line starting with "passed" on
success, raises ``CheckError`` with a hint on failure, and returns False (printing
"not attempted yet") while the learner's function still raises NotImplementedError.
The lead moves these into ``exercises/`` (one module per chapter) at merge.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.checks import _fail, _passed, not_attempted_is_false
from transformer_course.distill import mean_pool, neighbour_agreement, soft_target_loss

Tensor = torch.Tensor


@not_attempted_is_false
def check_mean_pool(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """Chapter 9, exercise "mean pooling": ``fn(hidden, mask)`` with hidden (B, S, D)
    and mask (B, S) bool must return the mean of the real tokens' vectors (B, D)
    (Reimers and Gurevych 2019).

    Raises:
        CheckError: with a hint for padding counted in the mean or the wrong axis.
    """
    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(4, 6, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0],
                         [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    got, want = fn(hidden, mask), mean_pool(hidden, mask)
    if not isinstance(got, Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        _fail(f"expected a tensor of shape {tuple(want.shape)}, got {shape}",
              "average over the token axis (dim 1).")
    if torch.allclose(got, hidden.mean(1), atol=1e-5):
        _fail("the padded tokens are averaged in too",
              "multiply by the mask and divide by the number of real tokens.")
    if not torch.allclose(got, want, atol=1e-5):
        _fail("the pooled vectors differ from the mean of the real tokens",
              "sum(hidden * mask[..., None], dim=1) / mask.sum(1, keepdim=True).")
    return _passed("mean pooling averages the real tokens only")


@not_attempted_is_false
def check_neighbour_agreement(fn: Callable[[Tensor, Tensor], float]) -> bool:
    """Chapter 9, exercise "nearest-neighbour agreement": ``fn(emb, ref)`` with (N, D)
    and (N, D') must return the share of rows whose most cosine-similar *other* row
    is the same under both.

    Raises:
        CheckError: with a hint for a row counted as its own neighbour, or dot
            products used instead of cosines.
    """
    gen = torch.Generator().manual_seed(9)
    ref = torch.randn(30, 8, generator=gen)
    scaled = ref * torch.linspace(0.2, 5.0, 30)[:, None]  # same cosines, other norms
    noisy = ref + 0.8 * torch.randn(30, 8, generator=gen)
    for emb, name in ((ref, "the same embeddings"), (scaled, "rescaled rows"),
                      (noisy, "noisy embeddings")):
        got, want = float(fn(emb, ref)), neighbour_agreement(emb, ref)
        if math.isclose(got, want, abs_tol=1e-6):
            continue
        if math.isclose(got, 1.0) and name != "the same embeddings":
            _fail(f"{name}: got 1.0, expected {want:.3f}",
                  "exclude each row from its own neighbours (set the diagonal to -inf).")
        if name == "rescaled rows":
            _fail(f"{name}: got {got:.3f}, expected {want:.3f}",
                  "compare cosine similarities, not dot products: normalise rows.")
        _fail(f"{name}: got {got:.3f}, expected {want:.3f}",
              "argmax over each row of the cosine matrix, self excluded, then the "
              "share of rows where both argmaxes agree.")
    return _passed("nearest-neighbour agreement matches on three cases")


@not_attempted_is_false
def check_soft_target_loss(fn: Callable[[Tensor, Tensor, float], Tensor]) -> bool:
    """Chapter 9, exercise "find the bug: soft targets": ``fn(student_logits,
    teacher_logits, T)`` must return T^2 KL(softmax(t / T) || softmax(s / T)),
    averaged over rows (Hinton et al. 2015, section 2).

    Raises:
        CheckError: with a hint for the temperature on one side only, swapped KL
            arguments, or a missing T^2.
    """
    gen = torch.Generator().manual_seed(9)
    s, t = torch.randn(6, 10, generator=gen), 2 * torch.randn(6, 10, generator=gen)
    for T in (1.0, 2.0, 5.0):
        got, want = float(fn(s, t, T)), float(soft_target_loss(s, t, T))
        if math.isclose(got, want, rel_tol=1e-4):
            continue
        p = torch.softmax(t, -1)
        one_sided = T * T * float((p * (p.log() - torch.log_softmax(s / T, -1)))
                                  .sum(-1).mean())
        if math.isclose(got, one_sided, rel_tol=1e-4):
            _fail(f"T = {T}: got {got:.4f}, expected {want:.4f}: the teacher is not "
                  "softened", "divide both logits by T before the softmax.")
        if math.isclose(got, float(soft_target_loss(t, s, T)), rel_tol=1e-4):
            _fail(f"T = {T}: got {got:.4f}, expected {want:.4f}: KL arguments swapped",
                  "the teacher's distribution is the one the expectation is over.")
        if math.isclose(got * T * T, want, rel_tol=1e-4):
            _fail(f"T = {T}: got {got:.4f}, expected {want:.4f}: T^2 is missing",
                  "multiply by T ** 2 so the gradient scale does not depend on T.")
        _fail(f"T = {T}: got {got:.4f}, expected {want:.4f}",
              "T^2 * sum_c p_c (log p_c - log q_c), p and q softened by T.")
    return _passed("the soft-target loss matches Hinton et al. at T = 1, 2, 5")
