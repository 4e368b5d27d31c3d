"""Training loop, learning-rate warmup and the loss with label smoothing.

Derived in chapter 6 ("Training"). Shape letters: B batch, T target length,
V vocabulary.

- ``noam_lr``: lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), the
  schedule of Vaswani et al. 2017, section 5.3, equation (3).
- ``translation_loss``: cross-entropy with label smoothing (section 5.4; Szegedy et al.
  2016) through ``nn.CrossEntropyLoss(label_smoothing=..., ignore_index=pad_id)``, so
  padded positions add nothing.
- ``fit``: AdamW steps with gradient clipping (Pascanu et al. 2013), a tqdm progress
  bar, and a ``History`` of losses, learning rates and gradient norms.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from transformer_course.data import PAD_ID
from transformer_course.viz.interactive import static_mode

Tensor = torch.Tensor


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The warmup schedule of Vaswani et al. 2017, equation (3).

    Rises linearly for ``warmup`` steps, then decays as 1 / sqrt(step); the peak, at
    step = warmup, is factor / sqrt(d_model * warmup). ``step`` counts from 1.

    Raises:
        ValueError: for step < 1 or warmup < 1.
    """
    if step < 1 or warmup < 1:
        raise ValueError(
            f"step, warmup: expected >= 1, got step={step}, warmup={warmup}"
        )
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


@dataclass
class History:
    """What ``fit`` measured: one entry per optimisation step, plus evaluations."""

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)  # before clipping
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, value)
    seconds: float = 0.0
    diverged: bool = False  # stopped because the loss became NaN or infinite

    @property
    def steps(self) -> int:
        return len(self.loss)


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
    progress: bool = True,
    desc: str = "training",
) -> History:
    """Train ``model`` for ``max_steps`` optimisation steps.

    Args:
        batches: called with no argument for each pass over the data; yields batches
            (tuples of tensors), each passed as ``loss_fn(model, *batch)``.
        loss_fn: returns the scalar loss of a batch, e.g. ``translation_loss`` with a
            criterion bound by ``functools.partial``.
        optimizer, scheduler: stepped once per batch (scheduler optional).
        clip_norm: clip the global gradient norm to this value (None: no clipping).
        max_seconds: also stop when this wall-clock budget is spent.
        eval_fn / eval_every: call ``eval_fn()`` every ``eval_every`` steps (and at the
            end) and record ``(step, value)`` in ``History.evals``.
        progress: show a tqdm bar with the running loss (a widget in Jupyter). In the
            book build (``static_mode()``) the bar is off: a live widget cannot be
            shown on the static site, and the cell prints its own summary.

    Returns:
        A ``History``. Training stops early, with ``diverged=True``, when the loss
        becomes NaN or infinite.

    Raises:
        ValueError: for ``max_steps`` < 1 or ``clip_norm`` <= 0.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps: expected >= 1, got {max_steps}")
    if clip_norm is not None and clip_norm <= 0:
        raise ValueError(f"clip_norm: expected > 0 or None, got {clip_norm}")
    hist = History()
    start = time.perf_counter()
    bar = tqdm(
        total=max_steps,
        desc=desc,
        disable=not progress or static_mode(),
        mininterval=1.0,
    )
    model.train()
    while hist.steps < max_steps and not hist.diverged:
        for batch in batches():
            loss = loss_fn(model, *batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            params = [p for p in model.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf)
            hist.lr.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            hist.loss.append(loss.item())
            hist.grad_norm.append(norm.item())
            bar.update(1)
            bar.set_postfix(loss=f"{hist.loss[-1]:.3f}", refresh=False)
            if not math.isfinite(hist.loss[-1]):
                hist.diverged = True
            if eval_fn is not None and eval_every and hist.steps % eval_every == 0:
                hist.evals.append((hist.steps, eval_fn()))
                model.train()
            out_of_time = max_seconds and time.perf_counter() - start > max_seconds
            if hist.steps >= max_steps or hist.diverged or out_of_time:
                break
        if max_seconds and time.perf_counter() - start > max_seconds:
            break
    bar.close()
    hist.seconds = time.perf_counter() - start
    if eval_fn is not None and not (hist.evals and hist.evals[-1][0] == hist.steps):
        hist.evals.append((hist.steps, eval_fn()))
    model.eval()
    return hist
