"""Chapter 9: distillation losses and the fidelity yardstick, against hand
computations, each with a known-wrong variant that the check rejects."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_course.distill import (
    attention_kl,
    cosine_loss,
    hidden_mse,
    mean_pool,
    nearest_neighbours,
    neighbour_agreement,
    pairwise_cosine,
    soft_target_loss,
    spearman_fidelity,
    value_relation,
    value_relation_kl,
)
from transformer_course.exercises.pitfalls import soft_target_one_sided


def hand_soft_target(s, t, T):
    """sum_c p_c log(p_c / q_c) * T^2 for one row, written out with math."""

    def softmax(z):
        e = [math.exp(v / T) for v in z]
        return [v / sum(e) for v in e]

    p, q = softmax(t), softmax(s)
    return T * T * sum(pc * math.log(pc / qc) for pc, qc in zip(p, q))


def wrong_swapped(s, t, T):  # pitfall: KL(student || teacher)
    return soft_target_loss(t, s, T)


def test_soft_target_loss_matches_hand_computation():
    s, t = [1.0, -0.5, 2.0], [0.3, 1.5, -1.0]
    for T in (1.0, 2.0, 4.0):
        got = soft_target_loss(torch.tensor([s]), torch.tensor([t]), T)
        assert got.item() == pytest.approx(hand_soft_target(s, t, T), rel=1e-5)
        st, tt = torch.tensor([s]), torch.tensor([t])
        assert wrong_swapped(st, tt, T).item() != pytest.approx(got.item(), rel=1e-3)
        if T == 1.0:  # one-sided temperature only differs when T != 1
            continue
        assert soft_target_one_sided(st, tt, T).item() != pytest.approx(
            got.item(), rel=1e-3
        )


def test_soft_target_loss_zero_for_equal_and_shift_invariant():
    z = torch.randn(4, 7)
    assert soft_target_loss(z, z + 3.0, 2.0).abs().item() < 1e-6
    assert soft_target_loss(torch.randn(4, 7), z, 2.0).item() > 0


def test_soft_target_gradient_is_difference_over_T():
    s, t, T = torch.randn(1, 5, requires_grad=True), torch.randn(1, 5), 3.0
    soft_target_loss(s, t, T).backward()
    expected = T * (torch.softmax(s / T, -1) - torch.softmax(t / T, -1))  # T^2 / T
    torch.testing.assert_close(s.grad, expected.detach())


def test_soft_target_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="teacher_logits"):
        soft_target_loss(torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match="temperature"):
        soft_target_loss(torch.randn(2, 3), torch.randn(2, 3), 0.0)


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0]]))
    assert torch.equal(
        mean_pool(hidden, torch.zeros(1, 3, dtype=torch.bool)), torch.zeros(1, 2)
    )
    with pytest.raises(ValueError, match="mask"):
        mean_pool(hidden, mask.float())


def test_cosine_loss():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[2.0, 0.0], [1.0, 0.0]])
    assert cosine_loss(a, b).item() == pytest.approx((0.0 + 1.0) / 2)


def attn(B, H, S, padded):
    w = torch.softmax(torch.randn(B, H, S, S), -1)
    w[..., S - padded :] = 0
    return w / w.sum(-1, keepdim=True)


def test_attention_kl_matches_hand_computation_and_direction():
    mask = torch.tensor([[True, True, False]])
    t, s = attn(1, 2, 3, 1), attn(1, 2, 3, 1)
    hand = 0.0
    for h in range(2):
        for i in range(2):  # real queries only
            hand += sum(
                t[0, h, i, j] * math.log(t[0, h, i, j] / s[0, h, i, j])
                for j in range(2)
            )
    hand /= 2 * 2
    assert attention_kl(s, t, mask).item() == pytest.approx(float(hand), rel=1e-5)
    assert attention_kl(t, s, mask).item() != pytest.approx(float(hand), rel=1e-3)
    assert attention_kl(t, t, mask).item() == pytest.approx(0.0, abs=1e-6)


def test_value_relation_by_hand():
    v = torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, True, True]])
    expected = torch.softmax(v[0, 0] @ v[0, 0].T / 2.0, -1)  # sqrt(d_k) = 2
    torch.testing.assert_close(value_relation(v, mask)[0, 0], expected)
    mask2 = torch.tensor([[True, True, False]])
    assert torch.all(value_relation(v, mask2)[..., 2] == 0)
    assert value_relation_kl(v, v, mask).item() == pytest.approx(0.0, abs=1e-6)
    # the student's d_k may differ from the teacher's; B, H, S may not
    assert value_relation_kl(torch.randn(1, 1, 3, 8), v, mask).item() > 0
    with pytest.raises(ValueError, match="student_values"):
        value_relation_kl(torch.randn(1, 2, 3, 4), v, mask)


def test_pairwise_cosine_by_hand():
    e = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(pairwise_cosine(e), torch.tensor([0.0, r, r]))


def test_fidelity_of_a_model_with_itself_is_one():
    e = torch.randn(40, 16)
    assert spearman_fidelity(e, e) == pytest.approx(1.0)
    assert neighbour_agreement(e, e) == 1.0
    # a monotone change of every cosine keeps the ranking: scaling rows does
    assert spearman_fidelity(e * torch.rand(40, 1) + 0.0, e) == pytest.approx(1.0)


def test_fidelity_of_a_random_model_is_near_zero():
    e = torch.randn(60, 16)
    other = torch.randn(60, 16)
    assert abs(spearman_fidelity(other, e)) < 0.1
    assert neighbour_agreement(other, e) < 0.15
    # a perturbed model lies in between
    mid = spearman_fidelity(e + 0.5 * torch.randn(60, 16), e)
    assert 0.3 < mid < 0.99


def test_spearman_against_scipy_if_present():
    stats = pytest.importorskip("scipy.stats")
    e, f = torch.randn(20, 5), torch.randn(20, 5)
    expected = stats.spearmanr(pairwise_cosine(e), pairwise_cosine(f)).statistic
    assert spearman_fidelity(e, f) == pytest.approx(expected, abs=1e-9)


def test_nearest_neighbours_exclude_self():
    e = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    assert nearest_neighbours(e).tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="rows"):
        neighbour_agreement(e, e[:2])


def test_hidden_mse_against_a_hand_computation():
    torch.manual_seed(0)
    s, t = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    real = [(0, 0), (0, 1), (1, 0)]
    hand = sum(float((s[b, i, d] - t[b, i, d]) ** 2) for b, i in real for d in range(4))
    hand /= len(real) * 4
    assert hidden_mse(s, t, mask).item() == pytest.approx(hand, rel=1e-6)
    # padding does not count: the known-wrong mean over all positions differs
    assert ((s - t) ** 2).mean().item() != pytest.approx(hand, rel=1e-3)
    changed = s.clone()
    changed[0, 2] += 10.0  # a padded token
    assert hidden_mse(changed, t, mask).item() == pytest.approx(hand, rel=1e-6)
    assert hidden_mse(t, t, mask).item() == 0.0
    with pytest.raises(ValueError, match="student_hidden"):
        hidden_mse(s[:, :2], t, mask)


def _half_inputs():
    """Inputs of every loss in ``distill``, with padded keys (weights exactly 0, where
    0 * log 0 needs an epsilon) and embeddings of tiny norm."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    weights = torch.softmax(torch.randn(2, 2, 4, 4, generator=gen), -1)
    weights = weights.masked_fill(~mask[:, None, None, :], 0.0)
    weights = weights / weights.sum(-1, keepdim=True)
    student_emb = torch.randn(3, 8, generator=gen) * 1e-4  # norms below float16's eps
    return {
        "soft_target_loss": (torch.randn(4, 5, generator=gen), torch.randn(4, 5)),
        "cosine_loss": (student_emb, torch.randn(3, 8, generator=gen)),
        "hidden_mse": (
            torch.randn(2, 4, 8, generator=gen) * 300,  # squares beyond float16
            torch.randn(2, 4, 8, generator=gen),
            mask,
        ),
        "attention_kl": (weights.flip(-2), weights, mask),
        "value_relation_kl": (
            torch.randn(2, 2, 4, 8, generator=gen),
            torch.randn(2, 2, 4, 8, generator=gen),
            mask,
        ),
    }


