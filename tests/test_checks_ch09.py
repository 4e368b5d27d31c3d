"""Chapter 9's self-checks: the reference passes, each known-wrong variant fails with
the message that names its mistake (``check.strict``) and returns False (``check``)."""

from __future__ import annotations

import pytest
import torch

from transformer_course.distill import mean_pool, neighbour_agreement, soft_target_loss
from transformer_course.exercises import (
    CheckError,
    ShapeError,
    check_mean_pool,
    check_neighbour_agreement,
    check_soft_target_loss,
)


def test_mean_pool_check(quiet_check):
    assert quiet_check(check_mean_pool, mean_pool) is True
    with pytest.raises(CheckError, match="padded"):
        check_mean_pool.strict(lambda h, m: h.mean(1))
    with pytest.raises(ShapeError, match="shape"):
        check_mean_pool.strict(lambda h, m: h.sum(-1))
    with pytest.raises(CheckError, match="differ"):
        check_mean_pool.strict(lambda h, m: (h * m[..., None]).sum(1) / h.shape[1])
    assert quiet_check(check_mean_pool, lambda h, m: h.mean(1)) is False


def _neighbours_with_self(x):
    x = torch.nn.functional.normalize(x, dim=-1)
    return (x @ x.T).argmax(-1)


def _neighbours_by_dot_product(x):
    return (x @ x.T).fill_diagonal_(float("-inf")).argmax(-1)


def test_neighbour_check(quiet_check):
    assert quiet_check(check_neighbour_agreement, neighbour_agreement) is True

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
    assert quiet_check(check_soft_target_loss, soft_target_loss) is True

    def one_sided(s, t, T):
        p = torch.softmax(t, -1)
        return T * T * (p * (p.log() - torch.log_softmax(s / T, -1))).sum(-1).mean()

    with pytest.raises(CheckError, match="not softened"):
        check_soft_target_loss.strict(one_sided)
    with pytest.raises(CheckError, match="swapped"):
        check_soft_target_loss.strict(lambda s, t, T: soft_target_loss(t, s, T))
    with pytest.raises(CheckError, match="T\\^2 is missing"):
        check_soft_target_loss.strict(lambda s, t, T: soft_target_loss(s, t, T) / T**2)
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
