"""Warmup schedule, label-smoothed loss without padding, clipping, and a short training
run whose loss must fall (chapter 6)."""

import functools
import math

import pytest
import torch
from torch import nn

from transformer_course.data import PAD_ID
from transformer_course.exercises import (
    CheckError,
    check_label_smoothed_loss,
    check_noam_lr,
    check_teacher_forcing_loss,
)
from transformer_course.model import TransformerConfig, make_model
from transformer_course.training import (
    fit,
    make_criterion,
    noam_lr,
    noam_scheduler,
    translation_loss,
)


def test_noam_rises_then_decays():
    lrs = [noam_lr(s, 128, 100) for s in range(1, 1001)]
    assert max(range(1000), key=lrs.__getitem__) == 99  # peak at step = warmup
    assert lrs[99] == pytest.approx(1 / math.sqrt(128 * 100))
    assert lrs[49] == pytest.approx(lrs[99] / 2)  # linear rise
    assert lrs[399] == pytest.approx(lrs[99] / 2)  # 1/sqrt(step) decay
    with pytest.raises(ValueError, match="step"):
        noam_lr(0, 128, 100)


def test_noam_scheduler_sets_optimizer_lr():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = noam_scheduler(opt, 64, 10, factor=2.0)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([noam_lr(s, 64, 10, 2.0) for s in (1, 2, 3)])


def test_padding_adds_nothing_to_the_loss():
    torch.manual_seed(0)
    logits, target = torch.randn(4, 6), torch.tensor([3, 1, 4, 5])
    crit = make_criterion(0.1)
    extra = torch.randn(3, 6) * 10  # predictions at padded positions
    padded = crit(
        torch.cat([logits, extra]), torch.cat([target, torch.full((3,), PAD_ID)])
    )
    torch.testing.assert_close(padded, crit(logits, target))
    # known wrong: without ignore_index the padded positions change the loss
    wrong = nn.CrossEntropyLoss(label_smoothing=0.1)
    assert (
        abs(
            wrong(
                torch.cat([logits, extra]), torch.cat([target, torch.zeros(3).long()])
            )
            - crit(logits, target)
        )
        > 1e-3
    )


def test_label_smoothing_value():
    eps, V = 0.1, 5
    logits = torch.tensor([[0.0, 2.0, -1.0, 0.5, 1.0]])
    logp = logits.log_softmax(-1)[0]
    want = -((1 - eps) * logp[1] + eps / V * logp.sum())
    torch.testing.assert_close(
        make_criterion(eps, pad_id=-100)(logits, torch.tensor([1])), want
    )
    # the pitfall: KLDivLoss has no label_smoothing argument at all
    with pytest.raises(TypeError):
        nn.KLDivLoss(label_smoothing=0.1)


def _tiny():
    cfg = TransformerConfig(
        src_vocab_size=10,
        tgt_vocab_size=10,
        d_model=32,
        n_heads=4,
        d_ff=64,
        dropout=0.0,
        max_len=8,
    )
    torch.manual_seed(0)
    model = make_model(cfg)
    src = torch.randint(4, 10, (64, 5))
    tgt = torch.cat([torch.ones(64, 1).long(), src.flip(1), torch.full((64, 1), 2)], 1)
    return model, (lambda: [(src, tgt)])


def _run(lr, steps=40, clip=1.0):
    model, data = _tiny()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = functools.partial(translation_loss, criterion=make_criterion(0.0))
    return fit(model, data, loss, opt, max_steps=steps, clip_norm=clip, progress=False)


def test_training_smoke_loss_falls():
    hist = _run(3e-3)
    assert hist.steps == 40 and len(hist.lr) == 40 and not hist.diverged
    assert sum(hist.loss[-5:]) / 5 < 0.6 * sum(hist.loss[:5]) / 5
    # known wrong: with a zero learning rate the same check fails
    frozen = _run(0.0, steps=10)
    assert abs(frozen.loss[-1] - frozen.loss[0]) < 1e-6


def test_clipping_bounds_the_update():
    model, data = _tiny()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = functools.partial(translation_loss, criterion=make_criterion(0.0))
    hist = fit(model, data, loss, opt, max_steps=1, clip_norm=1e-3, progress=False)
    step = torch.sqrt(
        sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before))
    )
    assert hist.grad_norm[0] > 1e-2  # the norm is recorded before clipping
    assert step.item() == pytest.approx(1e-3, rel=1e-3)


def test_fit_stops_on_divergence_and_evaluates():
    model, data = _tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def nan_loss(model, src, tgt):
        calls.append(1)
        out = model(src, tgt[:, :-1]).sum()
        return out * (float("nan") if len(calls) == 3 else 0.0)

    hist = fit(
        model,
        data,
        nan_loss,
        opt,
        max_steps=10,
        eval_fn=lambda: 1.0,
        eval_every=2,
        progress=False,
    )
    assert hist.diverged and hist.steps == 3
    assert hist.evals == [(2, 1.0), (3, 1.0)]
    with pytest.raises(ValueError, match="clip_norm"):
        fit(model, data, nan_loss, opt, max_steps=1, clip_norm=0)


# ---------------------------------------------- chapter 6 exercise checks (checks.py)


def _stub(*args):
    raise NotImplementedError("your code here")


def _smoothed(logits, target, eps, pad_id):
    logp = logits.log_softmax(-1)
    nll = -logp.gather(1, target[:, None])[:, 0]
    loss = (1 - eps) * nll - eps / logits.shape[-1] * logp.sum(-1)
    return loss[target != pad_id].mean()


def _smoothed_with_pad(logits, target, eps, pad_id):  # known wrong: averages padding
    logp = logits.log_softmax(-1)
    nll = -logp.gather(1, target[:, None])[:, 0]
    return ((1 - eps) * nll - eps / logits.shape[-1] * logp.sum(-1)).mean()


def _unshifted(model, src, tgt, criterion):  # known wrong: reads its answer
    logits = model(src, tgt)
    return criterion(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


@pytest.mark.parametrize(
    "check, right, wrong, words",
    [
        (
            check_noam_lr,
            noam_lr,
            lambda s, d, w: min(s**-0.5, s * w**-1.5),
            "a factor sqrt",
        ),
        (check_label_smoothed_loss, _smoothed, _smoothed_with_pad, "padding"),
        (check_teacher_forcing_loss, translation_loss, _unshifted, "same sequence"),
    ],
)
def test_chapter6_checks(check, right, wrong, words, capsys):
    assert check(right) is True
    assert check(_stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(CheckError, match=words):
        check.strict(wrong)
