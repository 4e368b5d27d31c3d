"""Knowledge distillation and the fidelity yardstick of a smaller model.

Derived in chapter 9 ("Smaller models"). A small *student* learns to reproduce a large
*teacher*: its softened output distribution (Hinton et al. 2015), its sentence
embeddings (DistilBERT's cosine loss), and the self-attention distributions and value
relations of its last layer (MiniLM, Wang et al. 2020, the method that trained
all-MiniLM-L6-v2 itself). Fidelity to the teacher is measured without labels: how well
the student keeps the teacher's pairwise similarities between sentences.

Shape letters: B batch, S tokens, D d_model, H heads, d_k head size, C classes,
N sentences. Masks are bool, True = real token.

Sources:
    Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a Neural Network",
    section 2 (soft targets, temperature, the T^2 factor).
    Sanh et al. 2019, "DistilBERT", section 3 (cosine embedding loss, initialising the
    student from every other teacher layer).
    Wang et al. 2020, "MiniLM", section 3.1 (attention-distribution KL, eq. 6) and 3.2
    (value-relation KL, eq. 7-8), both on the last layer only.
    Reimers and Gurevych 2019, "Sentence-BERT" (mean pooling).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer_course import _validation

Tensor = torch.Tensor


def _same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    _validation.float_tensor(name_a, a, 1)
    _validation.float_tensor(name_b, b, 1)
    if a.shape != b.shape:
        raise ValueError(
            f"{name_b}: expected the shape of {name_a} {tuple(a.shape)}, "
            f"got {tuple(b.shape)}"
        )


def soft_target_loss(
    student_logits: Tensor, teacher_logits: Tensor, temperature: float = 2.0
) -> Tensor:
    """Hinton et al.'s distillation loss: T^2 KL(p_T(teacher) || p_T(student)).

    p_T(z) = softmax(z / T) softens both distributions with the same temperature T.
    The gradient with respect to a student logit is (p_T(student) - p_T(teacher)) / T,
    so it shrinks like 1 / T^2 as T grows (for T large and logits centred); the T^2
    factor keeps the soft loss on the scale of a hard-label loss whatever T is.

    Args:
        student_logits, teacher_logits: (..., C) float, same shape; the last
            dimension is the classes (or vocabulary).
        temperature: T > 0.

    Returns:
        Scalar: the KL summed over classes, averaged over all leading positions,
        times T^2. Zero when the logits agree (up to a constant per row).

    Raises:
        TypeError: non-float tensors. ValueError: different shapes, T <= 0.

    Source: Hinton et al. 2015, section 2 and 2.1.
    """
    _same_shape("student_logits", student_logits, "teacher_logits", teacher_logits)
    if not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0, got {temperature}")
    log_p_student = F.log_softmax(student_logits / temperature, dim=-1)  # (..., C)
    log_p_teacher = F.log_softmax(teacher_logits / temperature, dim=-1)  # (..., C)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)  # (...,)
    return kl.mean() * temperature**2


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Average of the real tokens' vectors: sentence-transformers' pooling.

    Shapes: hidden (B, S, D) float; mask (B, S) bool, True = real token.
    Returns (B, D). A row without real tokens gives zeros (never NaN).
    Raises ValueError if the shapes do not match.
    Source: Reimers and Gurevych 2019, section 3.
    """
    _validation.float_tensor("hidden", hidden, 3)
    if mask.dtype != torch.bool or mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"mask: expected bool (B, S) = {tuple(hidden.shape[:2])}, got "
            f"{mask.dtype} {tuple(mask.shape)}"
        )
    weights = mask[..., None].to(hidden.dtype)  # (B, S, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, D)


def cosine_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean of 1 - cos(student_b, teacher_b) over the batch: DistilBERT's cosine
    embedding loss. Shapes: (B, D) each; returns a scalar in [0, 2].
    Source: Sanh et al. 2019, section 3."""
    _same_shape("student", student, "teacher", teacher)
    return (1.0 - F.cosine_similarity(student, teacher, dim=-1)).mean()


def hidden_mse(student_hidden: Tensor, teacher_hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error between the student's and the teacher's token states,
    averaged over the real tokens and the D features: a target for every token, not
    one vector per sentence (DistilBERT's cosine loss is on these states too; TinyBERT
    uses this MSE).

    Shapes: student_hidden, teacher_hidden (B, S, D) float; mask (B, S) bool,
    True = real token. Returns a scalar >= 0, zero when the real tokens agree.
    Raises TypeError / ValueError for non-float tensors or different shapes.
    Source: Jiao et al. 2020, "TinyBERT", section 3.1, equation (8); Sanh et al.
    2019, section 3.
    """
    _same_shape("teacher_hidden", teacher_hidden, "student_hidden", student_hidden)
    weights = mask[..., None].to(student_hidden.dtype)  # (B, S, 1)
    sq = (student_hidden - teacher_hidden) ** 2 * weights  # (B, S, D)
    return sq.sum() / (weights.sum() * student_hidden.shape[-1]).clamp(min=1.0)


