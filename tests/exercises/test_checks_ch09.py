"""Chapter 9's self-checks: the reference passes, each known-wrong variant fails with
the message that names its mistake (``check.strict``) and returns False (``check``)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from transformer_course.distill import mean_pool, neighbour_agreement, soft_target_loss
from transformer_course.exercises import (
    CheckError,
    ShapeError,
    check_mean_pool,
    check_neighbour_agreement,
    check_soft_target_loss,
    pitfalls,
)


def _pool(h, m):  # the chapter's solution
    m = m[..., None].to(h.dtype)  # (B, S, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1)


def _agreement(e, r):
    def nn(x):
        x = F.normalize(x, dim=-1)
        return (x @ x.T).fill_diagonal_(float("-inf")).argmax(-1)

    return float((nn(e) == nn(r)).float().mean())


def _soft(s, t, T):
    log_p = torch.log_softmax(t / T, -1)
    return T * T * (log_p.exp() * (log_p - torch.log_softmax(s / T, -1))).sum(-1).mean()


def _soft_inline(s, t, T):  # the chapter's soft_loss_inline: p.log() of a 0 is -inf
    p = torch.softmax(t / T, -1)
    return T * T * (p * (p.log() - torch.log_softmax(s / T, -1))).sum(-1).mean()


def test_mean_pool_check(quiet_check):
    assert quiet_check(check_mean_pool, _pool) is True
    with pytest.raises(CheckError, match="padded"):
        check_mean_pool.strict(lambda h, m: h.mean(1))
    with pytest.raises(ShapeError, match="shape"):
        check_mean_pool.strict(lambda h, m: h.sum(-1))
    with pytest.raises(CheckError, match="differ"):
        check_mean_pool.strict(lambda h, m: _pool(h, m) + 1)
    assert quiet_check(check_mean_pool, lambda h, m: h.mean(1)) is False


def _neighbours_with_self(x):
    x = torch.nn.functional.normalize(x, dim=-1)
    return (x @ x.T).argmax(-1)


def _neighbours_by_dot_product(x):
    return (x @ x.T).fill_diagonal_(float("-inf")).argmax(-1)


def test_neighbour_check(quiet_check):
    assert quiet_check(check_neighbour_agreement, _agreement) is True

    def with_self(e, r):
        return float(
            (_neighbours_with_self(e) == _neighbours_with_self(r)).float().mean()
        )

    def dot_products(e, r):
        return float(
            (_neighbours_by_dot_product(e) == _neighbours_by_dot_product(r))
            .float()
            .mean()
        )

    with pytest.raises(CheckError, match="got 1.0"):
        check_neighbour_agreement.strict(with_self)
    with pytest.raises(CheckError, match="rescaled rows"):
        check_neighbour_agreement.strict(dot_products)
    with pytest.raises(ShapeError, match="one number"):
        check_neighbour_agreement.strict(lambda e, r: _neighbours_with_self(e))
    assert quiet_check(check_neighbour_agreement, with_self) is False
    assert quiet_check(check_neighbour_agreement, dot_products) is False


def test_soft_target_check(quiet_check):
    assert quiet_check(check_soft_target_loss, _soft) is True

    one_sided = pitfalls.soft_target_one_sided
    with pytest.raises(CheckError, match="not softened"):
        check_soft_target_loss.strict(one_sided)
    with pytest.raises(CheckError, match="swapped"):
        check_soft_target_loss.strict(lambda s, t, T: _soft(t, s, T))
    with pytest.raises(CheckError, match="T\\^2 is missing"):
        check_soft_target_loss.strict(lambda s, t, T: _soft(s, t, T) / T**2)
    with pytest.raises(ShapeError, match="scalar"):
        check_soft_target_loss.strict(lambda s, t, T: (s - t).sum(-1))
    assert quiet_check(check_soft_target_loss, one_sided) is False


def test_a_failure_prints_message_and_hint(capsys):
    assert check_mean_pool(lambda h, m: h.mean(1)) is False
    out = capsys.readouterr().out
    assert "✗ the padded tokens are averaged in too" in out and "Hint:" in out


def test_stub_is_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert check_soft_target_loss(stub) is False
    assert "not attempted" in capsys.readouterr().out


# ------------------------------------------- the learner trial of 2026-12-01, chapter 9


def _agreement_by(neighbours, scale=1.0):
    def fn(e, r):
        return scale * float((neighbours(e) == neighbours(r)).float().mean())

    return fn


def _cosine(x):
    x = F.normalize(x, dim=-1)
    return x @ x.T


def _soft_variant(*, factor=lambda T: T * T, soften_student=True, dim=-1, kind="kl"):
    def fn(s, t, T):
        p = torch.softmax(t / T, dim)
        log_q = torch.log_softmax(s / T if soften_student else s, dim)
        if kind == "ce":
            per_row = -(p * log_q).sum(dim)
        elif kind == "mean":
            with warnings.catch_warnings():  # PyTorch warns about exactly this
                warnings.simplefilter("ignore")
                return factor(T) * F.kl_div(log_q, p, reduction="mean")
        else:
            per_row = (p * (p.log() - log_q)).sum(dim)
        return factor(T) * per_row.mean()

    return fn


TRIAL = [
    (check_mean_pool, lambda h, m: h.mean(1), "padded tokens"),
    (check_mean_pool, lambda h, m: (h * m[..., None]).sum(1) / h.shape[1], "by S"),
    (check_mean_pool, lambda h, m: (h * m[..., None]).sum(1) / m.sum(), "whole batch"),
    (check_mean_pool, lambda h, m: _pool(h, ~m), "inverted"),
    (check_mean_pool, mean_pool, "calls the library's"),
    (
        check_neighbour_agreement,
        _agreement_by(lambda x: _cosine(x).argmax(-1)),
        "itself",
    ),
    (
        check_neighbour_agreement,
        _agreement_by(lambda x: (x @ x.T).fill_diagonal_(-math.inf).argmax(-1)),
        "rescaled rows",
    ),
    (
        check_neighbour_agreement,
        _agreement_by(lambda x: torch.cdist(x, x).fill_diagonal_(math.inf).argmin(-1)),
        "rescaled rows",
    ),
    (
        check_neighbour_agreement,
        _agreement_by(lambda x: _cosine(x).fill_diagonal_(math.inf).argmin(-1)),
        "least similar",
    ),
    (
        check_neighbour_agreement,
        lambda e, r: 30 * _agreement(e, r),
        "a count of rows",
    ),
    (check_neighbour_agreement, lambda e, r: 100 * _agreement(e, r), "a percentage"),
    (
        check_neighbour_agreement,
        _agreement_by(lambda x: _cosine(x).fill_diagonal_(0).argmax(-1)),
        "matched to itself",
    ),
    (check_neighbour_agreement, neighbour_agreement, "calls the library's"),
    (check_soft_target_loss, _soft_variant(factor=lambda T: 1.0), "T^2 is missing"),
    (check_soft_target_loss, _soft_variant(factor=lambda T: T), "by T, not T^2"),
    (check_soft_target_loss, _soft_variant(soften_student=False), "student is not"),
    (check_soft_target_loss, _soft_variant(kind="ce"), "cross-entropy"),
    (check_soft_target_loss, _soft_variant(dim=0), "dim=0"),
    (check_soft_target_loss, _soft_variant(kind="mean"), "reduction='mean'"),
    (check_soft_target_loss, lambda s, t, T: _soft(t, s, T), "swapped"),
    (check_soft_target_loss, _soft_inline, "0 * log 0 is NaN"),
    (check_soft_target_loss, soft_target_loss, "calls the library's"),
]


@pytest.mark.parametrize(
    "check, wrong, message", TRIAL, ids=[str(i) for i in range(len(TRIAL))]
)
def test_each_trial_mistake_of_chapter_9_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert "Traceback" not in printed
    assert len(printed.strip().splitlines()) == 2, printed


def test_a_clamped_teacher_is_named_as_another_teacher(capsys):
    """Learner trial 2026-12-03, finding 3f: the hint was about p = 0 terms."""
    assert check_soft_target_loss(pitfalls.soft_loss_clamped_teacher) is False
    printed = capsys.readouterr().out
    assert "large logits were clamped" in printed and "Hint: " in printed, printed
    assert "must add nothing" not in printed


def test_a_teacher_log_p_without_the_temperature_is_named():
    """Learner trial 2026-12-03, finding 5: generic in the trial."""

    def half_softened(s, t, T):
        p = torch.softmax(t / T, -1)
        return (
            T
            * T
            * (p * (F.log_softmax(t, -1) - F.log_softmax(s / T, -1))).sum(-1).mean()
        )

    with pytest.raises(CheckError, match="its log p is not"):
        check_soft_target_loss.strict(half_softened)
