"""Warmup schedule, label-smoothed loss without padding, clipping, and a short training
run whose loss must fall (chapter 6)."""

import functools
import math

import pytest
import torch
from torch import nn

from transformer_course.data import PAD_ID
from transformer_course.decoding import beam_search, greedy_decode
from transformer_course.model import make_model
from transformer_course.training import (
    fit,
    make_criterion,
    noam_lr,
    noam_scheduler,
    translation_loss,
)


def _tiny(tiny_config):
    torch.manual_seed(0)
    model = make_model(tiny_config(src_vocab_size=10, tgt_vocab_size=10))
    src = torch.randint(4, 10, (64, 5))
    tgt = torch.cat([torch.ones(64, 1).long(), src.flip(1), torch.full((64, 1), 2)], 1)
    return model, (lambda: [(src, tgt)])


def _run(tiny_config, lr, steps=40, clip=1.0):
    model, data = _tiny(tiny_config)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = functools.partial(translation_loss, criterion=make_criterion(0.0))
    return fit(model, data, loss, opt, max_steps=steps, clip_norm=clip, progress=False)


def _counted(passes):
    """batches() that records its calls and, instead of letting a broken ``fit`` spin
    forever, fails on the fourth call (so the test needs no timeout)."""
    calls = []

    def batches():
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("fit called batches() again after empty passes")
        return passes(len(calls))

    return batches, calls


class _Sqrt(nn.Module):
    """One parameter p = 0: loss sqrt(p + x) is 0 but its gradient is +inf."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(1))


def _sqrt_loss(model, x):
    return torch.sqrt(model.p + x).sum()


def _dropout_model(tiny_config):
    torch.manual_seed(0)
    return make_model(tiny_config(src_vocab_size=10, tgt_vocab_size=10, dropout=0.5))


def _decoders():
    from transformer_course import decoding

    found = [(greedy_decode, {}), (beam_search, {"beam_size": 2})]
    for name in ("sample", "generate"):  # decoder-only generation, whichever exists
        if hasattr(decoding, name):
            found.append((getattr(decoding, name), {"lm": True, "temperature": 0}))
    return found


def _chapter7_loop(model, ids, steps, batch_size, block, lr, seed):
    """Chapter 7's loop as it was written before ``train_lm`` (the reference)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - block - 1, (batch_size,), generator=gen)
        batch = torch.stack([ids[s : s + block + 1] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return loss.item()


def _copy_accuracy(model):
    from transformer_course.recurrent import copy_accuracy

    return copy_accuracy(model, 4, 10, batch_size=2)


def _cross_attention(model):
    from transformer_course.vision import cross_attention

    return cross_attention(model, torch.rand(2, 8, 16), torch.tensor([[1, 5, 6]] * 2))


def _recurrent_model(tiny_config):  # an LSTM: it takes no config
    from transformer_course.recurrent import LSTMSeq2Seq

    return LSTMSeq2Seq(10, 8, 8, attention=True)


def _captioner(tiny_config):
    from transformer_course.vision import Captioner

    return Captioner(tiny_config(n_layers=1, dropout=0.5), (8, 16), 4)


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


def test_train_translator_returns_the_mean_of_its_last_weights(
    monkeypatch, tiny_config
):
    from transformer_course import translation_data
    from transformer_course.translation_data import (
        make_translation_data,
        train_translator,
    )

    data = make_translation_data(2_000, tgt_vocab_size=60)
    cfg = tiny_config(
        src_vocab_size=data.src_tok.vocab_size,
        tgt_vocab_size=data.tgt_tok.vocab_size,
        n_layers=1,
        max_len=32,
    )
    snapshots = []

    def recording_fit(*args, after_step, **kwargs):  # keeps every step's weights
        def record(step):
            snapshots.append([p.detach().clone() for p in args[0].parameters()])
            after_step(step)

        return fit(*args, after_step=record, **kwargs)

    monkeypatch.setattr(translation_data, "fit", recording_fit)
    monkeypatch.setattr(translation_data, "TRANSLATOR_AVERAGE", 3)
    torch.manual_seed(0)
    model = make_model(cfg)
    hist = train_translator(model, data, steps=6, batch_size=16, progress=False)
    assert hist.steps == 6 and len(snapshots) == 6
    mean = [torch.stack(ws).mean(0) for ws in zip(*snapshots[-3:])]
    for p, m in zip(model.parameters(), mean):
        torch.testing.assert_close(p.detach(), m)
    # known wrong: the last step's weights are not the average
    assert any((p - last).abs().max() > 1e-6 for p, last in zip(mean, snapshots[-1]))
    torch.manual_seed(0)
    again = make_model(cfg)
    train_translator(again, data, steps=6, batch_size=16, progress=False)
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters())
    )
    with pytest.raises(ValueError, match="steps"):
        train_translator(model, data, steps=0)


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


