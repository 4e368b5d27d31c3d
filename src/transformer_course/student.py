"""Training a distilled student: the teacher's targets, the loop, and the shipped student.

Chapter 9 ("Smaller models") trains 2-layer students of all-MiniLM-L6-v2 with these
functions for a few seconds each; ``tools/distill_student.py`` trains the best recipe
with the same functions for longer and writes ``STUDENT_FILE`` (the two layers in
float16 and a JSON training record), which ``load_student`` reads. The losses and the
fidelity yardstick are in ``distill``.

Shape letters: B batch, S tokens, D d_model, H heads, d_k head size. Masks are bool,
True = real token.

Sources:
    Sanh et al. 2019, "DistilBERT", section 3 (cosine loss; a student initialised
    from the teacher's layers).
    Jiao et al. 2020, "TinyBERT", equation (8) (token-state MSE).
    Wang et al. 2020, "MiniLM", equations (6)-(8) (last-layer attention and values).
    Loshchilov and Hutter 2017, "SGDR" (the cosine decay of the learning rate).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_course import _validation
from transformer_course.device import seeded
from transformer_course.distill import (
    attention_kl,
    cosine_loss,
    hidden_mse,
    mean_pool,
    value_relation_kl,
)
from transformer_course.pretrained import MiniLMEncoder, tokenize_batch
from transformer_course.prune import encoder_states
from transformer_course.training import evaluating

Tensor = torch.Tensor

STUDENT_FILE = Path(__file__).parent / "weights" / "minilm_l2_student.safetensors"
"""The 2-layer student that ``tools/distill_student.py`` trained for longer than a
chapter can (its training record is in the file's metadata)."""

_EMBEDDINGS = (
    "word_embeddings",
    "position_embeddings",
    "segment_embeddings",
    "embed_norm",
)


@dataclass
class DistillBatch:
    """One batch of training lines with the teacher's targets, computed once.

    ids, mask: (B, S) int64 and bool (True = real token). hidden: (B, S, D) the
    teacher's last-layer token states; pooled: (B, D) their mean over real tokens;
    attn: (B, H, S, S) the last layer's attention weights and values: (B, H, S, d_k)
    its per-head values (both None when not asked for). All float32.
    """

    ids: Tensor
    mask: Tensor
    hidden: Tensor
    pooled: Tensor
    attn: Tensor | None = None
    values: Tensor | None = None


def _last_values(model, last_input: Tensor) -> Tensor:
    """The last layer's per-head values (B, H, S, d_k) from its input (B, S, D)."""
    mha = model.layers[-1].self_attn
    return mha.split_heads(mha.v_proj(last_input))


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(
        device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None
    )


@torch.no_grad()
def teacher_targets(
    teacher,
    lines: Sequence[str],
    *,
    batch_size: int = 32,
    with_attention: bool = True,
    autocast_dtype: torch.dtype | None = None,
) -> list[DistillBatch]:
    """The teacher's targets for ``lines``, batched after sorting by length (a batch
    holds lines of about the same length, so little padding is computed).

    Args:
        teacher: a ``pretrained.MiniLMEncoder`` (eval mode); the batches go to its device.
        lines: the training sentences (str).
        batch_size: lines per batch (>= 1).
        with_attention: also keep the last layer's attention weights and values
            (MiniLM's targets; they take S / d_k times the memory of the states).
        autocast_dtype: e.g. ``torch.bfloat16`` to compute in lower precision (faster
            on CPUs with bf16 units); the targets are stored in float32.

    Returns:
        A list of ``DistillBatch``.

    Raises:
        ValueError: no lines, or batch_size < 1.
        TypeError: a batch_size that is not an int.
    """
    if len(lines) == 0:
        raise ValueError("lines: expected at least 1 line, got none")
    _validation.positive_int("batch_size", batch_size)
    device = next(teacher.parameters()).device
    by_length = sorted(lines, key=len)
    out = []
    for i in range(0, len(by_length), batch_size):
        ids, mask, _ = tokenize_batch(list(by_length[i : i + batch_size]))
        ids, mask = ids.to(device), mask.to(device)
        with _autocast(device, autocast_dtype):
            hidden, last_in = encoder_states(teacher, ids, mask)  # (B, S, D)
            attn = values = None
            if with_attention:
                attn = teacher.layers[-1].self_attn_weights.float()  # (B, H, S, S)
                values = _last_values(teacher, last_in).float()  # (B, H, S, d_k)
        hidden = hidden.float()
        out.append(
            DistillBatch(ids, mask, hidden, mean_pool(hidden, mask), attn, values)
        )
    return out


def make_student(teacher, *, n_layers: int = 2, init_from=None, seed: int = 0):
    """A ``MiniLMEncoder`` with ``n_layers`` layers of the teacher's shape that keeps the
    teacher's embeddings (copied and frozen).

    Args:
        teacher: a ``pretrained.MiniLMEncoder``.
        n_layers: the student's number of layers (>= 1).
        init_from: None (random layers, drawn from a stream seeded by ``seed``;
            the caller's random state is untouched) or ``n_layers`` teacher
            layer indices to copy, e.g. (0, 5) for the first and last layer
            (DistilBERT initialises from one teacher layer in two).

    Returns:
        The student, on the teacher's device, in training mode.

    Raises:
        ValueError: n_layers < 1, or init_from of another length or out of range.
        TypeError: an n_layers that is not an int.

    Source: Sanh et al. 2019, section 3 (initialisation from the teacher's layers).
    """
    n_teacher = len(teacher.layers)
    _validation.positive_int("n_layers", n_layers)
    if init_from is not None and (
        len(init_from) != n_layers or not all(0 <= i < n_teacher for i in init_from)
    ):
        raise ValueError(
            f"init_from: expected {n_layers} teacher layer indices in [0, {n_teacher}), "
            f"got {tuple(init_from)}"
        )
    with seeded(seed):  # the caller's random stream is left as it was
        student = MiniLMEncoder({**teacher.cfg, "n_layers": n_layers})
    for name in _EMBEDDINGS:
        part = getattr(student, name)
        part.load_state_dict(getattr(teacher, name).state_dict())
        part.requires_grad_(False)
    for mine, theirs in enumerate(init_from or ()):
        student.layers[mine].load_state_dict(teacher.layers[theirs].state_dict())
    return student.to(next(teacher.parameters()).device).train()


def student_loss(
    student, batch: DistillBatch, *, with_attention: bool = False
) -> Tensor:
    """The distillation loss of one batch: ``cosine_loss`` of the pooled embeddings plus
    ``hidden_mse`` of the token states, plus, with ``with_attention``, MiniLM's
    ``attention_kl`` and ``value_relation_kl`` of the last layer.

    Returns a scalar tensor (with a graph to the student's parameters).
    Raises ValueError: with_attention and a batch without attention targets.
    Source: Sanh et al. 2019, section 3; Jiao et al. 2020, eq. (8); Wang et al. 2020,
    eq. (6)-(8).
    """
    hidden, last_in = encoder_states(student, batch.ids, batch.mask)  # (B, S, D)
    hidden = hidden.float()
    loss = cosine_loss(mean_pool(hidden, batch.mask), batch.pooled) + hidden_mse(
        hidden, batch.hidden, batch.mask
    )
    if with_attention:
        if batch.attn is None:
            raise ValueError(
                "batch: with_attention needs teacher_targets(..., with_attention=True)"
            )
        s_attn = student.layers[-1].self_attn_weights.float()
        s_values = _last_values(student, last_in).float()
        loss = (
            loss
            + attention_kl(s_attn, batch.attn, batch.mask)
            + value_relation_kl(s_values, batch.values, batch.mask)
        )
    return loss


def lr_at(fraction: float, peak: float, warmup: float = 0.1) -> float:
    """The learning rate after ``fraction`` (0..1) of the budget: linear warmup to
    ``peak`` over the first ``warmup`` of it, then a cosine decay to 0 (Loshchilov and
    Hutter 2017). The budget is time, so students given equal time get equal schedules."""
    fraction = min(max(fraction, 0.0), 1.0)
    if fraction < warmup:
        return peak * fraction / warmup
    return peak * 0.5 * (1.0 + math.cos(math.pi * (fraction - warmup) / (1.0 - warmup)))


def train_student(
    student,
    batches: Sequence[DistillBatch],
    seconds: float,
    *,
    lr: float = 1e-3,
    warmup: float = 0.1,
    with_attention: bool = False,
    autocast_dtype: torch.dtype | None = None,
    seed: int = 0,
    clock: Callable[[], float] | None = None,
    report_every: float | None = None,
    report: Callable[[float, int], None] | None = None,
) -> int:
    """Distil into ``student`` for ``seconds`` with AdamW (weight decay 0.01) and the
    time-based schedule ``lr_at``, visiting the batches in a new random order each pass.

    Args:
        student: from ``make_student``; its frozen parameters stay frozen.
        batches: from ``teacher_targets``.
        seconds: the budget (> 0), measured by ``clock``: by default this process's CPU
            time on a CPU (other work on a shared machine does not shorten it) and
            wall-clock time on a GPU.
        lr: the peak learning rate (> 0). warmup: its share of the budget, in [0, 1).
        with_attention: add MiniLM's attention and value-relation losses.
        autocast_dtype: e.g. ``torch.bfloat16`` for mixed precision.
        report_every, report: call ``report(elapsed_seconds, steps)`` every
            ``report_every`` seconds of the budget (the student in eval mode; it is put
            back in training mode after).

    Returns:
        The number of optimiser steps taken; the student is left in eval mode.

    Raises:
        ValueError: seconds <= 0, lr <= 0, warmup outside [0, 1), or no batches.
    """
    if not seconds > 0 or not lr > 0 or not 0 <= warmup < 1 or len(batches) == 0:
        raise ValueError(
            f"seconds, lr, warmup, batches: expected seconds > 0, lr > 0, 0 <= warmup < 1 "
            f"and >= 1 batch, got {seconds!r}, {lr!r}, {warmup!r}, {len(batches)} batches"
        )
    device = next(student.parameters()).device
    if clock is None:
        clock = time.process_time if device.type == "cpu" else time.perf_counter
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    steps, start = 0, clock()
    next_report = report_every if report is not None and report_every else math.inf
    student.train()
    while (elapsed := clock() - start) < seconds:
        if elapsed >= next_report:
            with evaluating(student):
                report(elapsed, steps)
            next_report += report_every
        for group in opt.param_groups:
            group["lr"] = lr_at(elapsed / seconds, lr, warmup)
        if not order:
            order = torch.randperm(len(batches), generator=generator).tolist()
        with _autocast(device, autocast_dtype):
            loss = student_loss(
                student, batches[order.pop()], with_attention=with_attention
            )
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    student.eval()
    return steps


def save_student(student, path: str | Path, record: dict) -> None:
    """Write the student's Transformer layers (float16) and ``record`` (a
    JSON-serialisable dict: how it was trained) to a safetensors file. The embeddings
    are not written: they are the teacher's."""
    from safetensors.torch import save_file

    tensors = {
        f"layers.{k}": v.detach().to("cpu", torch.float16).contiguous()
        for k, v in student.layers.state_dict().items()
    }
    record = {**record, "n_layers": len(student.layers), "cfg": student.cfg}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"training": json.dumps(record)})


def load_student(teacher, path: str | Path = STUDENT_FILE):
    """The student written by ``save_student``: its layers from ``path`` (float32), the
    teacher's embeddings, on the teacher's device, in eval mode.

    Returns:
        ``(student, record)``: the ``MiniLMEncoder`` and the training record (dict).

    Raises:
        FileNotFoundError: no file at ``path``. ValueError: the file was not written by
        ``save_student`` for a student of this teacher's shape.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no student weights at {path}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
    if "training" not in meta:
        raise ValueError(f"path: {path} has no training record (not from save_student)")
    record = json.loads(meta["training"])
    if {**record["cfg"], "n_layers": None} != {**teacher.cfg, "n_layers": None}:
        raise ValueError(
            f"path: the student in {path} does not fit this teacher's shape"
        )
    student = make_student(teacher, n_layers=record["n_layers"])
    layers = {k.removeprefix("layers."): v.float() for k, v in tensors.items()}
    student.layers.load_state_dict(layers)
    return student.eval(), record
