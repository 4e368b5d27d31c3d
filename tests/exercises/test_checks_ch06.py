"""Chapter 6's self-checks (the Noam schedule, label-smoothed loss, teacher forcing):
a right answer passes, the stub is "not attempted", and each trial mistake is
rejected with its own message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_course.exercises import (
    CheckError,
    check_label_smoothed_loss,
    check_noam_lr,
    check_teacher_forcing_loss,
)
from transformer_course.training import (
    make_criterion,
    noam_lr,
    translation_loss,
)


def _smoothed(
    *,
    spread=False,
    ignore_pad=True,
    average="real",
    log=True,
    dim=-1,
    target_share=True,
    over_v=False,
):
    def fn(logits, target, eps, pad_id):
        n, v = logits.shape
        logp = logits.log_softmax(dim) if log else logits.softmax(dim)
        q = torch.full_like(logp, eps / (v - 1 if spread else v))
        if spread or not target_share:
            q.scatter_(1, target[:, None], 0.0)
        q = q + (1 - eps) * F.one_hot(target, v)
        per_pos = -(q * logp)
        per_pos = per_pos.mean(-1) if over_v else per_pos.sum(-1)
        keep = target != pad_id if ignore_pad else torch.ones_like(target, dtype=bool)
        if average == "all":
            return per_pos[keep].sum() / n
        return per_pos[keep].mean()

    return fn


def _forcing(inputs, labels, criterion=None):
    def fn(model, src, tgt, crit):
        logits = model(src, inputs(tgt))
        return (criterion or crit)(
            logits.reshape(-1, logits.shape[-1]), labels(tgt).reshape(-1)
        )

    return fn


def _full_input_first_dropped(model, src, tgt, crit):
    logits = model(src, tgt)[:, 1:]
    return crit(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))


TRIAL = [
    (check_noam_lr, lambda s, d, w: d**-0.5 * max(s**-0.5, s * w**-1.5), "max instead"),
    (check_noam_lr, lambda s, d, w: min(s**-0.5, s * w**-1.5), "sqrt(d_model)"),
    (
        check_noam_lr,
        lambda s, d, w: d**-0.5 * min(s**-0.5, s * w**-0.5),
        "rising branch",
    ),
    (check_noam_lr, lambda s, d, w: noam_step(s + 1, d, w), "one step late"),
    (check_noam_lr, lambda s, d, w: d**0.5 * min(s**-0.5, s * w**-1.5), "upside down"),
    (
        check_noam_lr,
        lambda s, d, w: d**-0.5 * min(s / w, math.sqrt(w / s)),
        "sqrt(warmup)",
    ),
    (check_noam_lr, noam_lr, "calls the library's"),
    (check_label_smoothed_loss, _smoothed(spread=True), "V - 1 wrong tokens"),
    (check_label_smoothed_loss, _smoothed(ignore_pad=False), "padding positions"),
    (check_label_smoothed_loss, _smoothed(average="all"), "all N positions"),
    (check_label_smoothed_loss, _smoothed(log=False), "probabilities are used"),
    (check_label_smoothed_loss, _smoothed(target_share=False), "its own eps / V"),
    (check_label_smoothed_loss, _smoothed(dim=0), "dim=0"),
    (check_label_smoothed_loss, _smoothed(over_v=True), "averaged over the V"),
    (
        check_label_smoothed_loss,
        lambda logits, target, eps, pad: make_criterion(eps, pad)(logits, target),
        "calls the library's",
    ),
    (
        check_teacher_forcing_loss,
        _forcing(lambda t: t, lambda t: t),
        "reads its answer",
    ),
    (
        check_teacher_forcing_loss,
        _forcing(lambda t: t[:, 1:], lambda t: t[:, :-1]),
        "wrong way",
    ),
    (
        check_teacher_forcing_loss,
        _forcing(lambda t: t[:, :-1], lambda t: t[:, :-1]),
        "reads its answer",
    ),
    (check_teacher_forcing_loss, _full_input_first_dropped, "reads its answer"),
    (
        check_teacher_forcing_loss,
        _forcing(lambda t: t[:, :-1], lambda t: t[:, 1:], criterion=F.cross_entropy),
        "not the criterion passed in",
    ),
    (check_teacher_forcing_loss, translation_loss, "calls the library's"),
]


def noam_step(step, d_model, warmup):  # a learner's own schedule, right formula
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def _stub(*args):
    raise NotImplementedError("your code here")


def _smoothed_training(logits, target, eps, pad_id):
    logp = logits.log_softmax(-1)
    nll = -logp.gather(1, target[:, None])[:, 0]
    loss = (1 - eps) * nll - eps / logits.shape[-1] * logp.sum(-1)
    return loss[target != pad_id].mean()


def _smoothed_with_pad(logits, target, eps, pad_id):  # known wrong: averages padding
    logp = logits.log_softmax(-1)
    nll = -logp.gather(1, target[:, None])[:, 0]
    return ((1 - eps) * nll - eps / logits.shape[-1] * logp.sum(-1)).mean()


def _noam(step, d_model, warmup):  # a right answer written out (not the library's)
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def _shifted(model, src, tgt, criterion):  # a right answer written out
    logits = model(src, tgt[:, :-1])  # the decoder reads tgt up to the last token
    return criterion(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))


def _unshifted(model, src, tgt, criterion):  # known wrong: reads its answer
    logits = model(src, tgt)
    return criterion(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


@pytest.mark.parametrize(
    "check, wrong, message", TRIAL, ids=[str(i) for i in range(len(TRIAL))]
)
def test_each_trial_mistake_of_chapter_6_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert "Traceback" not in printed
    assert len(printed.strip().splitlines()) == 2, printed


def test_the_right_answers_written_differently_pass(quiet_check):
    assert quiet_check(check_noam_lr, noam_step) is True
    assert quiet_check(check_label_smoothed_loss, _smoothed()) is True
    assert (
        quiet_check(
            check_teacher_forcing_loss,
            _forcing(lambda t: t[:, :-1], lambda t: t[:, 1:]),
        )
        is True
    )


@pytest.mark.parametrize(
    "check, right, wrong, words",
    [
        (
            check_noam_lr,
            _noam,
            lambda s, d, w: min(s**-0.5, s * w**-1.5),
            "a factor sqrt",
        ),
        (check_label_smoothed_loss, _smoothed_training, _smoothed_with_pad, "padding"),
        (check_teacher_forcing_loss, _shifted, _unshifted, "reads its answer"),
    ],
)
def test_chapter6_checks(check, right, wrong, words, capsys):
    assert check(right) is True
    assert check(_stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(CheckError, match=words):
        check.strict(wrong)


# ------------------------------------------------ learner trial 2026-12-03 (issue 39)


@pytest.mark.parametrize(
    "answer",
    [
        lambda logits, target, eps, pad: torch.nn.CrossEntropyLoss(
            label_smoothing=eps, ignore_index=pad
        )(logits, target),
        lambda logits, target, eps, pad: F.cross_entropy(
            logits, target, ignore_index=pad, label_smoothing=eps
        ),
    ],
    ids=["nn.CrossEntropyLoss", "F.cross_entropy"],
)
def test_pytorchs_own_label_smoothing_is_refused(answer, capsys):
    """Finding 2: the exercise says "without label_smoothing=", and this passed."""
    assert check_label_smoothed_loss(answer) is False
    printed = capsys.readouterr().out
    assert "cross_entropy(label_smoothing=...)" in printed, printed


def test_the_cross_entropy_without_its_smoothing_may_be_used(quiet_check):
    def mixed(logits, target, eps, pad):  # (1 - eps) NLL + eps * uniform term
        keep = target != pad
        nll = F.cross_entropy(logits[keep], target[keep])
        uniform = -logits[keep].log_softmax(-1).mean(-1).mean()
        return (1 - eps) * nll + eps * uniform

    assert quiet_check(check_label_smoothed_loss, mixed) is True


def test_the_notebooks_label_smoothing_is_refused_when_read_statically():
    from transformer_course.exercises import check_label_smoothed_loss as check
    from transformer_course.exercises._method import library_use

    source = (
        "import torch.nn.functional as F\n"
        "def smoothed_loss(logits, target, eps, pad_id):\n"
        "    return F.cross_entropy(logits, target, label_smoothing=eps)\n"
    )
    assert "label_smoothing" in library_use(source, "smoothed_loss", check.forbidden)
