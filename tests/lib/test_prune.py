"""Chapter 9: head gates, physical head and neuron removal, magnitude pruning, on a
tiny randomly initialised MiniLM-shaped encoder (fast) and, once, the real one."""

from __future__ import annotations

import pytest
import torch

from transformer_course.distill import spearman_fidelity
from transformer_course.pretrained import MiniLMEncoder
from transformer_course.prune import (
    OutputBias,
    clone_encoder,
    encoder_states,
    ffn_neuron_scores,
    gates_without,
    global_magnitude_prune,
    head_importance,
    head_importance_loo,
    iterative_head_order,
    layer_parameters,
    make_permanent,
    remove_ffn_neurons,
    remove_heads,
    sentence_embeddings,
    sparsity,
)

CFG = {
    "d_model": 32,
    "n_heads": 4,
    "d_k": 8,
    "d_ff": 64,
    "n_layers": 3,
    "vocab_size": 50,
    "max_len": 32,
    "layer_norm_eps": 1e-12,
    "pad_id": 0,
}


@pytest.fixture
def model():
    return MiniLMEncoder(CFG).eval()


@pytest.fixture
def batch():
    ids = torch.randint(1, 50, (5, 9))
    mask = torch.ones(5, 9, dtype=torch.bool)
    mask[0, 6:] = False
    mask[3, 4:] = False
    return ids.masked_fill(~mask, 0), mask


def test_encoder_states_equal_the_model_forward(model, batch):
    ids, mask = batch
    hidden, last_input = encoder_states(model, ids, mask)
    out = model(ids, mask)
    torch.testing.assert_close(hidden, out.hidden_states)
    torch.testing.assert_close(last_input, out.all_hidden_states[-2])


@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 8])
def test_length_sorted_batches_give_the_one_batch_embeddings(model, batch_size):
    lengths = torch.tensor([9, 2, 6, 1, 9, 4, 0])  # a row with no real token too
    mask = torch.arange(9) < lengths[:, None]  # (7, 9), right padding
    ids = torch.randint(1, 50, (7, 9)).masked_fill(~mask, 0)
    gates = gates_without([(0, 1), (2, 3)], 3, 4)
    per_row = torch.rand(3, 7, 4)  # (L, B, H): each row its own gates
    with torch.no_grad():
        for head_mask in (None, gates, per_row):
            whole = sentence_embeddings(model, ids, mask, head_mask=head_mask)
            batched = sentence_embeddings(
                model, ids, mask, head_mask=head_mask, batch_size=batch_size
            )
            torch.testing.assert_close(batched, whole)
        # known wrong: per-row gates that did not follow their rows
        shuffled = per_row[:, torch.arange(6, -1, -1)]
        assert not torch.allclose(
            sentence_embeddings(model, ids, mask, head_mask=shuffled),
            sentence_embeddings(model, ids, mask, head_mask=per_row),
        )


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_batch_size_must_be_a_positive_int(model, batch, bad):
    ids, mask = batch
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        sentence_embeddings(model, ids, mask, batch_size=bad)


def test_all_ones_gates_change_nothing(model, batch):
    ids, mask = batch
    plain = sentence_embeddings(model, ids, mask)
    gated = sentence_embeddings(model, ids, mask, head_mask=torch.ones(3, 4))
    assert torch.equal(plain, gated)
    # and a gate below one does change something (the check can fail)
    half = sentence_embeddings(model, ids, mask, head_mask=torch.full((3, 4), 0.5))
    assert not torch.allclose(plain, half)


def test_zero_gate_equals_physical_removal(model, batch):
    ids, mask = batch
    heads = [(0, 1), (2, 0), (2, 3)]
    gated = sentence_embeddings(model, ids, mask, head_mask=gates_without(heads, 3, 4))
    pruned = remove_heads(clone_encoder(model), heads)
    assert [layer.self_attn.n_heads for layer in pruned.layers] == [3, 4, 2]
    assert layer_parameters(pruned) < layer_parameters(model)
    torch.testing.assert_close(sentence_embeddings(pruned, ids, mask), gated)
    # removing a different head gives a different model
    other = remove_heads(clone_encoder(model), [(0, 2), (2, 0), (2, 3)])
    assert not torch.allclose(sentence_embeddings(other, ids, mask), gated)