def test_training_smoke_loss_falls(tiny_config):
    hist = _run(tiny_config, 3e-3)
    assert hist.steps == 40 and len(hist.lr) == 40 and not hist.diverged
    assert sum(hist.loss[-5:]) / 5 < 0.6 * sum(hist.loss[:5]) / 5
    # known wrong: with a zero learning rate the same check fails
    frozen = _run(tiny_config, 0.0, steps=10)
    assert abs(frozen.loss[-1] - frozen.loss[0]) < 1e-6


def test_clipping_bounds_the_update(tiny_config):
    model, data = _tiny(tiny_config)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = functools.partial(translation_loss, criterion=make_criterion(0.0))
    hist = fit(model, data, loss, opt, max_steps=1, clip_norm=1e-3, progress=False)
    step = torch.sqrt(
        sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before))
    )
    assert hist.grad_norm[0] > 1e-2  # the norm is recorded before clipping
    assert step.item() == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize(
    "kind",
    ["empty dataset", "exhausted generator", "empty after one pass"],
)
def test_fit_raises_on_empty_batches(kind, tiny_config):
    model, data = _tiny(tiny_config)
    one_pass = data()
    exhausted = iter(one_pass)
    list(exhausted)
    passes = {
        "empty dataset": lambda n: [],
        "exhausted generator": lambda n: exhausted,
        "empty after one pass": lambda n: one_pass if n == 1 else iter(()),
    }[kind]
    batches, calls = _counted(passes)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = functools.partial(translation_loss, criterion=make_criterion(0.0))
    with pytest.raises(ValueError, match="batches: expected every call to yield"):
        fit(model, batches, loss, opt, max_steps=5, progress=False)
    assert len(calls) == (2 if kind == "empty after one pass" else 1)
    # known right: a batches() that yields on every call trains to max_steps
    hist = fit(model, data, loss, opt, max_steps=3, progress=False)
    assert hist.steps == 3


def test_fit_stops_on_divergence_and_evaluates(tiny_config):
    model, data = _tiny(tiny_config)
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
    assert hist.diverged and hist.steps == 3 and hist.skipped_steps == [3]
    assert hist.evals == [(2, 1.0), (3, 1.0)]
    with pytest.raises(ValueError, match="clip_norm"):
        fit(model, data, nan_loss, opt, max_steps=1, clip_norm=0)


def test_nonfinite_gradient_step_is_skipped_and_weights_stay_finite():
    model = _Sqrt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hist = fit(
        model,
        lambda: [(torch.zeros(1),)],
        _sqrt_loss,
        opt,
        max_steps=1,
        clip_norm=1.0,
        progress=False,
    )
    assert hist.loss == [0.0] and hist.grad_norm == [math.inf]
    assert hist.skipped_steps == [1] and not hist.diverged
    assert torch.equal(model.p.detach(), torch.zeros(1))  # the last finite weights
    # known wrong: what fit did before, clip then step, writes NaN into the weight
    wrong = _Sqrt()
    _sqrt_loss(wrong, torch.zeros(1)).backward()
    torch.nn.utils.clip_grad_norm_(wrong.parameters(), 1.0)
    torch.optim.SGD(wrong.parameters(), lr=0.1).step()
    assert wrong.p.isnan().all()


