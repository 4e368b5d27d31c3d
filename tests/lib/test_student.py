"""Chapter 9: training a student (split, schedule, loss, loop, saving) and the shipped
student of tools/distill_student.py, each check with an input it must reject."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from transformer_course.data import split_works
from transformer_course.distill import neighbour_agreement, spearman_fidelity
from transformer_course.pretrained import (
    MiniLMEncoder,
    load_minilm_config,
    tokenize_batch,
)
from transformer_course.prune import layer_parameters, sentence_embeddings
from transformer_course.student import (
    STUDENT_FILE,
    load_student,
    lr_at,
    make_student,
    save_student,
    student_loss,
    teacher_targets,
    train_student,
)

LINES = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles,",
    "Now is the winter of our discontent made glorious summer",
    "A horse! a horse! my kingdom for a horse!",
    "All the world's a stage, and all the men and women merely players;",
    "If music be the food of love, play on; give me excess of it,",
]


def tiny_teacher(n_layers=3, seed=0):
    """A randomly initialised MiniLM-shaped encoder, small enough for a test."""
    torch.manual_seed(seed)
    cfg = {**load_minilm_config(), "d_model": 32, "n_heads": 4, "d_k": 8, "d_ff": 64}
    return MiniLMEncoder({**cfg, "n_layers": n_layers}).eval()


def step_clock():
    """A clock that advances by 1 each time it is read: ``seconds`` = steps."""
    counter = itertools.count()
    return lambda: float(next(counter))


def held_out_yardstick():
    """The chapter's held-out lines: whole works held out, 100 lines by Random(0)."""
    from transformer_course.data import load_shakespeare

    _, held_pool, _ = split_works(load_shakespeare())
    ids, mask, _ = tokenize_batch(random.Random(0).sample(held_pool, 100))
    return ids, mask


def test_lr_at_warms_up_then_decays_to_zero():
    peak = 2e-3
    assert lr_at(0.0, peak) == 0.0
    assert lr_at(0.05, peak) == pytest.approx(peak / 2)
    assert lr_at(0.1, peak) == pytest.approx(peak)
    assert lr_at(0.55, peak) == pytest.approx(peak / 2)
    assert lr_at(1.0, peak) == pytest.approx(0.0, abs=1e-12)
    after = [lr_at(f, peak) for f in torch.linspace(0.1, 1.0, 50).tolist()]
    assert all(a >= b for a, b in itertools.pairwise(after))  # decays monotonically
    assert lr_at(0.05, peak) != pytest.approx(peak)  # known wrong: no warmup


def test_make_student_copies_layers_and_freezes_embeddings():
    teacher = tiny_teacher(seed=1)  # make_student seeds its random layers with 0
    student = make_student(teacher, init_from=(0, 2))
    assert len(student.layers) == 2
    for mine, theirs in ((0, 0), (1, 2)):
        for a, b in zip(
            student.layers[mine].parameters(), teacher.layers[theirs].parameters()
        ):
            assert torch.equal(a, b)
    assert torch.equal(student.word_embeddings.weight, teacher.word_embeddings.weight)
    assert not student.word_embeddings.weight.requires_grad
    assert all(p.requires_grad for p in student.layers.parameters())
    random_student = make_student(teacher)  # random layers differ from the teacher's
    first = next(random_student.layers[0].parameters())
    assert first.shape == next(teacher.layers[0].parameters()).shape
    assert not torch.equal(first, next(teacher.layers[0].parameters()))
    with pytest.raises(ValueError, match="init_from"):
        make_student(teacher, init_from=(0, 3))
    with pytest.raises(ValueError, match="init_from"):
        make_student(teacher, init_from=(0,))
    with pytest.raises(ValueError, match="n_layers"):
        make_student(teacher, n_layers=0)
    with pytest.raises(TypeError, match="n_layers: expected an int, got bool"):
        make_student(teacher, n_layers=True)


def test_student_loss_is_zero_for_a_copy_of_the_teacher():
    teacher = tiny_teacher(n_layers=2)
    batches = teacher_targets(teacher, LINES, batch_size=4)
    copy = make_student(teacher, init_from=(0, 1)).eval()
    other = make_student(
        teacher, init_from=(1, 0)
    ).eval()  # known wrong: layers swapped
    with torch.no_grad():
        for batch in batches:
            assert student_loss(
                copy, batch, with_attention=True
            ).item() == pytest.approx(0, abs=1e-5)
            assert student_loss(other, batch, with_attention=True).item() > 1e-3
    no_attention = teacher_targets(teacher, LINES, batch_size=4, with_attention=False)
    with pytest.raises(ValueError, match="with_attention"):
        student_loss(copy, no_attention[0], with_attention=True)