LOSSES = {
    "soft_target_loss": soft_target_loss,
    "cosine_loss": cosine_loss,
    "hidden_mse": hidden_mse,
    "attention_kl": attention_kl,
    "value_relation_kl": value_relation_kl,
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_is_finite_in_half_precision(name, dtype):
    """An epsilon of 1e-12 is 0 in float16 (0 * log 0 = NaN) and squares of 300 are
    inf: each loss computes in float32, with finite gradients, and agrees with the
    float32 loss of the same (rounded) inputs."""
    args = _half_inputs()[name]
    half = [a.to(dtype).requires_grad_() if a.is_floating_point() else a for a in args]
    loss = LOSSES[name](*half)
    loss.backward()
    assert torch.isfinite(loss), f"{name} is {loss.item()} in {dtype}"
    grad = half[0].grad
    assert grad is not None and torch.isfinite(grad).all()
    want = LOSSES[name](*[a.float() if a.is_floating_point() else a for a in half])
    assert loss.item() == pytest.approx(want.item(), rel=1e-4, abs=1e-6)
    # known wrong: 0 * log(0 + eps) in float16 itself, as the losses once computed
    zero = torch.zeros((), dtype=torch.float16)
    assert torch.isnan(zero * torch.log(zero + 1e-12))


def test_spearman_ties_take_average_ranks_like_scipy():
    """Tied cosines share their average rank (scipy.stats.spearmanr), so listing the
    sentences in another order gives the same score."""
    stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(0)
    reference = torch.randn(12, 6, generator=gen)
    student = torch.randint(0, 2, (12, 3), generator=gen).double()  # many ties
    student[student.sum(1) == 0, 0] = 1.0  # no zero vector: every cosine defined
    a, b = pairwise_cosine(student), pairwise_cosine(reference)
    assert len(a.unique()) < len(a) / 4  # the student's cosines do tie
    expected = stats.spearmanr(a.round(decimals=6), b).statistic
    assert spearman_fidelity(student, reference) == pytest.approx(expected, abs=1e-9)
    for seed in range(3):
        order = torch.randperm(12, generator=torch.Generator().manual_seed(seed))
        assert spearman_fidelity(student[order], reference[order]) == pytest.approx(
            expected, abs=1e-9
        )
    # known wrong: ranks broken by position differ from scipy's on these ties
    by_position = torch.empty(len(a))
    by_position[a.argsort(stable=True)] = torch.arange(len(a), dtype=torch.float)
    assert stats.spearmanr(by_position, b).statistic != pytest.approx(expected)


@pytest.mark.parametrize("n", [10, 100])
def test_spearman_gives_a_collapsed_student_no_credit(n):
    """Every embedding equal: every pair ties, nothing is ordered, the score is 0
    (not NaN, and not the correlation of the listing order with the teacher's)."""
    reference = torch.randn(n, 8, generator=torch.Generator().manual_seed(n))
    collapsed = torch.randn(8).expand(n, 8).clone()
    assert spearman_fidelity(collapsed, reference) == 0.0
    # a structured reference: the pairs' listing order is its order of similarity
    line = torch.stack([torch.ones(n), torch.linspace(0, 3, n)], 1)
    assert spearman_fidelity(collapsed, line) == 0.0
    assert spearman_fidelity(line, line) == pytest.approx(1.0)  # known right