@pytest.mark.parametrize("clip", [1.0, None])
def test_nonfinite_steps_in_a_row_stop_training_and_finite_ones_resume(clip):
    model = _Sqrt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hist = fit(
        model,
        lambda: [(torch.zeros(1),)],
        _sqrt_loss,
        opt,
        max_steps=50,
        clip_norm=clip,
        max_skipped=4,
        progress=False,
    )
    assert hist.diverged and hist.steps == 4 and hist.skipped_steps == [1, 2, 3, 4]
    assert torch.isfinite(model.p).all()
    # an infinite gradient on every third batch only: those steps are skipped and
    # training goes on with the finite ones
    xs = [torch.zeros(1) if i % 3 == 2 else torch.ones(1) for i in range(9)]
    model = _Sqrt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss(m, x):  # sqrt(p - p) adds 0 to the loss and +inf to the gradient
        out = ((m.p - 3) ** 2).sum()
        return out + torch.sqrt(m.p - m.p.detach()).sum() if x.item() == 0 else out

    hist = fit(
        model,
        lambda: [(x,) for x in xs],
        loss,
        opt,
        max_steps=9,
        clip_norm=clip,
        progress=False,
    )
    assert hist.skipped_steps == [3, 6, 9] and not hist.diverged
    assert torch.isfinite(model.p).all() and model.p.item() != 0.0
    with pytest.raises(ValueError, match="max_skipped"):
        fit(model, lambda: [(xs[0],)], loss, opt, max_steps=1, max_skipped=0)


def test_nonfinite_loss_is_never_applied(tiny_config):
    model, data = _tiny(tiny_config)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    snapshots = []

    def loss_fn(model, src, tgt):
        snapshots.append([p.detach().clone() for p in model.parameters()])
        loss = translation_loss(model, src, tgt, make_criterion(0.0))
        return loss * float("inf") if len(snapshots) == 3 else loss

    hist = fit(model, data, loss_fn, opt, max_steps=10, progress=False)
    assert hist.diverged and hist.steps == 3 and hist.skipped_steps == [3]
    assert not torch.equal(snapshots[0][0], snapshots[2][0])  # steps 1-2 applied
    for p, before in zip(model.parameters(), snapshots[2]):  # step 3 was not
        assert torch.equal(p.detach(), before) and p.isfinite().all()


def test_evaluation_runs_in_eval_mode_and_training_resumes_in_train_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    modes, grad_enabled = [], []

    def loss_fn(m, x):
        modes.append(m.training)
        return m(x).pow(2).mean()

    def eval_fn():
        grad_enabled.append(torch.is_grad_enabled())
        return float(model.training)

    hist = fit(
        model,
        lambda: [(torch.randn(8, 4),)],
        loss_fn,
        opt,
        max_steps=2,
        eval_every=1,
        eval_fn=eval_fn,
        progress=False,
    )
    assert hist.evals == [(1, 0.0), (2, 0.0)]
    assert modes == [True, True] and grad_enabled == [False, False]
    # known wrong: an eval_fn called as fit once called it sees dropout on
    model.train()
    assert float(model.training) == 1.0


def test_evaluating_restores_each_submodule_mode_even_on_error():
    from transformer_course.training import evaluating

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    model.train()
    model[2].eval()  # a frozen BatchNorm stays frozen
    with pytest.raises(RuntimeError, match="boom"), evaluating(model):
        assert not any(m.training for m in model.modules())
        raise RuntimeError("boom")
    assert [m.training for m in model.modules()] == [True, True, True, False]


@pytest.mark.parametrize(
    "decode, kw", _decoders(), ids=lambda x: getattr(x, "__name__", "")
)
def test_every_decoder_runs_in_eval_mode_and_restores_train_mode(
    decode, kw, tiny_config
):
    from transformer_course.model import DecoderOnlyLM

    kw = dict(kw)
    if kw.pop("lm", False):
        cfg = tiny_config(tgt_vocab_size=10, dropout=0.5)
        model, args = DecoderOnlyLM(cfg), (torch.tensor([[4, 5]]), 3)
    else:
        model, args = _dropout_model(tiny_config), (torch.randint(4, 10, (2, 5)), 4)
    seen = []
    for module in model.modules():
        module.register_forward_pre_hook(lambda m, a: seen.append(m.training))
    model.train()
    runs = [decode(model, *args, **kw) for _ in range(2)]
    assert runs[0] == runs[1] if isinstance(runs[0], list) else torch.equal(*runs)
    assert seen and not any(seen), "the decoder ran the model with dropout on"
    assert all(m.training for m in model.modules()), "training mode was not restored"


