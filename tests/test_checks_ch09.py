"""Chapter 9's self-checks: the reference passes, each known-wrong variant fails."""

from __future__ import annotations

import pytest
import torch

from transformer_course.checks import CheckError
from transformer_course.checks_ch09 import (
    check_mean_pool,
    check_neighbour_agreement,
    check_soft_target_loss,
)
from transformer_course.distill import mean_pool, neighbour_agreement, soft_target_loss


def test_mean_pool_check():
    assert check_mean_pool(mean_pool)
    with pytest.raises(CheckError, match="padded"):
        check_mean_pool(lambda h, m: h.mean(1))


def test_neighbour_check():
    assert check_neighbour_agreement(neighbour_agreement)

    def with_self(e, r):
        def nn(x):
            x = torch.nn.functional.normalize(x, dim=-1)
            return (x @ x.T).argmax(-1)
        return float((nn(e) == nn(r)).float().mean())

    with pytest.raises(CheckError, match="own neighbours"):
        check_neighbour_agreement(with_self)

    def dot_products(e, r):
        def nn(x):
            return (x @ x.T).fill_diagonal_(float("-inf")).argmax(-1)
        return float((nn(e) == nn(r)).float().mean())

    with pytest.raises(CheckError):
        check_neighbour_agreement(dot_products)


def test_soft_target_check():
    assert check_soft_target_loss(soft_target_loss)

    def one_sided(s, t, T):
        p = torch.softmax(t, -1)
        return T * T * (p * (p.log() - torch.log_softmax(s / T, -1))).sum(-1).mean()

    with pytest.raises(CheckError, match="not softened"):
        check_soft_target_loss(one_sided)
    with pytest.raises(CheckError, match="swapped"):
        check_soft_target_loss(lambda s, t, T: soft_target_loss(t, s, T))
    with pytest.raises(CheckError, match="T\\^2"):
        check_soft_target_loss(lambda s, t, T: soft_target_loss(s, t, T) / T**2)


def test_stub_is_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert check_soft_target_loss(stub) is False
    assert "not attempted" in capsys.readouterr().out