def _row_kl(p_teacher: Tensor, p_student: Tensor, mask: Tensor) -> Tensor:
    """KL(teacher row || student row) averaged over heads and real query tokens.
    p_* (B, H, S, S), rows are distributions over keys; mask (B, S)."""
    eps = 1e-12
    kl = p_teacher * (torch.log(p_teacher + eps) - torch.log(p_student + eps))
    kl = kl.sum(-1)  # (B, H, S): one KL per query row
    rows = mask[:, None, :].to(kl.dtype)  # (B, 1, S): real queries only
    return (kl * rows).sum() / (rows.sum() * kl.shape[1]).clamp(min=1.0)


def attention_kl(student_attn: Tensor, teacher_attn: Tensor, mask: Tensor) -> Tensor:
    """MiniLM's attention transfer: KL(teacher's attention || student's), per head.

    Each query row of a head's weights is a distribution over keys; the loss is the
    KL from the teacher's row to the student's, averaged over heads and real query
    tokens. Student and teacher need the same number of heads (not of layers, nor
    of d_model).

    Shapes: student_attn, teacher_attn (B, H, S, S), rows summing to 1 over real
    keys (padded keys 0); mask (B, S) bool, True = real token.
    Returns a scalar >= 0, zero when the weights agree.
    Raises TypeError / ValueError for non-float tensors or different shapes.
    Source: Wang et al. 2020, section 3.1, equation (6).
    """
    _same_shape("teacher_attn", teacher_attn, "student_attn", student_attn)
    return _row_kl(teacher_attn, student_attn, mask)


def value_relation(values: Tensor, mask: Tensor) -> Tensor:
    """MiniLM's value relation softmax(V V^T / sqrt(d_k)) of each head.

    Shapes: values (B, H, S, d_k), the per-head values of a layer's self-attention;
    mask (B, S) bool. Returns (B, H, S, S); padded keys get weight 0.
    Source: Wang et al. 2020, section 3.2, equation (7).
    """
    _validation.float_tensor("values", values, 4)
    scores = values @ values.transpose(-2, -1) / math.sqrt(values.shape[-1])
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))  # (B,H,S,S)
    return torch.softmax(scores, dim=-1)


def value_relation_kl(
    student_values: Tensor, teacher_values: Tensor, mask: Tensor
) -> Tensor:
    """KL(teacher's value relation || student's), averaged over heads and real query
    tokens. Shapes: values (B, H, S, d_k) each (d_k may differ), mask (B, S).
    Source: Wang et al. 2020, section 3.2, equation (8)."""
    _validation.float_tensor("student_values", student_values, 4)
    _validation.float_tensor("teacher_values", teacher_values, 4)
    if student_values.shape[:3] != teacher_values.shape[:3]:
        raise ValueError(
            f"student_values: expected (B, H, S) = {tuple(teacher_values.shape[:3])} "
            f"as teacher_values, got {tuple(student_values.shape[:3])}"
        )
    return _row_kl(
        value_relation(teacher_values, mask), value_relation(student_values, mask), mask
    )


# -------------------------------------------------------------- fidelity yardstick


def pairwise_cosine(embeddings: Tensor) -> Tensor:
    """Cosine similarity of every pair of distinct rows: (N, D) -> (N * (N - 1) / 2,),
    the upper triangle of the (N, N) similarity matrix, row by row."""
    _validation.float_tensor("embeddings", embeddings, 2)
    if embeddings.dim() != 2 or embeddings.shape[0] < 3:
        raise ValueError(
            f"embeddings: expected (N, D) with N >= 3, got {tuple(embeddings.shape)}"
        )
    unit = F.normalize(embeddings.float(), dim=-1)
    sims = unit @ unit.T  # (N, N)
    i, j = torch.triu_indices(len(sims), len(sims), offset=1)
    return sims[i, j]