@pytest.mark.parametrize(
    "calls",
    [
        [[(0, 1), (2, 0)], [(0, 2), (2, 3)]],  # original indices across two calls
        [[(0, 1), (0, 1)], [(0, 2), (2, 0), (2, 3)]],  # a head named twice
        [[(0, 1), (2, 0), (2, 3)], [(2, 0), (0, 2)]],  # a head removed again
        [[(1, 0), (1, 1)], [(1, 2), (1, 3), (1, 0)]],  # a layer emptied in two calls
    ],
)
def test_removing_heads_in_two_calls_equals_one_call(model, batch, calls):
    """Head indices are the unpruned model's in every call (Hugging Face's
    ``pruned_heads``, transformers PRs #1077 and #4799); a head already removed, or
    named twice, is ignored."""
    ids, mask = batch
    heads = sorted({h for call in calls for h in call})
    gated = sentence_embeddings(model, ids, mask, head_mask=gates_without(heads, 3, 4))
    twice = clone_encoder(model)
    for call in calls:
        remove_heads(twice, call)
    once = remove_heads(clone_encoder(model), heads)
    assert [len(layer.self_attn.pruned_heads) for layer in twice.layers] == [
        sum(h[0] == i for h in heads) for i in range(3)
    ]
    torch.testing.assert_close(sentence_embeddings(twice, ids, mask), gated)
    torch.testing.assert_close(
        sentence_embeddings(twice, ids, mask), sentence_embeddings(once, ids, mask)
    )
    # known wrong: the second call's heads read as indices of the pruned model
    other = gates_without(sorted(set(calls[0]) | {(0, 3), (2, 1)}), 3, 4)
    assert not torch.allclose(
        sentence_embeddings(model, ids, mask, head_mask=other), gated
    )


def test_remove_heads_rejects_indices_outside_the_unpruned_model(model):
    pruned = remove_heads(clone_encoder(model), [(0, 1)])
    for bad in ([(0, 4)], [(3, 0)], [(-1, 0)]):
        with pytest.raises(ValueError, match="heads: expected"):
            remove_heads(pruned, bad)
    remove_heads(pruned, [(0, 3)])  # known right: the last original index is valid
    assert pruned.layers[0].self_attn.pruned_heads == {1, 3}


def test_removing_every_head_of_a_layer_leaves_the_output_bias(model, batch):
    ids, mask = batch
    heads = [(1, h) for h in range(4)]
    gated = sentence_embeddings(model, ids, mask, head_mask=gates_without(heads, 3, 4))
    pruned = remove_heads(clone_encoder(model), heads)
    assert isinstance(pruned.layers[1].self_attn, OutputBias)
    torch.testing.assert_close(sentence_embeddings(pruned, ids, mask), gated)


def test_head_importance_ranks_a_dead_head_last(model, batch):
    with torch.no_grad():  # head 2 of layer 1 writes nothing: W^O columns zero
        model.layers[1].self_attn.out_proj.weight[:, 16:24] = 0
    scores = head_importance(model, [batch], n_probes=8, normalize=False)
    assert scores.shape == (3, 4) and torch.all(scores >= 0)
    assert scores[1, 2] == 0 and scores[1].min() == scores[1, 2]
    assert torch.all(scores[0] > 0)
    normed = head_importance(model, [batch], n_probes=8)
    torch.testing.assert_close(normed.norm(dim=1), torch.ones(3))


def test_head_importance_predicts_the_damage(model, batch):
    ids, mask = batch
    scores = head_importance(model, [batch], n_probes=16, normalize=False)
    ref = sentence_embeddings(model, ids, mask).detach()
    damage = torch.zeros(3, 4)
    for layer in range(3):
        for head in range(4):
            gates = gates_without([(layer, head)], 3, 4)
            e = sentence_embeddings(model, ids, mask, head_mask=gates).detach()
            damage[layer, head] = ((e - ref) ** 2).sum()
    # the score is the second-order term of this damage: strongly rank-correlated
    ranks = lambda x: x.flatten().argsort().argsort().double()
    a, b = ranks(scores), ranks(damage)
    a, b = a - a.mean(), b - b.mean()
    assert float((a * b).sum() / (a.norm() * b.norm())) > 0.6


