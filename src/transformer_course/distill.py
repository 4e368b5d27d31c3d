"""Knowledge distillation and the fidelity yardstick of a smaller model.

Derived in chapter 9 ("Smaller models"). A small *student* learns to reproduce a large
*teacher*: its softened output distribution (Hinton et al. 2015), its sentence
embeddings (DistilBERT's cosine loss), and the self-attention distributions and value
relations of its last layer (MiniLM, Wang et al. 2020, the method that distilled
MiniLM-L12-H384, whose every second layer, fine-tuned contrastively on about a billion
sentence pairs, became all-MiniLM-L6-v2: its model card). Fidelity to the teacher is
measured without labels: how well the student keeps the teacher's pairwise similarities
between sentences.

Shape letters: B batch, S tokens, D d_model, H heads, d_k head size, C classes,
N sentences. Masks are bool, True = real token. Every loss computes in float32 when
given float16 or bfloat16 (as autocast does for losses): their epsilons (1e-12 here,
1e-8 in ``cosine_similarity``) round to 0 in half precision, and 0 * log 0 is NaN.

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

import math

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


def _at_least_float32(*tensors: Tensor) -> list[Tensor]:
    """float16 / bfloat16 tensors as float32 (float32 and float64 unchanged), so a
    loss's epsilon and its sums of many terms do not vanish or overflow."""
    return [x.to(torch.promote_types(x.dtype, torch.float32)) for x in tensors]


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
        Scalar (float32 for half-precision inputs): the KL summed over classes,
        averaged over all leading positions, times T^2. Zero when the logits agree
        (up to a constant per row).

    Raises:
        TypeError: non-float tensors. ValueError: different shapes, T <= 0.

    Source: Hinton et al. 2015, section 2 and 2.1.
    """
    _same_shape("student_logits", student_logits, "teacher_logits", teacher_logits)
    if not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0, got {temperature}")
    student_logits, teacher_logits = _at_least_float32(student_logits, teacher_logits)
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
    student, teacher = _at_least_float32(student, teacher)
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
    student_hidden, teacher_hidden = _at_least_float32(student_hidden, teacher_hidden)
    weights = mask[..., None].to(student_hidden.dtype)  # (B, S, 1)
    sq = (student_hidden - teacher_hidden) ** 2 * weights  # (B, S, D)
    return sq.sum() / (weights.sum() * student_hidden.shape[-1]).clamp(min=1.0)


def _row_kl(p_teacher: Tensor, p_student: Tensor, mask: Tensor) -> Tensor:
    """KL(teacher row || student row) averaged over heads and real query tokens.
    p_* (B, H, S, S), rows are distributions over keys; mask (B, S)."""
    p_teacher, p_student = _at_least_float32(p_teacher, p_student)
    eps = 1e-12  # held by float32 (smallest normal 1.2e-38), not by float16
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
    mask (B, S) bool. Returns (B, H, S, S), at least float32; padded keys get
    weight 0.
    Source: Wang et al. 2020, section 3.2, equation (7).
    """
    _validation.float_tensor("values", values, 4)
    (values,) = _at_least_float32(values)
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
    the upper triangle of the (N, N) similarity matrix, row by row (float32, or
    float64 for float64 input)."""
    _validation.float_tensor("embeddings", embeddings, 2)
    if embeddings.dim() != 2 or embeddings.shape[0] < 3:
        raise ValueError(
            f"embeddings: expected (N, D) with N >= 3, got {tuple(embeddings.shape)}"
        )
    (unit,) = _at_least_float32(F.normalize(embeddings, dim=-1))
    sims = unit @ unit.T  # (N, N)
    i, j = torch.triu_indices(len(sims), len(sims), offset=1)
    return sims[i, j]


def average_ranks(x: Tensor) -> Tensor:
    """Ranks 1..n of a 1-d tensor, tied values sharing the mean of their ranks
    (``scipy.stats.rankdata``'s "average"), so the ranks do not depend on the order
    of the entries. Shapes: (n,) -> (n,) float64."""
    sorted_x, order = x.sort()
    _, group, counts = torch.unique_consecutive(
        sorted_x, return_inverse=True, return_counts=True
    )
    ends = counts.cumsum(0).double()  # last rank of each group of equal values
    ranks = torch.empty(len(x), dtype=torch.float64, device=x.device)
    ranks[order] = (ends - (counts - 1) / 2)[group]  # mean of ranks end-c+1 .. end
    return ranks


def _cosines(embeddings: Tensor) -> Tensor:
    """``pairwise_cosine`` in float64, rounded to 12 decimals: the rounding noise of
    the matrix product (about 1e-16) must not break ties between equal pairs."""
    return pairwise_cosine(embeddings.double()).round(decimals=12)


def spearman_fidelity(embeddings: Tensor, reference: Tensor) -> float:
    """Spearman correlation between the pairwise cosine similarities of
    ``embeddings`` and those of ``reference`` (the full model's) for the same N
    sentences: 1.0 means the same ordering of all pairs, ~0 unrelated.

    Tied cosines get their average rank (as ``scipy.stats.spearmanr``), so the score
    does not depend on the order the sentences are listed in. A model whose pairs all
    tie (a collapsed student: every embedding the same) orders nothing and scores 0
    (where scipy returns NaN). Cosines are computed in float64 and equal to 12
    decimals count as tied (equal vectors give cosines 1e-16 apart).

    Shapes: embeddings (N, D), reference (N, D') with N >= 3 (D may differ).
    Returns a float in [-1, 1].
    Raises ValueError for fewer than 3 sentences or different N.
    Source: the semantic-textual-similarity yardstick of Reimers and Gurevych 2019
    (section 4.1), here against the teacher instead of human labels; Spearman 1904.
    """
    if embeddings.shape[0] != reference.shape[0]:
        raise ValueError(
            f"embeddings: expected N = {reference.shape[0]} rows as reference, "
            f"got {embeddings.shape[0]}"
        )
    a = average_ranks(_cosines(embeddings))
    b = average_ranks(_cosines(reference))
    a, b = a - a.mean(), b - b.mean()
    norms = a.norm() * b.norm()
    return float((a * b).sum() / norms) if norms > 0 else 0.0


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