def _ranks(x: Tensor) -> Tensor:
    ranks = torch.empty_like(x)
    ranks[x.argsort()] = torch.arange(len(x), dtype=x.dtype, device=x.device)
    return ranks  # ties are broken by position (cosines of real sentences rarely tie)


def spearman_fidelity(embeddings: Tensor, reference: Tensor) -> float:
    """Spearman correlation between the pairwise cosine similarities of
    ``embeddings`` and those of ``reference`` (the full model's) for the same N
    sentences: 1.0 means the same ordering of all pairs, ~0 unrelated.

    Shapes: embeddings (N, D), reference (N, D') with N >= 3 (D may differ).
    Returns a float in [-1, 1].
    Raises ValueError for fewer than 3 sentences or different N.
    Source: the semantic-textual-similarity yardstick of Reimers and Gurevych 2019
    (section 4.1), here against the teacher instead of human labels.
    """
    if embeddings.shape[0] != reference.shape[0]:
        raise ValueError(
            f"embeddings: expected N = {reference.shape[0]} rows as reference, "
            f"got {embeddings.shape[0]}"
        )
    a = _ranks(pairwise_cosine(embeddings).double())
    b = _ranks(pairwise_cosine(reference).double())
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def nearest_neighbours(embeddings: Tensor) -> Tensor:
    """Index of each row's most cosine-similar other row: (N, D) -> (N,) int64."""
    _validation.float_tensor("embeddings", embeddings, 2)
    unit = F.normalize(embeddings.float(), dim=-1)
    sims = (unit @ unit.T).fill_diagonal_(float("-inf"))  # (N, N), self excluded
    return sims.argmax(dim=-1)


def neighbour_agreement(embeddings: Tensor, reference: Tensor) -> float:
    """Share of the N sentences whose nearest other sentence is the same under
    ``embeddings`` as under ``reference``. Shapes (N, D) and (N, D'); returns a float
    in [0, 1]; a random model scores about 1 / (N - 1)."""
    if embeddings.shape[0] != reference.shape[0]:
        raise ValueError(
            f"embeddings: expected N = {reference.shape[0]} rows as reference, "
            f"got {embeddings.shape[0]}"
        )
    same = nearest_neighbours(embeddings) == nearest_neighbours(reference)
    return float(same.float().mean())


# ------------------------------------------------------------- training a student

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
    """
    from transformer_course.pretrained import tokenize_batch
    from transformer_course.prune import encoder_states

    if len(lines) == 0 or not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(
            f"lines, batch_size: expected >= 1 line and batch_size >= 1, got "
            f"{len(lines)} lines and batch_size={batch_size!r}"
        )
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
        init_from: None (random layers, seeded by ``seed``) or ``n_layers`` teacher
            layer indices to copy, e.g. (0, 5) for the first and last layer
            (DistilBERT initialises from one teacher layer in two).

    Returns:
        The student, on the teacher's device, in training mode.

    Raises:
        ValueError: n_layers < 1, or init_from of another length or out of range.

    Source: Sanh et al. 2019, section 3 (initialisation from the teacher's layers).
    """
    from transformer_course import set_seed
    from transformer_course.pretrained import MiniLMEncoder

    n_teacher = len(teacher.layers)
    if not (isinstance(n_layers, int) and n_layers >= 1):
        raise ValueError(f"n_layers: expected an int >= 1, got {n_layers!r}")
    if init_from is not None and (
        len(init_from) != n_layers or not all(0 <= i < n_teacher for i in init_from)
    ):
        raise ValueError(
            f"init_from: expected {n_layers} teacher layer indices in [0, {n_teacher}), "
            f"got {tuple(init_from)}"
        )
    set_seed(seed)
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
    from transformer_course.prune import encoder_states

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
            student.eval()
            report(elapsed, steps)
            student.train()
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
    cfg = {**teacher.cfg, "n_layers": record["n_layers"]}
    if {k: v for k, v in record["cfg"].items() if k != "n_layers"} != {
        k: v for k, v in teacher.cfg.items() if k != "n_layers"
    }:
        raise ValueError(
            f"path: the student in {path} does not fit this teacher's shape"
        )
    student = make_student(teacher, n_layers=cfg["n_layers"])
    layers = {k.removeprefix("layers."): v.float() for k, v in tensors.items()}
    student.layers.load_state_dict(layers)
    return student.eval(), record
