"""Training loop, learning-rate warmup and the loss with label smoothing.

Derived in chapter 6 ("Training"). Shape letters: B batch, T target length,
V vocabulary.

- ``noam_lr``: lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), the
  schedule of Vaswani et al. 2017, section 5.3, equation (3).
- ``translation_loss``: cross-entropy with label smoothing (section 5.4; Szegedy et al.
  2016) through ``nn.CrossEntropyLoss(label_smoothing=..., ignore_index=pad_id)``, so
  padded positions add nothing.
- ``fit``: AdamW steps with gradient clipping (Pascanu et al. 2013), a tqdm progress
  bar, and a ``History`` of losses, learning rates and gradient norms. A step whose
  loss or gradient is not finite is never applied (as PyTorch's ``GradScaler`` skips
  such steps), and evaluation runs in eval mode.
- ``lm_loss``, ``next_token_windows``, ``train_lm``: next-token prediction for a
  decoder-only LM (chapter 7's Shakespeare model, ``benchmarks/run.py``).
- ``evaluating`` / ``in_eval_mode``: run a block or a function in eval mode without
  gradients, then give every submodule back the mode it had.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from transformer_course import _validation
from transformer_course.data import PAD_ID

Tensor = torch.Tensor


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The warmup schedule of Vaswani et al. 2017, equation (3).

    Rises linearly for ``warmup`` steps, then decays as 1 / sqrt(step); the peak, at
    step = warmup, is factor / sqrt(d_model * warmup). ``step`` counts from 1.

    Raises:
        TypeError / ValueError: step or warmup not an int >= 1.
    """
    _validation.positive_int("step", step)
    _validation.positive_int("warmup", warmup)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_scheduler(optimizer, d_model: int, warmup: int, factor: float = 1.0):
    """A ``LambdaLR`` that sets the learning rate to ``noam_lr`` at every step (the
    optimizer's own lr should be 1.0, it is multiplied by the schedule)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: noam_lr(i + 1, d_model, warmup, factor)
    )


def translation_loss(model, src: Tensor, tgt: Tensor, criterion: nn.Module) -> Tensor:
    """Teacher forcing: the decoder reads tgt[:, :-1] (BOS, y_1, ..., y_{T-1}) and is
    scored on predicting tgt[:, 1:] (y_1, ..., EOS) at every position at once.

    Shapes: src (B, S), tgt (B, T + 1) ids; returns a scalar loss.
    """
    logits = model(src, tgt[:, :-1])  # (B, T, V)
    return criterion(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))


def make_criterion(label_smoothing: float = 0.1, pad_id: int = PAD_ID) -> nn.Module:
    """Cross-entropy with label smoothing that ignores padding targets.

    The smoothed target puts 1 - eps on the right token and eps / V on every token
    (PyTorch's convention). ``ignore_index`` drops padded positions from the loss
    and from the average.
    """
    return nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=pad_id)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``with evaluating(model):`` runs the block with ``model`` in eval mode (dropout
    off) and under ``torch.no_grad()``; afterwards every submodule is back in the mode
    it had before (train or eval), also when the block raises.

    Evaluating in train mode is a classic bug: dropout makes the validation loss noisy
    and biased, and a decoder that calls ``model.eval()`` without restoring the mode
    silently turns dropout off for the rest of training.
    """
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for module, mode in modes:
            module.training = mode


def in_eval_mode(fn: Callable) -> Callable:
    """Decorator for ``fn(model, ...)``: the call runs inside ``evaluating(model)``
    (used by every decoder in ``decoding``)."""

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        with evaluating(model):
            return fn(model, *args, **kwargs)

    return wrapper


def _static_mode() -> bool:
    """``viz.static_mode()``, imported when a bar is to be shown: importing ``viz``
    loads matplotlib and IPython, which the core modules never do at import."""
    from transformer_course.viz.interactive import static_mode

    return static_mode()


@dataclass
class History:
    """What ``fit`` measured: one entry per optimisation step, plus evaluations.

    A step whose loss or gradient norm is not finite is counted (its loss and norm are
    recorded) but not applied: its number is in ``skipped_steps`` and the weights keep
    their last finite values.
    """

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)  # before clipping
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, value)
    seconds: float = 0.0
    skipped_steps: list[int] = field(default_factory=list)  # not applied (1-based)
    diverged: bool = False  # stopped: a non-finite loss, or too many skipped steps

    @property
    def steps(self) -> int:
        return len(self.loss)