def test_train_lm_equals_the_loop_it_replaces(tiny_config):
    from transformer_course.model import DecoderOnlyLM
    from transformer_course.training import train_lm

    ids = torch.randint(0, 12, (300,))
    kw = {"steps": 4, "batch_size": 3, "block": 8, "lr": 3e-3}
    torch.manual_seed(0)
    ref = DecoderOnlyLM(tiny_config())
    last = _chapter7_loop(ref, ids, seed=1, **kw)
    torch.manual_seed(0)
    lm = DecoderOnlyLM(tiny_config())
    hist = train_lm(lm, ids, seed=1, **kw)
    assert hist.steps == 4 and hist.loss[-1] == pytest.approx(last)
    for a, b in zip(lm.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
    assert not lm.training
    torch.manual_seed(0)
    other = DecoderOnlyLM(tiny_config())
    train_lm(other, ids, seed=2, **kw)  # known wrong: other windows, other weights
    assert any(
        not torch.equal(a, b) for a, b in zip(other.parameters(), lm.parameters())
    )


def test_train_lm_raises_on_a_sequence_shorter_than_a_window(tiny_config):
    from transformer_course.model import DecoderOnlyLM
    from transformer_course.training import train_lm

    lm = DecoderOnlyLM(tiny_config())
    with pytest.raises(ValueError, match="ids: expected a 1-D sequence"):
        train_lm(lm, torch.arange(9), steps=1, batch_size=2, block=8)
    with pytest.raises(ValueError, match="batch_size"):
        train_lm(lm, torch.arange(50), steps=1, batch_size=0, block=8)


def test_next_token_windows_and_lm_loss(tiny_config):
    from transformer_course.model import DecoderOnlyLM
    from transformer_course.training import lm_loss, next_token_windows

    x, y = next_token_windows(torch.arange(11), 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert torch.equal(y, x + 1)  # the next id of each
    lm = DecoderOnlyLM(tiny_config()).eval()
    x, y = torch.randint(0, 12, (2, 5)), torch.randint(0, 12, (2, 5))
    logits = lm(x)
    expected = nn.functional.cross_entropy(logits.reshape(10, -1), y.reshape(10))
    torch.testing.assert_close(lm_loss(lm, x, y), expected)
    assert lm_loss(lm, x, x) != expected  # known wrong: the targets are read
    with pytest.raises(ValueError, match="ids"):
        next_token_windows(torch.arange(3), 3)


@pytest.mark.parametrize(
    "helper, build",
    [(_copy_accuracy, _recurrent_model), (_cross_attention, _captioner)],
    ids=["recurrent.copy_accuracy", "vision.cross_attention"],
)
def test_helpers_that_switch_to_eval_mode_restore_every_module_mode(
    helper, build, tiny_config
):
    """Every library helper that evaluates a model gives each submodule back its mode
    (train, or eval for a frozen part): a helper that calls ``model.eval()`` and stops
    there silently turns dropout off for the training that follows."""
    model = build(tiny_config)
    model.train()
    frozen = list(model.modules())[-1]
    frozen.eval()  # a part the caller froze stays frozen
    before = [m.training for m in model.modules()]
    seen = []
    for module in model.modules():
        module.register_forward_pre_hook(lambda m, a: seen.append(m.training))
    helper(model)
    assert seen and not any(seen), "the helper ran the model with dropout on"
    assert [m.training for m in model.modules()] == before
    # known wrong: model.eval() then model.train() loses the frozen part's mode
    model.eval()
    model.train()
    assert [m.training for m in model.modules()] != before