def test_ffn_neuron_removal(model, batch):
    ids, mask = batch
    ff = model.layers[0].ff
    scores = ffn_neuron_scores(ff)
    assert scores.shape == (64,)
    ref = sentence_embeddings(model, ids, mask)
    same = remove_ffn_neurons(clone_encoder(model), 0.0)
    torch.testing.assert_close(sentence_embeddings(same, ids, mask), ref)
    with torch.no_grad():  # neurons with no outgoing weights can go for free
        for layer in model.layers:
            layer.ff.linear2.weight[:, :16] = 0
    ref = sentence_embeddings(model, ids, mask)
    pruned = remove_ffn_neurons(clone_encoder(model), 0.25)
    assert pruned.layers[0].ff.linear1.out_features == 48
    torch.testing.assert_close(sentence_embeddings(pruned, ids, mask), ref)
    too_many = remove_ffn_neurons(clone_encoder(model), 0.5)
    assert not torch.allclose(sentence_embeddings(too_many, ids, mask), ref)
    with pytest.raises(ValueError, match="amount"):
        remove_ffn_neurons(model, 1.0)


def test_global_magnitude_prune_and_remove(model):
    params = global_magnitude_prune(model, 0.5)
    assert sparsity(model) == pytest.approx(0.5, abs=1e-3)
    attn = model.layers[0].self_attn.q_proj
    assert hasattr(attn, "weight_orig") and hasattr(attn, "weight_mask")
    # global: the threshold is shared, so layers end up with different sparsities
    per_layer = [float((m.weight == 0).float().mean()) for m, _ in params]
    assert max(per_layer) - min(per_layer) > 0.01
    make_permanent(params)
    assert not hasattr(attn, "weight_orig") and not hasattr(attn, "weight_mask")
    assert sparsity(model) == pytest.approx(0.5, abs=1e-3)


def test_real_model_gates_and_removal():
    from transformer_course.pretrained import load_minilm_encoder, tokenize_batch

    teacher = load_minilm_encoder()
    ids, mask, _ = tokenize_batch(
        [
            "To be, or not to be.",
            "A horse! a horse!",
            "Now is the winter of our discontent.",
        ]
    )
    with torch.no_grad():
        ref = sentence_embeddings(teacher, ids, mask)
        heads = [(0, 3), (5, 11)]
        gated = sentence_embeddings(
            teacher, ids, mask, head_mask=gates_without(heads, 6, 12)
        )
        pruned = remove_heads(clone_encoder(teacher), heads)
        torch.testing.assert_close(sentence_embeddings(pruned, ids, mask), gated)
    assert spearman_fidelity(ref, ref) == pytest.approx(1.0)


def test_encoder_states_take_per_layer_gates_of_a_pruned_model(model, batch):
    ids, mask = batch
    pruned = remove_heads(clone_encoder(model), [(0, 1), (2, 0), (2, 3)])
    plain = sentence_embeddings(pruned, ids, mask)
    ones = [torch.ones(layer.self_attn.n_heads) for layer in pruned.layers]
    torch.testing.assert_close(
        sentence_embeddings(pruned, ids, mask, head_mask=ones), plain
    )
    ones[2] = torch.tensor([1.0, 0.0])  # gate off one more head of layer 3
    assert not torch.allclose(
        sentence_embeddings(pruned, ids, mask, head_mask=ones), plain
    )
    with pytest.raises(ValueError, match="head_mask"):
        sentence_embeddings(pruned, ids, mask, head_mask=ones[:2])