def _grad_norm(params: list[nn.Parameter]) -> Tensor:
    """The global L2 norm of the gradients (as ``clip_grad_norm_`` computes it)."""
    if not params:
        return torch.zeros(())
    norms = [
        torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32) for p in params
    ]
    return torch.linalg.vector_norm(torch.stack(norms))


def fit(
    model: nn.Module,
    batches: Callable[[], Iterable],
    loss_fn: Callable[..., Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    max_steps: int,
    scheduler=None,
    clip_norm: float | None = 1.0,
    max_seconds: float | None = None,
    eval_fn: Callable[[], float] | None = None,
    eval_every: int = 0,
    max_skipped: int = 10,
    progress: bool = True,
    desc: str = "training",
    after_step: Callable[[int], None] | None = None,
) -> History:
    """Train ``model`` for ``max_steps`` optimisation steps.

    Before every ``optimizer.step()`` the loss and the global gradient norm are
    checked: if either is NaN or infinite, the step is not applied (nor the scheduler
    stepped), so no parameter ever receives a non-finite value. Clipping cannot save
    such a step: ``clip_grad_norm_`` scales an infinite gradient by 0, giving NaN.

    Args:
        batches: called with no argument for each pass over the data; yields batches
            (tuples of tensors), each passed as ``loss_fn(model, *batch)``.
        loss_fn: returns the scalar loss of a batch, e.g. ``translation_loss`` with a
            criterion bound by ``functools.partial``.
        optimizer, scheduler: stepped once per batch (scheduler optional).
        clip_norm: clip the global gradient norm to this value (None: no clipping).
        max_seconds: also stop when this wall-clock budget is spent.
        eval_fn / eval_every: call ``eval_fn()`` every ``eval_every`` steps (and at the
            end) and record ``(step, value)`` in ``History.evals``. It runs inside
            ``evaluating(model)`` (eval mode, no gradients); training resumes in the
            mode the model had.
        max_skipped: stop (``diverged=True``) after this many consecutive steps with
            a non-finite gradient.
        progress: show a tqdm bar with the running loss (a widget in Jupyter). In the
            book build (``static_mode()``) the bar is off: a live widget cannot be
            shown on the static site, and the cell prints its own summary.
        after_step: called as ``after_step(step)`` (the 1-based step count) after
            every applied optimizer step, e.g. to average the weights.

    Returns:
        A ``History``. Training stops early, with ``diverged=True``, when the loss
        becomes NaN or infinite (that step is not applied) or after ``max_skipped``
        consecutive skipped steps; the model keeps its last finite weights. The
        model is left in eval mode (training is over; call ``model.train()`` to
        continue).

    Raises:
        ValueError: for ``max_steps`` < 1, ``clip_norm`` <= 0 or ``max_skipped`` < 1,
            and when a call of ``batches()`` yields no batch (an empty dataset, or a
            ``lambda`` that returns one generator already used up), which would
            otherwise loop forever.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps: expected >= 1, got {max_steps}")
    if clip_norm is not None and clip_norm <= 0:
        raise ValueError(f"clip_norm: expected > 0 or None, got {clip_norm}")
    if max_skipped < 1:
        raise ValueError(f"max_skipped: expected >= 1, got {max_skipped}")
    hist = History()
    start = time.perf_counter()
    bar = tqdm(
        total=max_steps,
        desc=desc,
        disable=not progress or _static_mode(),
        mininterval=1.0,
    )

    def evaluate() -> None:
        with evaluating(model):
            hist.evals.append((hist.steps, eval_fn()))

    model.train()
    skipped_in_a_row = 0
    passes = 0
    while hist.steps < max_steps and not hist.diverged:
        passes += 1
        steps_before = hist.steps
        for batch in batches():
            loss = loss_fn(model, *batch)
            optimizer.zero_grad(set_to_none=True)
            hist.lr.append(optimizer.param_groups[0]["lr"])
            hist.loss.append(loss.item())
            if math.isfinite(hist.loss[-1]):
                loss.backward()
                params = [p for p in model.parameters() if p.grad is not None]
                norm = _grad_norm(params)
                hist.grad_norm.append(norm.item())
            else:  # the forward pass already broke: nothing to learn from this step
                hist.grad_norm.append(math.nan)
                hist.diverged = True
            if math.isfinite(hist.grad_norm[-1]):
                if clip_norm is not None:  # the same scaling as clip_grad_norm_
                    coef = torch.clamp(clip_norm / (norm + 1e-6), max=1.0)
                    for p in params:
                        p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                if after_step is not None:
                    after_step(hist.steps)
                skipped_in_a_row = 0
            else:  # never step on NaN or inf: keep the last finite weights
                optimizer.zero_grad(set_to_none=True)
                hist.skipped_steps.append(hist.steps)
                skipped_in_a_row += 1
                hist.diverged = hist.diverged or skipped_in_a_row >= max_skipped
            bar.update(1)
            bar.set_postfix(loss=f"{hist.loss[-1]:.3f}", refresh=False)
            if eval_fn is not None and eval_every and hist.steps % eval_every == 0:
                evaluate()
            out_of_time = max_seconds and time.perf_counter() - start > max_seconds
            if hist.steps >= max_steps or hist.diverged or out_of_time:
                break
        if hist.steps == steps_before:  # an empty pass would repeat forever
            bar.close()
            raise ValueError(
                f"batches: expected every call to yield at least one batch, got none "
                f"on pass {passes} (an empty dataset, or a function returning an "
                "already exhausted iterator: return a new generator on each call)"
            )
        if max_seconds and time.perf_counter() - start > max_seconds:
            break
    bar.close()
    hist.seconds = time.perf_counter() - start
    if eval_fn is not None and not (hist.evals and hist.evals[-1][0] == hist.steps):
        evaluate()
    model.eval()
    return hist


def lm_loss(model, x: Tensor, y: Tensor) -> Tensor:
    """Next-token cross-entropy of a decoder-only LM, in nats per token.

    Shapes: x (B, L) ids, y (B, L) the id after each of them; returns a scalar. The
    logits are cast to float32 first (a bfloat16 model scores like a float32 one).
    """
    logits = model(x)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def next_token_windows(ids: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """Cut a 1-D id sequence into non-overlapping windows and their next tokens.

    Shapes: ids (N,) -> (x, y), each (W, block) with W = (N - 1) // block; y is x
    shifted by one token. Raises ValueError when ids holds no whole window.
    """
    _validation.positive_int("block", block)
    n = (len(ids) - 1) // block
    if ids.dim() != 1 or n < 1:
        raise ValueError(
            f"ids: expected a 1-D sequence of more than block = {block} ids, got "
            f"shape {tuple(ids.shape)}"
        )
    used = ids[: n * block + 1]
    return used[:-1].view(n, block), used[1:].view(n, block)  # (W, block) each


def train_lm(
    model: nn.Module,
    ids: Tensor,
    *,
    steps: int,
    batch_size: int,
    block: int,
    lr: float = 3e-3,
    seed: int = 0,
) -> History:
    """Train a decoder-only LM on random windows of one long id sequence.

    Each step draws ``batch_size`` windows of ``block + 1`` ids at random starts (a
    ``torch.Generator`` seeded with ``seed``, on the CPU) and takes one AdamW step on
    ``lm_loss`` through ``fit`` (no clipping, no progress bar). Used by chapter 7 and
    ``benchmarks/run.py``.

    Shapes: ids (N,) on the model's device, N > block + 1.

    Returns:
        ``fit``'s ``History`` (``loss[-1]`` is the last step's loss); the model is
        left in eval mode.

    Raises:
        TypeError / ValueError: steps, batch_size or block not an int >= 1, or ids
            too short for one window.
    """
    _validation.positive_int("batch_size", batch_size)
    next_token_windows(ids, block + 1)  # checks block and that one window fits
    generator = torch.Generator().manual_seed(seed)

    def windows():
        while True:
            starts = torch.randint(
                0, len(ids) - block - 1, (batch_size,), generator=generator
            )
            batch = torch.stack([ids[s : s + block + 1] for s in starts.tolist()])
            yield batch[:, :-1], batch[:, 1:]  # (B, block) inputs and next ids

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return fit(
        model,
        windows,
        lm_loss,
        optimizer,
        max_steps=steps,
        clip_norm=None,
        progress=False,
    )