def test_teacher_targets_sorts_by_length_and_rejects_bad_input():
    teacher = tiny_teacher()
    batches = teacher_targets(teacher, LINES, batch_size=3)
    assert [len(b.ids) for b in batches] == [3, 3, 2]
    by_length = sorted(LINES, key=len)  # characters: lines of about the same length
    for i, b in enumerate(batches):
        ids, mask, _ = tokenize_batch(by_length[3 * i : 3 * i + 3])
        assert torch.equal(b.ids, ids) and torch.equal(b.mask, mask)
    b = batches[0]
    assert b.attn.shape == (3, 4, b.ids.shape[1], b.ids.shape[1])
    assert torch.allclose(
        b.pooled, (b.hidden * b.mask[..., None]).sum(1) / b.mask.sum(1, keepdim=True)
    )
    with pytest.raises(ValueError, match="batch_size"):
        teacher_targets(teacher, LINES, batch_size=0)
    with pytest.raises(TypeError, match="batch_size: expected an int, got float"):
        teacher_targets(teacher, LINES, batch_size=8.0)
    with pytest.raises(ValueError, match="lines"):
        teacher_targets(teacher, [])


@pytest.mark.parametrize("with_attention", [False, True])
def test_train_student_lowers_the_loss_and_keeps_embeddings_frozen(with_attention):
    teacher = tiny_teacher()
    batches = teacher_targets(teacher, LINES, batch_size=4)
    student = make_student(teacher)
    frozen = student.word_embeddings.weight.clone()

    def total():
        with torch.no_grad():
            return sum(
                student_loss(student.eval(), b, with_attention=with_attention).item()
                for b in batches
            )

    before = total()
    steps = train_student(
        student, batches, 60, lr=3e-3, with_attention=with_attention, clock=step_clock()
    )
    assert steps == 59 and not student.training  # one read at the start, one per step
    assert total() < 0.5 * before
    assert torch.equal(student.word_embeddings.weight, frozen)
    for bad in ({"seconds": 0}, {"seconds": 1, "lr": 0}, {"seconds": 1, "warmup": 1.0}):
        kwargs = {"seconds": 1, **bad}
        with pytest.raises(ValueError, match="seconds, lr, warmup"):
            train_student(
                student, batches, kwargs.pop("seconds"), clock=step_clock(), **kwargs
            )


def test_train_student_reports_on_its_schedule():
    teacher = tiny_teacher()
    batches = teacher_targets(teacher, LINES, batch_size=4)
    student = make_student(teacher)
    calls, modes = [], []

    def report(elapsed, steps):
        calls.append((elapsed, steps))
        modes.append((student.training, torch.is_grad_enabled()))

    seen = []
    student.layers[0].register_forward_pre_hook(lambda m, a: seen.append(m.training))
    train_student(
        student, batches, 10, clock=step_clock(), report_every=3, report=report
    )
    assert [e for e, _ in calls] == [3.0, 6.0, 9.0]
    assert modes == [(False, False)] * 3  # a report evaluates: eval mode, no graph
    assert seen and all(seen), "training resumes in train mode after each report"


def test_save_and_load_student_round_trip(tmp_path):
    teacher = tiny_teacher()
    student = make_student(teacher, init_from=(0, 2)).eval()
    path = tmp_path / "student.safetensors"
    save_student(student, path, {"spearman": 0.5, "curve": [[1.0, 2, 0.5]]})
    loaded, record = load_student(teacher, path)
    assert record["spearman"] == 0.5 and record["n_layers"] == 2
    ids, mask, _ = tokenize_batch(LINES[:3])
    with torch.no_grad():
        a = sentence_embeddings(student, ids, mask)
        b = sentence_embeddings(loaded, ids, mask)
    assert torch.allclose(a, b, atol=1e-2)  # float16 storage
    assert not torch.allclose(
        a, sentence_embeddings(teacher, ids, mask).detach(), atol=1e-2
    )
    with pytest.raises(FileNotFoundError, match="path"):
        load_student(teacher, tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="training record"):
        load_student(teacher, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="shape"):
        load_student(MiniLMEncoder({**teacher.cfg, "d_ff": 128}), path)


def test_shipped_student_meets_the_chapter_target():
    """The student shipped in the library keeps Spearman >= 0.9 with the teacher on the
    chapter's held-out lines, with at most 40% of the layer parameters; the same
    student before training (a known-wrong input) does not pass the check."""
    from transformer_course.pretrained import load_minilm_encoder

    teacher = load_minilm_encoder()
    ids, mask = held_out_yardstick()
    with torch.no_grad():
        ref = sentence_embeddings(teacher, ids, mask)
        shipped, record = load_student(teacher, STUDENT_FILE)
        emb = sentence_embeddings(shipped, ids, mask)
        untrained = sentence_embeddings(
            make_student(teacher, init_from=(0, 5)), ids, mask
        )
    rho = spearman_fidelity(emb, ref)
    assert rho >= 0.9
    assert rho == pytest.approx(record["spearman"], abs=0.01)
    assert neighbour_agreement(emb, ref) > neighbour_agreement(untrained, ref)
    assert layer_parameters(shipped) <= 0.4 * layer_parameters(teacher)
    assert spearman_fidelity(untrained, ref) < 0.9