def _brute_force_loo(model, ids, mask, removed=()):
    full = sentence_embeddings(model, ids, mask)
    damage = torch.full((3, 4), float("inf"))
    for layer in range(3):
        for head in range(4):
            if (layer, head) in removed:
                continue
            gates = gates_without([*removed, (layer, head)], 3, 4)
            e = sentence_embeddings(model, ids, mask, head_mask=gates)
            cos = torch.nn.functional.cosine_similarity(e, full, dim=-1)
            damage[layer, head] = (1 - cos).mean()
    return damage


@torch.no_grad()
def test_leave_one_out_importance_equals_masking_each_head(model, batch):
    ids, mask = batch
    model.layers[1].self_attn.out_proj.weight[:, 16:24] = 0  # head 2 of layer 1: dead
    scores = head_importance_loo(model, ids, mask)
    assert scores.shape == (3, 4)
    torch.testing.assert_close(scores, _brute_force_loo(model, ids, mask))
    others = torch.cat([scores.flatten()[:6], scores.flatten()[7:]])
    assert scores[1, 2] < 1e-6 and torch.all(others > 1e-4)  # only the dead head
    # with heads already removed: they score inf, the others see the pruned model
    removed = [(0, 1), (2, 3)]
    again = head_importance_loo(model, ids, mask, removed=removed)
    assert again[0, 1] == again[2, 3] == float("inf")
    torch.testing.assert_close(again, _brute_force_loo(model, ids, mask, removed))
    assert not torch.allclose(again[0, 0], scores[0, 0])  # the context counts


@torch.no_grad()
def test_iterative_head_order(model, batch):
    ids, mask = batch
    model.layers[1].self_attn.out_proj.weight[:, 16:24] = 0
    order = iterative_head_order(model, ids, mask, step=4, n_steps=2)
    assert sorted(order) == [(i, h) for i in range(3) for h in range(4)]
    assert order[0] == (1, 2)  # the dead head goes first
    one_shot = head_importance_loo(model, ids, mask).flatten().argsort().tolist()
    assert iterative_head_order(model, ids, mask, step=4, n_steps=1) == [
        divmod(i, 4) for i in one_shot
    ]
    # the second round re-estimates: heads 5-12 follow the scores given the first 4
    second = head_importance_loo(model, ids, mask, removed=order[:4])
    rest = [divmod(i, 4) for i in second.flatten().argsort().tolist()]
    assert order[4:8] == [h for h in rest if h not in order[:4]][:4]


@pytest.mark.parametrize(
    "run",
    [
        lambda m, ids, mask: m(ids, mask),
        lambda m, ids, mask: encoder_states(m, ids, mask),
        lambda m, ids, mask: sentence_embeddings(m, ids, mask),
        lambda m, ids, mask: head_importance_loo(m, ids, mask),
        lambda m, ids, mask: head_importance(m, [(ids, mask)], n_probes=1),
    ],
    ids=[
        "forward",
        "encoder_states",
        "sentence_embeddings",
        "head_importance_loo",
        "head_importance",
    ],
)
def test_inputs_longer_than_the_position_table_raise_a_clear_error(model, run):
    """sentence-transformers #1600: every way into the encoder names ``ids`` and
    ``max_len`` instead of failing deep in ``nn.Embedding`` with an IndexError."""
    too_long = torch.ones(2, CFG["max_len"] + 1, dtype=torch.long)
    mask = torch.ones_like(too_long, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"ids: expected at most max_len = 32"):
        run(model, too_long, mask)
    with pytest.raises(ValueError, match="ids: token id 50 is outside the vocab"):
        run(model, torch.full((2, 4), 50), mask[:, :4])
    with pytest.raises(ValueError, match="mask: expected shape"):
        run(model, too_long[:, :4], mask[:, :5])
    run(model, too_long[:, :-1], mask[:, :-1])  # known right: max_len tokens run


def test_head_importance_raises_on_empty_batches(model, batch):
    """The kind of training.fit's empty-data fault: no batch (an exhausted generator)
    gave all-zero scores, ranking every head as unimportant, without a word."""
    used = iter([batch])
    assert head_importance(model, used, n_probes=1).sum() > 0  # known right
    with pytest.raises(ValueError, match="batches: expected at least one"):
        head_importance(model, used, n_probes=1)  # the same iterator, now used up
