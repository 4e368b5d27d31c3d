"""Chapter 8: the CLIP-style symmetric InfoNCE loss and the dual encoder."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_course.contrastive import (
    INIT_TEMPERATURE,
    MAX_LOGIT_SCALE,
    DualEncoder,
    LogitScale,
    contrastive_loss,
    recall_at_k,
)


def hand_loss(img, txt, scale, symmetric=True):
    """The loss written out with scalars: cosines, softmax along rows and columns."""
    B = len(img)

    def unit(v):
        norm = math.sqrt(sum(a * a for a in v))
        return [a / norm for a in v]

    unit_i, unit_t = [unit(v) for v in img.tolist()], [unit(v) for v in txt.tolist()]
    s = [
        [scale * sum(a * b for a, b in zip(unit_i[i], unit_t[j])) for j in range(B)]
        for i in range(B)
    ]
    rows = [
        -s[i][i] + math.log(sum(math.exp(s[i][j]) for j in range(B))) for i in range(B)
    ]
    cols = [
        -s[j][j] + math.log(sum(math.exp(s[i][j]) for i in range(B))) for j in range(B)
    ]
    i2t = sum(rows) / B
    return (i2t + sum(cols) / B) / 2 if symmetric else i2t


@pytest.mark.parametrize("symmetric", [True, False])
def test_loss_matches_a_hand_computation(symmetric):
    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    got = contrastive_loss(img, txt, 2.5, symmetric=symmetric).item()
    assert got == pytest.approx(hand_loss(img, txt, 2.5, symmetric), rel=1e-5)


def test_symmetric_and_one_sided_differ_and_known_wrong_losses_are_rejected():
    g = torch.Generator().manual_seed(1)
    img, txt = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    want = hand_loss(img, txt, 3.0)
    assert contrastive_loss(img, txt, 3.0, symmetric=False).item() != pytest.approx(
        want
    )
    unnormalised = (
        torch.nn.functional.cross_entropy(3.0 * img @ txt.T, torch.arange(5))
        + torch.nn.functional.cross_entropy(3.0 * txt @ img.T, torch.arange(5))
    ) / 2
    assert unnormalised.item() != pytest.approx(want)
    assert contrastive_loss(img, txt, 3.0).item() == pytest.approx(want, rel=1e-5)


def test_perfect_pairs_give_a_small_loss_and_random_ones_about_log_b():
    eye = torch.eye(8)
    assert contrastive_loss(eye, eye, 100.0).item() < 1e-3
    g = torch.Generator().manual_seed(2)
    rand = contrastive_loss(
        torch.randn(256, 64, generator=g), torch.randn(256, 64, generator=g), 1.0
    ).item()
    assert rand == pytest.approx(math.log(256), rel=0.05)


def test_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="image_emb, text_emb"):
        contrastive_loss(torch.randn(4, 3), torch.randn(5, 3), 1.0)
    with pytest.raises(ValueError, match="logit_scale"):
        contrastive_loss(torch.randn(4, 3), torch.randn(4, 3), -1.0)


def test_logit_scale_is_initialised_and_clamped_as_clip():
    scale = LogitScale()
    assert scale().item() == pytest.approx(1 / INIT_TEMPERATURE)
    assert isinstance(scale.log_scale, torch.nn.Parameter)
    with torch.no_grad():
        scale.log_scale.fill_(10.0)
    assert scale.clamp_()().item() == pytest.approx(MAX_LOGIT_SCALE)
    with torch.no_grad():
        scale.log_scale.fill_(-1.0)
    assert scale.clamp_()().item() == pytest.approx(1.0)  # s >= 1, as open_clip
    fixed = LogitScale(0.1, learned=False)
    assert fixed().item() == pytest.approx(10.0)
    assert not list(fixed.parameters())


def test_logit_scale_at_the_clamp_keeps_a_gradient_and_comes_back_down():
    """openai/CLIP #46, open_clip #104: with exp(t) clamped in the forward pass, t's
    gradient is 0 once t > log 100 and the scale is stuck at 100 for good. Clipped
    after the optimiser step, it recovers when the loss wants a smaller scale."""
    scale = LogitScale()
    with torch.no_grad():
        scale.log_scale.fill_(math.log(MAX_LOGIT_SCALE) + 0.5)  # past the clamp
    opt = torch.optim.SGD(scale.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(0)
    images, texts = torch.randn(8, 4, generator=gen), torch.randn(8, 4, generator=gen)
    for _ in range(20):  # unrelated pairs: a smaller scale means a smaller loss
        loss = contrastive_loss(images, texts, scale())
        opt.zero_grad()
        loss.backward()
        assert scale.log_scale.grad.item() > 0
        opt.step()
        scale.clamp_()
    assert scale().item() < 0.5 * MAX_LOGIT_SCALE
    # known wrong: the forward-pass clamp leaves the parameter without a gradient
    stuck = scale.log_scale.detach().clone().fill_(5.0).requires_grad_()
    stuck.exp().clamp(max=MAX_LOGIT_SCALE).backward()
    assert stuck.grad.item() == 0.0


def test_dual_encoder_gives_unit_vectors_and_ignores_padding(tiny_config):
    cfg = tiny_config(n_layers=1)
    torch.manual_seed(0)
    model = DualEncoder(cfg, (8, 16), 4, embed_dim=8).eval()
    img, txt, _ = model(
        torch.rand(3, 8, 16), torch.tensor([[4, 5, 0], [6, 0, 0], [7, 8, 9]])
    )
    assert img.shape == txt.shape == (3, 8)
    assert torch.allclose(img.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert torch.allclose(txt.norm(dim=-1), torch.ones(3), atol=1e-5)
    alone = model.encode_text(torch.tensor([[6]]))
    assert torch.allclose(alone[0], txt[1], atol=1e-5)  # padding changes nothing


def test_recall_at_k():
    sim = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.7], [0.0, 0.3, 0.5]])
    target = torch.tensor([0, 1, 2])
    assert recall_at_k(sim, target, 1) == pytest.approx(2 / 3)
    assert recall_at_k(sim, target, 2) == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_contrastive_loss_is_finite_in_half_precision(dtype):
    """Like the distillation losses: normalize's eps of 1e-12 is 0 in float16, so a
    zero embedding gave 0 / 0 = NaN; the loss computes in float32."""
    gen = torch.Generator().manual_seed(0)
    images, texts = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    images[0] = 0.0  # an image the encoder maps to the zero vector
    half = images.to(dtype)
    loss = contrastive_loss(half, texts.to(dtype), 14.3)
    assert torch.isfinite(loss)
    want = contrastive_loss(half.float(), texts.to(dtype).float(), 14.3)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    small = (images[1:] * 1e-3).to(dtype).requires_grad_()  # tiny norms, not zero
    contrastive_loss(small, texts[1:].to(dtype), 14.3).backward()
    assert torch.isfinite(small.grad).all()
    # known wrong: normalising in float16 itself
    zero = torch.zeros(1, 8, dtype=torch.float16)
    assert torch.isnan(zero / zero.norm(dim=-1, keepdim=True).clamp_min(1e-12)).all()
