"""Chapter 9, smaller models: mean pooling, nearest-neighbour agreement and the
soft-target loss of distillation.

The references are written out here (loops over rows and tokens; the loss with explicit
sums), so a check does not trust the library code (``distill.py``) it is testing a
learner against.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_course.distill import (
    mean_pool,
    nearest_neighbours,
    neighbour_agreement,
    soft_target_loss,
)
from transformer_course.exercises._common import (
    ShapeError,
    Tensor,
    exercise_check,
    fail,
    passed,
)
from transformer_course.exercises._language import N_, gettext
from transformer_course.exercises._method import forbids


def _loop_mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    rows = []
    for b in range(hidden.shape[0]):
        real = [hidden[b, s] for s in range(hidden.shape[1]) if mask[b, s]]
        rows.append(torch.stack(real).mean(0))
    return torch.stack(rows)  # (B, D)


@exercise_check
@forbids(mean_pool)
def check_mean_pool(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """Chapter 9, exercise "mean pooling": ``fn(hidden, mask)`` with hidden (B, S, D)
    and mask (B, S) bool must return the mean of the real tokens' vectors (B, D)
    (Reimers and Gurevych 2019).

    Raises:
        CheckError: for a wrong shape (``ShapeError``), padding counted in the mean, a
            call to the library's ``mean_pool``, or any other difference.
    """
    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(4, 6, 5, generator=gen)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 0, 0, 0],
            [1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0],
        ],
        dtype=torch.bool,
    )
    want = _loop_mean_pool(hidden, mask)
    got = fn(hidden, mask)
    if not isinstance(got, Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        fail(
            "expected a tensor of shape {want_shape} (B, D), got {shape}",
            "one vector per sentence: the token axis (dim 1) is the one that goes.",
            kind=ShapeError,
            want_shape=tuple(want.shape),
            shape=shape,
        )
    if torch.allclose(got, want, atol=1e-5):
        return passed("mean pooling averages the real tokens only")
    if torch.allclose(got, hidden.mean(1), atol=1e-5):
        fail(
            "the padded tokens are averaged in too",
            "row 2 of the test batch has one real token: its mean is that token.",
        )
    summed = (hidden * mask[..., None]).sum(1)  # (B, D)
    for count, message in (
        (mask.shape[1], N_("divided by S, the padded length, not by the real tokens")),
        (
            mask.sum(),
            N_("divided by the real tokens of the whole batch, not of the row"),
        ),
    ):
        if torch.allclose(got, summed / count, atol=1e-5):
            fail(
                "the sum of the real tokens is {message}",
                "each sentence is averaged over its own real tokens.",
                message=gettext(message),
            )
    inverted = _loop_mean_pool(hidden[1:], ~mask[1:])
    if torch.allclose(got[1:], inverted, atol=1e-5):
        fail(
            "the mask is inverted: your mean is over the padding, not the real tokens",
            "True in the mask marks a real token.",
        )
    fail(
        "the pooled vectors differ from the mean of the real tokens",
        "compare fn(hidden, mask)[1] with hidden[1, :3].mean(0) (three real tokens).",
    )


def _loop_agreement(emb: Tensor, ref: Tensor) -> float:
    def neighbours(x: Tensor) -> list[int]:
        x = x.double()
        out = []
        for i in range(len(x)):
            cos = [
                float(x[i] @ x[j] / (x[i].norm() * x[j].norm()))
                if j != i
                else -math.inf
                for j in range(len(x))
            ]
            out.append(max(range(len(x)), key=cos.__getitem__))
        return out

    same = [a == b for a, b in zip(neighbours(emb), neighbours(ref))]
    return sum(same) / len(same)


def _farthest_agreement(emb: Tensor, ref: Tensor) -> float:
    def farthest(x: Tensor) -> Tensor:
        x = torch.nn.functional.normalize(x.double(), dim=-1)
        return (x @ x.T).fill_diagonal_(math.inf).argmin(-1)

    return (farthest(emb) == farthest(ref)).double().mean().item()


@exercise_check
@forbids(neighbour_agreement, nearest_neighbours)
def check_neighbour_agreement(fn: Callable[[Tensor, Tensor], float]) -> bool:
    """Chapter 9, exercise "nearest-neighbour agreement": ``fn(emb, ref)`` with (N, D)
    and (N, D') must return the share of rows whose most cosine-similar *other* row
    is the same under both.

    Raises:
        CheckError: for a result that is not a number (``ShapeError``), a row counted
            as its own neighbour (also by a diagonal filled with 0 rather than -inf),
            dot products used instead of cosines, a count or a percentage instead of
            a share, a call to the library's ``neighbour_agreement``, or any other
            difference.
    """
    gen = torch.Generator().manual_seed(9)
    ref = torch.randn(30, 8, generator=gen)
    scaled = ref * torch.linspace(0.2, 5.0, 30)[:, None]  # same cosines, other norms
    noisy = ref + 0.8 * torch.randn(30, 8, generator=gen)
    gen = torch.Generator().manual_seed(1)
    apart = torch.randn(10, 8, generator=gen)
    apart[:, 0] += 4  # every row points along +e_0 ...
    apart[0] = -apart[0]  # ... but row 0: its cosines with all the others are < 0
    apart_noisy = apart + 0.5 * torch.randn(10, 8, generator=gen)
    for emb, ref_, name in (
        (ref, ref, N_("the same embeddings")),
        (scaled, ref, N_("rescaled rows")),
        (noisy, ref, N_("noisy embeddings")),
        (apart_noisy, apart, N_("a row opposite all the others")),
    ):
        got = fn(emb, ref_)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)):
            fail(
                "expected one number (a share between 0 and 1), got {type}",
                "average the matches over the rows.",
                kind=ShapeError,
                type=type(got).__name__,
            )
        want = _loop_agreement(emb, ref_)
        if math.isclose(got, want, abs_tol=1e-6):
            continue
        fields = {"name": gettext(name), "got": got, "want": want}
        for factor, what in (
            (len(emb), N_("a count of rows")),
            (100, N_("a percentage")),
        ):
            if math.isclose(got, want * factor, abs_tol=1e-4):
                fail(
                    "{name}: got {got:.3f}, expected {want:.3f}: that is {what}, not a "
                    "share",
                    "return the fraction of rows that agree, a number between 0 and 1.",
                    what=gettext(what),
                    **fields,
                )
        if emb is apart_noisy:
            fail(
                "{name}: got {got:.3f}, expected {want:.3f}: row 0, whose cosines "
                "with every other row are negative, was matched to itself",
                "a row's similarity with itself must lose against every other row: "
                "what value does the diagonal need for that, whatever the cosines?",
                **fields,
            )
        if math.isclose(got, 1.0) and emb is not ref:
            fail(
                "{name}: got 1.0, expected {want:.3f}",
                "what is the cosine similarity of a row with itself, and should a "
                "row be its own neighbour?",
                **fields,
            )
        if emb is scaled:
            fail(
                "{name}: got {got:.3f}, expected {want:.3f}",
                "rescaling a row does not change its direction: which similarity "
                "ignores the length of the vectors?",
                **fields,
            )
        if math.isclose(got, _farthest_agreement(emb, ref_), abs_tol=1e-6):
            fail(
                "{name}: got {got:.3f}, expected {want:.3f}: that is the agreement "
                "of the least similar rows",
                "a neighbour is the row with the largest cosine similarity.",
                **fields,
            )
        fail(
            "{name}: got {got:.3f}, expected {want:.3f}",
            "find each row's most similar other row under emb and under ref, then "
            "count the rows where the two agree.",
            **fields,
        )
    return passed("nearest-neighbour agreement matches on three cases")


def _hand_soft_loss(
    s: Tensor, t: Tensor, T: float, soften_teacher: bool = True
) -> float:
    total = 0.0
    for s_row, t_row in zip(s.double().tolist(), t.double().tolist()):
        zt = [v / T if soften_teacher else v for v in t_row]
        zs = [v / T for v in s_row]
        log_zt = math.log(sum(math.exp(v) for v in zt))
        log_zs = math.log(sum(math.exp(v) for v in zs))
        for a, b in zip(zt, zs):
            log_p, log_q = a - log_zt, b - log_zs
            total += math.exp(log_p) * (log_p - log_q)
    return T * T * total / len(s)


@exercise_check
@forbids(soft_target_loss)
def check_soft_target_loss(fn: Callable[[Tensor, Tensor, float], Tensor]) -> bool:
    """Chapter 9, exercise "find the bug: a confident teacher": ``fn(student_logits,
    teacher_logits, T)`` must return T^2 KL(softmax(t / T) || softmax(s / T)),
    averaged over rows (Hinton et al. 2015, section 2), finite also when a teacher
    probability underflows in float32 (teacher logits [0, 60, 120] at T = 1).

    Raises:
        CheckError: for a non-scalar result (``ShapeError``), the temperature on one
            side only, swapped KL arguments, a missing T^2, NaN from log 0 for a
            confident teacher, a call to the library's ``soft_target_loss``, or any
            other difference.
    """
    gen = torch.Generator().manual_seed(9)
    s, t = torch.randn(6, 10, generator=gen), 2 * torch.randn(6, 10, generator=gen)
    for T in (1.0, 2.0, 5.0):
        got = fn(s, t, T)
        if not isinstance(got, Tensor) or got.numel() != 1:
            fail(
                "expected a scalar loss tensor",
                "the loss is averaged over the rows of the batch.",
                kind=ShapeError,
            )
        got, want = float(got), _hand_soft_loss(s, t, T)
        if math.isclose(got, want, rel_tol=1e-4):
            continue
        fields = {"T": T, "got": got, "want": want}
        value = gettext("T = {T}: got {got:.4f}, expected {want:.4f}").format(**fields)
        p_t = torch.softmax(t.double() / T, -1)
        log_q = torch.log_softmax(s.double() / T, -1)
        entropy = -(p_t * p_t.log()).sum(-1).mean().item()
        per_entry = (p_t * (p_t.log() - log_q)).mean().item()
        for wrong, message, hint in (
            (
                _hand_soft_loss(s, t, T, soften_teacher=False),
                N_("the teacher is not softened"),
                N_("which of the two distributions does T act on here?"),
            ),
            (
                _hand_soft_loss(t, s, T),
                N_("KL arguments swapped"),
                N_("KL is not symmetric: whose distribution is the expectation over?"),
            ),
            (
                want / (T * T),
                N_("T^2 is missing"),
                N_("the gradient shrinks like 1 / T^2; what undoes that in the loss?"),
            ),
            (
                want / T,
                N_("the loss is multiplied by T, not T^2"),
                N_("the gradient of the softened loss shrinks like 1 / T^2."),
            ),
            (
                T * T * -(p_t * torch.log_softmax(s.double(), -1)).sum(-1).mean().item()
                - T * T * entropy,
                N_("the student is not softened"),
                N_("both distributions are taken at the same temperature."),
            ),
            (
                T
                * T
                * (p_t * (torch.log_softmax(t.double(), -1) - log_q))
                .sum(-1)
                .mean()
                .item(),
                N_(
                    "the teacher's p is softened but its log p is not: "
                    "log_softmax(t) without / T"
                ),
                N_("both p and log p of the teacher are taken at temperature T."),
            ),
            (
                want + T * T * entropy,
                N_(
                    "that is the cross-entropy: it includes the teacher's entropy, which "
                    "KL subtracts"
                ),
                N_("KL(p || q) = sum p (log p - log q)."),
            ),
            (
                T * T * per_entry,
                N_(
                    "the KL was averaged over every entry (reduction='mean'), not summed "
                    "over the classes"
                ),
                N_(
                    "average over rows only: sum over the classes first (PyTorch's "
                    "'batchmean')."
                ),
            ),
        ):
            if math.isclose(got, wrong, rel_tol=1e-4):
                fail("{value}: {message}", hint, value=value, message=gettext(message))
        p0 = torch.softmax(t.double() / T, 0)
        kl0 = (p0 * (p0.log() - torch.log_softmax(s.double() / T, 0))).sum(0)
        if math.isclose(got, T * T * kl0.mean().item(), rel_tol=1e-4) or math.isclose(
            got, T * T * kl0.sum().item() / len(s), rel_tol=1e-4
        ):
            fail(
                "{value}: the softmax ran over the batch (dim=0), not the classes",
                "each row's distribution sums to 1 over its classes.",
                value=value,
            )
        fail(
            "T = {T}: got {got:.4f}, expected {want:.4f}",
            "at T = 1 compare with the KL divergence of the two plain softmaxes.",
            **fields,
        )
    s, t = torch.randn(2, 3, generator=gen), torch.tensor([[0.0, 60.0, 120.0]] * 2)
    got, want = fn(s, t, 1.0), _hand_soft_loss(s, t, 1.0)
    if not math.isfinite(float(got)):
        fail(
            "teacher logits [0, 60, 120] at T = 1: got {got}, expected "
            "{want:.4f}: a teacher probability underflows to 0 in float32, and "
            "0 * log 0 is NaN",
            "the term of a class with p = 0 is 0; which function gives log p without "
            "ever forming p?",
            got=float(got),
            want=want,
        )
    if not math.isclose(float(got), want, rel_tol=1e-4):
        for cap in (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0, 88.0, 100.0):
            if math.isclose(
                float(got), _hand_soft_loss(s, t.clamp(max=cap), 1.0), rel_tol=1e-4
            ):
                fail(
                    "teacher logits [0, 60, 120] at T = 1: got {got:.4f}, expected "
                    "{want:.4f}: that is the loss of a teacher whose large logits "
                    "were clamped (60 and 120 made equal): another teacher, with "
                    "other probabilities",
                    "keep the teacher's logits as they are: log_softmax(t / T) "
                    "gives log p without forming p, and p = exp(log p).",
                    got=float(got),
                    want=want,
                )
        fail(
            "teacher logits [0, 60, 120] at T = 1: got {got:.4f}, expected {want:.4f}",
            "a class whose teacher probability is 0 must add nothing to the loss.",
            got=float(got),
            want=want,
        )
    return passed(
        "the soft-target loss matches Hinton et al. at T = 1, 2, 5, and stays finite "
        "for a confident teacher"
    )
