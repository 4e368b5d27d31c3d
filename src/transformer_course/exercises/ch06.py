"""Chapter 6, the full Transformer: the warmup schedule, label smoothing, teacher forcing."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import Forbidden, forbids
from transformer_course.training import make_criterion, noam_lr, translation_loss


@exercise_check
@forbids(noam_lr)
def check_noam_lr(fn: Callable[[int, int, int], float]) -> bool:
    """Chapter 6, exercise "warmup schedule": ``fn(step, d_model, warmup)`` must return
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) for step >= 1 (Vaswani et al.
    2017, equation 3).

    Raises:
        CheckError: naming the first (step, d_model, warmup) that is wrong, with a hint
            for a peak at the wrong step, a missing d_model factor, a swapped min/max,
            a step off by one, or a call to the library's ``noam_lr``.
    """
    for d_model, warmup in ((512, 4000), (128, 400), (64, 10)):
        for step in (1, warmup // 2, warmup, 2 * warmup, 10 * warmup):
            got, want = float(fn(step, d_model, warmup)), noam_lr(step, d_model, warmup)
            if math.isclose(got, want, rel_tol=1e-6):
                continue
            if math.isclose(got, want * math.sqrt(d_model), rel_tol=1e-6):
                fail(
                    "fn({step}, {d_model}, {warmup}) = {got:.3g}, expected {want:.3g}: "
                    "off by a factor sqrt(d_model)",
                    "multiply by d_model ** -0.5.",
                    step=step,
                    d_model=d_model,
                    warmup=warmup,
                    got=got,
                    want=want,
                )
            if math.isclose(got, noam_lr(step + 1, d_model, warmup), rel_tol=1e-6):
                fail(
                    "fn({step}, {d_model}, {warmup}) = {got:.6g}, expected {want:.6g}: "
                    "that is the rate of step {next_step}, one step late",
                    "the formula's step counts from 1: use step as it is given.",
                    step=step,
                    d_model=d_model,
                    warmup=warmup,
                    got=got,
                    want=want,
                    next_step=step + 1,
                )
            if step != warmup and math.isclose(
                got, d_model**-0.5 * max(step**-0.5, step * warmup**-1.5), rel_tol=1e-6
            ):
                fail(
                    "fn({step}, {d_model}, {warmup}) = {got:.3g}, expected {want:.3g}: "
                    "max instead of min",
                    "the rate is the smaller of the rising and the decaying branch.",
                    step=step,
                    d_model=d_model,
                    warmup=warmup,
                    got=got,
                    want=want,
                )
            fields = {
                "step": step,
                "d_model": d_model,
                "warmup": warmup,
                "got": got,
                "want": want,
            }
            value = gettext(
                "fn({step}, {d_model}, {warmup}) = {got:.6g}, expected {want:.6g}"
            ).format(**fields)
            for factor, message, hint in (
                (
                    d_model,
                    N_("the d_model factor is upside down (d_model ** +0.5)"),
                    N_("a larger model must get a smaller rate."),
                ),
                (
                    math.sqrt(warmup),
                    N_("off by a factor sqrt(warmup) at every step"),
                    N_(
                        "write both branches with warmup in them and check that they meet "
                        "at step = warmup."
                    ),
                ),
                (
                    warmup if step < warmup else math.nan,
                    N_("the rising branch is off by a factor warmup"),
                    N_(
                        "at step = warmup the rising branch must equal the decaying one, "
                        "warmup ** -0.5."
                    ),
                ),
            ):
                if math.isclose(got, want * factor, rel_tol=1e-6):
                    fail(
                        "{value}: {message}",
                        hint,
                        value=value,
                        message=gettext(message),
                    )
            fail(
                "fn({step}, {d_model}, {warmup}) = {got:.6g}, expected {want:.6g}",
                "compute both branches at step = warmup // 2 and step = 2 * warmup by "
                "hand: the rate is the smaller one.",
                **fields,
            )
    return passed("the warmup schedule matches equation (3) at 15 points")


@exercise_check
@forbids(
    make_criterion, Forbidden(F.cross_entropy, "label_smoothing", lambda eps: eps > 0)
)
def check_label_smoothed_loss(fn: Callable[..., Tensor]) -> bool:
    """Chapter 6, exercise "label smoothing by hand": ``fn(logits, target, eps,
    pad_id)`` with logits (N, V) and target (N,) must return the mean over non-padding
    positions of -sum_v q_v log p_v, with q = (1 - eps) one_hot(target) + eps / V, the
    value of ``nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_id)``.

    Raises:
        CheckError: with a hint for padding counted in the loss or the average,
            smoothing spread over V - 1 tokens, no smoothing at all, a call to
            the library's ``make_criterion``, or PyTorch's own smoothing
            (``label_smoothing=`` of ``F.cross_entropy`` or ``nn.CrossEntropyLoss``).
    """
    gen = torch.Generator().manual_seed(6)
    for n, v, eps in ((8, 5, 0.1), (12, 7, 0.2), (5, 3, 0.0)):
        logits = torch.randn(n, v, generator=gen) * 2
        target = torch.randint(1, v, (n,), generator=gen)
        target[-2:] = 0  # two padding positions (pad_id 0)
        got = fn(logits.clone(), target.clone(), eps, 0)
        if not isinstance(got, Tensor) or got.numel() != 1:
            fail(
                "expected a scalar tensor (the mean loss)",
                "average over the non-padding positions.",
                kind=ShapeError,
            )
        got = got.reshape(())
        want = torch.nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=0)(
            logits, target
        )
        if torch.allclose(got, want, atol=1e-5):
            continue
        logp = logits.log_softmax(-1)
        keep = target != 0
        nll = -logp.gather(1, target[:, None])[:, 0]
        per_pos = (1 - eps) * nll - eps / v * logp.sum(-1)
        if torch.allclose(got, per_pos.mean(), atol=1e-5):
            fail(
                "padding positions are counted in the loss",
                "drop the positions whose target is pad_id before averaging.",
            )
        if torch.allclose(got, per_pos.sum() / keep.sum(), atol=1e-5):
            fail(
                "the padded positions' losses are added to the sum",
                "multiply each position's loss by (target != pad_id) before summing.",
            )
        if torch.allclose(got, nll[keep].mean(), atol=1e-5) and eps > 0:
            fail(
                "your loss is plain cross-entropy: no smoothing",
                "mix (1 - eps) * the one-hot target with eps / V on every token.",
            )
        off = (1 - eps) * nll - eps / (v - 1) * (logp.sum(-1) + nll)
        if torch.allclose(got, off[keep].mean(), atol=1e-5) and eps > 0:
            fail(
                "the smoothing mass is spread over the V - 1 wrong tokens",
                "PyTorch spreads eps / V over all V tokens, the right one included.",
            )
        value = gettext("loss = {got:.5f}, expected {want:.5f}").format(
            got=got.item(), want=want.item()
        )
        p = logits.softmax(-1)
        q_y = -eps / v * (logp.sum(-1) + nll)  # eps / V on every token but the target
        wrong = (
            (
                per_pos[keep].sum() / n,
                N_(
                    "the sum over the real positions is divided by all N positions, "
                    "padding included"
                ),
                N_("average over the positions that count, and only those."),
            ),
            (
                ((1 - eps) * -p.gather(1, target[:, None])[:, 0] - eps / v * p.sum(-1))[
                    keep
                ].mean(),
                N_("probabilities are used where log-probabilities belong"),
                N_("cross-entropy weighs log p, not p."),
            ),
            (
                ((1 - eps) * nll + q_y)[keep].mean(),
                N_("the target token misses its own eps / V share"),
                N_(
                    "q puts eps / V on every token, the target included, on top of its "
                    "1 - eps."
                ),
            ),
            (
                (per_pos / v)[keep].mean(),
                N_("the loss is averaged over the V tokens, not summed"),
                N_("a cross-entropy sums q_v log p_v over the vocabulary."),
            ),
        )
        for loss, message, hint in wrong:
            if eps > 0 and torch.allclose(got, loss, atol=1e-5):
                fail("{value}: {message}", hint, value=value, message=gettext(message))
        logp0 = logits.log_softmax(0)
        nll0 = -logp0.gather(1, target[:, None])[:, 0]
        if torch.allclose(
            got, ((1 - eps) * nll0 - eps / v * logp0.sum(-1))[keep].mean()
        ):
            fail(
                "{value}: the log-softmax ran over the positions (dim=0), not the "
                "vocabulary",
                "each position's probabilities sum to 1 over the V tokens.",
                value=value,
            )
        fail(
            "{value} (N={n}, V={v}, eps={eps})",
            "compute q for one position by hand: it must sum to 1, with 1 - eps + "
            "eps / V on the target.",
            value=value,
            n=n,
            v=v,
            eps=eps,
        )
    return passed("label-smoothed loss equals nn.CrossEntropyLoss on 3 random batches")


@exercise_check
@forbids(translation_loss)
def check_teacher_forcing_loss(fn: Callable[..., Tensor]) -> bool:
    """Chapter 6, exercise "find the bug: teacher forcing": ``fn(model, src, tgt,
    criterion)`` must feed the decoder tgt[:, :-1] and score its predictions against
    tgt[:, 1:] (``training.translation_loss``).

    Raises:
        CheckError: for the unshifted version (the decoder sees the token it must
            predict), labels equal to the decoder input, a shift in the wrong
            direction, the given criterion ignored, a call to the library's
            ``translation_loss``, or a different value.
    """
    from transformer_course.device import seeded
    from transformer_course.model import TransformerConfig, make_model

    gen = torch.Generator().manual_seed(7)
    cfg = TransformerConfig(
        src_vocab_size=12,
        tgt_vocab_size=10,
        d_model=16,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        max_len=10,
    )
    with seeded(7):  # the learner's random stream is left as it was
        model = make_model(cfg).eval()
    src = torch.randint(4, 12, (3, 5), generator=gen)
    tgt = torch.cat(
        [
            torch.ones(3, 1).long(),
            torch.randint(4, 10, (3, 5), generator=gen),
            torch.full((3, 1), 2),
        ],
        1,
    )
    crit = make_criterion(0.1)
    got = fn(model, src, tgt, crit)
    want = translation_loss(model, src, tgt, crit)
    if not isinstance(got, Tensor) or got.numel() != 1:
        fail(
            "expected a scalar loss tensor",
            "return the criterion's value.",
            kind=ShapeError,
        )
    if torch.allclose(got.reshape(()), want, atol=1e-5):
        return passed("the decoder reads tgt[:, :-1] and predicts tgt[:, 1:]")
    got = got.reshape(())
    logits = model(src, tgt[:, :-1])  # (B, T - 1, V)
    flat, labels = logits.reshape(-1, 10), tgt[:, 1:].reshape(-1)
    full = model(src, tgt)  # (B, T, V)
    reading = (
        crit(full.reshape(-1, 10), tgt.reshape(-1)),
        crit(flat, tgt[:, :-1].reshape(-1)),
        crit(full[:, 1:].reshape(-1, 10), labels),
    )
    if any(torch.allclose(got, wrong, atol=1e-5) for wrong in reading):
        fail(
            "your labels are the tokens the decoder reads: position t is asked for "
            "the token at its own input, so the decoder reads its answer (the "
            "chapter's pitfall)",
            "line up, for one row, the decoder input and the labels: each label "
            "must be the input one position later.",
        )
    backwards = crit(model(src, tgt[:, 1:]).reshape(-1, 10), tgt[:, :-1].reshape(-1))
    if torch.allclose(got, backwards, atol=1e-5):
        fail(
            "the shift runs the wrong way: the decoder reads the sequence without BOS "
            "and is asked for the token before each one",
            "the decoder starts from BOS and predicts the next token, up to EOS.",
        )
    plain = (
        torch.nn.functional.cross_entropy(flat, labels),
        torch.nn.functional.cross_entropy(flat, labels, ignore_index=0),
    )
    if any(torch.allclose(got, wrong, atol=1e-5) for wrong in plain):
        fail(
            "loss = {got:.5f}, expected {want:.5f}: the shift is right, but "
            "the loss is not the criterion passed in (no label smoothing)",
            "score the logits with the criterion argument, which smooths the labels "
            "and ignores padding.",
            got=got.item(),
            want=want.item(),
        )
    fail(
        "loss = {got:.5f}, expected {want:.5f}",
        "which tokens does the decoder read, and which must it predict? Print both "
        "for one row of tgt.",
        got=got.item(),
        want=want.item(),
    )
