"""Pruning a pretrained encoder: heads, feed-forward neurons and single weights.

Derived in chapter 9 ("Smaller models"), on the real all-MiniLM-L6-v2
(``pretrained.MiniLMEncoder``, 6 layers of 12 heads). Heads are ranked by importance
(Michel et al. 2019) and removed physically with ``MultiHeadAttention.prune_heads``;
feed-forward neurons are ranked by weight norm and removed physically; single weights
are zeroed with PyTorch's ``torch.nn.utils.prune`` (L1 magnitude, global), which keeps
the dense shapes.

Shape letters: B batch, S tokens, D d_model, L layers, H heads. Masks are bool,
True = real token.

Sources:
    Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than One?",
    sections 2.2 (head gates) and 4.1 (importance from gradients w.r.t. the gates,
    normalised per layer).
    Han et al. 2015, "Learning both Weights and Connections for Efficient Neural
    Networks" (magnitude pruning).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune as torch_prune

from transformer_course import _validation
from transformer_course.attention import keep_features
from transformer_course.distill import mean_pool
from transformer_course.layers import FeedForward

Tensor = torch.Tensor


def _layer_gates(model, head_mask) -> list:
    """One gate tensor (or None) per layer from (L, H), (L, B, H) or a sequence."""
    n_layers = len(model.layers)
    if head_mask is None:
        return [None] * n_layers
    if len(head_mask) != n_layers:
        shape = tuple(head_mask.shape) if isinstance(head_mask, Tensor) else None
        raise ValueError(
            f"head_mask: expected (L, H), (L, B, H) or L per-layer gates with "
            f"L = {n_layers}, got {shape or f'{len(head_mask)} entries'}"
        )
    return list(head_mask)


def _embed(model, ids: Tensor, mask: Tensor) -> Tensor:
    """``model.embed(ids)`` (which checks the ids: shape, ``max_len``, vocabulary)
    after the same check of ``mask`` as ``MiniLMEncoder.forward``."""
    x = model.embed(ids)  # (B, S, D)
    _validation.keep_mask("mask", mask, tuple(ids.shape))
    return x


def encoder_states(
    model, ids: Tensor, mask: Tensor, *, head_mask=None
) -> tuple[Tensor, Tensor]:
    """Run a ``MiniLMEncoder`` (possibly pruned: layers may have different numbers of
    heads) with optional gates on every head.

    Args:
        model: a ``pretrained.MiniLMEncoder``.
        ids: (B, S) int64 token ids. mask: (B, S) bool, True = real token.
        head_mask: optional float gates multiplying each head's output (1 keeps,
            0 removes): (L, H) or (L, B, H), or a sequence of L per-layer gates
            (H_l,) or (B, H_l) (or None) for layers with different head counts.

    Returns:
        ``(hidden, last_input)``: the last layer's output (B, S, D) and its input
        (B, S, D) (the last layer's values and attention can be recomputed from it).
        The last layer's weights are in ``model.layers[-1].self_attn_weights``.

    Raises:
        TypeError / ValueError: as ``MiniLMEncoder.forward`` (ids not (B, S) integer
            ids, longer than the model's ``max_len`` positions or outside its
            vocabulary; a mask that is not bool (B, S)), or a head_mask without one
            entry per layer.
    """
    gates = _layer_gates(model, head_mask)
    x = _embed(model, ids, mask)  # (B, S, D), as MiniLMEncoder.forward
    key_mask = mask[:, None, None, :]  # (B, 1, 1, S)
    last_input = x
    for layer, gate in zip(model.layers, gates):
        last_input = x
        x = layer(x, key_mask, head_mask=gate)  # (B, S, D)
    return x, last_input


def sentence_embeddings(
    model, ids: Tensor, mask: Tensor, *, head_mask=None, batch_size: int | None = None
) -> Tensor:
    """Mean-pooled sentence embeddings (B, D) of ``encoder_states``.

    With ``batch_size``, the rows go through the model in batches of that many rows
    sorted by length, each batch cut to its longest row, and come back in their own
    order: a batch of short lines then computes no padding positions (36% of the
    positions of chapter 9's 100 held-out lines in one batch; sentence-transformers'
    ``encode`` sorts by length for the same reason). Padding changes no real token's
    state, so the embeddings are the one-batch ones up to float rounding (a test).
    Per-row gates (``head_mask`` with a B axis) follow their rows.

    Raises:
        ValueError / TypeError: as ``encoder_states``; ``batch_size`` not an int >= 1.
    """
    if batch_size is None or len(ids) == 0:
        hidden, _ = encoder_states(model, ids, mask, head_mask=head_mask)
        return mean_pool(hidden, mask)
    _validation.positive_int("batch_size", batch_size)
    _validation.keep_mask("mask", mask, tuple(ids.shape))
    gates = _layer_gates(model, head_mask)
    order = mask.sum(1).argsort(descending=True, stable=True)  # longest first
    out = None
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        used = mask[rows].any(0).nonzero()  # the columns some row of the batch needs
        width = int(used.max()) + 1 if len(used) else 1
        kept = [g if g is None or g.dim() == 1 else g[rows] for g in gates]
        part = sentence_embeddings(
            model, ids[rows, :width], mask[rows, :width], head_mask=kept
        )  # (b, D)
        if out is None:
            out = part.new_empty(len(order), part.shape[1])
        out[rows] = part
    return out


def head_importance(
    model, batches, *, n_probes: int = 4, normalize: bool = True, seed: int = 0
) -> Tensor:
    """Importance of every head: how far gating it off moves the sentence embeddings.

    Michel et al. take I_h = sum over examples of |dL/d xi_h|, the gradient of a loss
    with respect to a gate xi_h on head h's output at xi = 1. Our loss is the squared
    distance to the unpruned model's embeddings, L(xi) = ||e(xi) - e(1)||^2, which is 0
    with a zero gradient at xi = 1: the first-order score vanishes. Its second-order
    (Gauss-Newton) term is ||de/d xi_h||^2, so the score used is that squared Jacobian
    column, summed over sentences. It is estimated without D backward passes: for a
    random direction u ~ N(0, I), E[(u . de/d xi_h)^2] = ||de/d xi_h||^2, so each batch
    takes ``n_probes`` backward passes of u . e.

    Args:
        model: a ``MiniLMEncoder`` with H heads in each of its L layers (eval mode).
        batches: iterable of (ids (B, S), mask (B, S)).
        n_probes: random directions per batch.
        normalize: divide each layer's scores by their L2 norm (Michel et al. 4.1).

    Returns:
        (L, H) float32 importance scores, >= 0, on the CPU.

    Raises:
        ValueError: ``batches`` yields no batch (an empty or already used iterator).

    Source: Michel et al. 2019, section 4.1 (with the loss above); Hutchinson-style
    estimate of a squared norm from random projections.
    """
    n_layers, n_heads = len(model.layers), model.layers[0].self_attn.n_heads
    device = model.word_embeddings.weight.device
    gates = torch.ones(n_layers, n_heads, device=device, requires_grad=True)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.zeros(n_layers, n_heads)
    n_batches = 0
    for ids, mask in batches:
        n_batches += 1
        ids, mask = ids.to(device), mask.to(device)
        emb = sentence_embeddings(model, ids, mask, head_mask=gates)  # (B, D)
        for p in range(n_probes):
            u = torch.randn(emb.shape, generator=generator).to(device)  # (B, D)
            (grad,) = torch.autograd.grad(
                (u * emb).sum(), gates, retain_graph=p < n_probes - 1
            )
            scores += grad.detach().cpu() ** 2 / n_probes  # (L, H)
    if not n_batches:  # all-zero scores would rank every head as unimportant
        raise ValueError("batches: expected at least one (ids, mask) batch, got none")
    if normalize:
        scores = scores / scores.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return scores


@torch.no_grad()
def head_importance_loo(
    model, ids: Tensor, mask: Tensor, *, removed: list[tuple[int, int]] = ()
) -> Tensor:
    """Importance of every head as the damage of actually masking it (leave one out).

    I_h = mean over the B sentences of 1 - cos(e_b(xi^(h)), e_b(1)), where e(1) are
    the unpruned model's mean-pooled embeddings and xi^(h) the gates with the heads
    ``removed`` and head h at 0: the fidelity drop that removing h would cause now,
    measured, not predicted from a derivative. One forward pass per head, from that
    head's layer on (the inputs of every layer are computed once). With ``removed``
    it scores the next head to remove given those already gone, which makes the
    greedy, iterative pruning of Michel et al. (section 4.1), re-estimated.

    Args:
        model: a ``MiniLMEncoder`` with H heads in each of its L layers (eval mode).
        ids: (B, S) int64; mask: (B, S) bool, True = real token.
        removed: (layer, head) pairs already gated off.

    Returns:
        (L, H) float32 on the CPU, >= 0; the heads in ``removed`` get +inf (they
        cannot be removed again). A head whose removal changes nothing scores 0.

    Source: Michel et al. 2019, section 3.2 (the effect of masking one head);
    Molchanov et al. 2017, section 2.2 (the "oracle" importance, measured).
    """
    n_layers, n_heads = len(model.layers), model.layers[0].self_attn.n_heads
    device = model.word_embeddings.weight.device
    base = gates_without(list(removed), n_layers, n_heads).to(device)  # (L, H)
    x = _embed(model, ids, mask)  # (B, S, D)
    key_mask = mask[:, None, None, :]  # (B, 1, 1, S)
    inputs = []  # the input of every layer under the gates ``base``
    for layer, gate in zip(model.layers, base):
        inputs.append(x)
        x = layer(x, key_mask, head_mask=gate)
    full = mean_pool(encoder_states(model, ids, mask)[0], mask)  # (B, D)
    scores = torch.full((n_layers, n_heads), float("inf"))
    for i in range(n_layers):
        for h in range(n_heads):
            if base[i, h] == 0:
                continue
            gates = base.clone()
            gates[i, h] = 0.0
            x = inputs[i]
            for j in range(i, n_layers):
                x = model.layers[j](x, key_mask, head_mask=gates[j])
            cos = F.cosine_similarity(mean_pool(x, mask), full, dim=-1)  # (B,)
            scores[i, h] = float((1.0 - cos).mean())
    return scores


def iterative_head_order(
    model, ids: Tensor, mask: Tensor, *, step: int, n_steps: int
) -> list[tuple[int, int]]:
    """All L * H heads, least important first, by ``head_importance_loo`` re-estimated
    ``n_steps`` times: each round removes the ``step`` lowest-scoring heads given
    those removed before; the last round's scores order the rest.
    Shapes as ``head_importance_loo``. Source: Michel et al. 2019, section 4.1."""
    n_heads = model.layers[0].self_attn.n_heads
    order: list[tuple[int, int]] = []
    for _ in range(n_steps):
        scores = head_importance_loo(model, ids, mask, removed=order)
        rest = [divmod(i, n_heads) for i in scores.flatten().argsort().tolist()]
        rest = [head for head in rest if head not in order]
        order += rest[:step]
    return order + rest[step:]


def clone_encoder(model):
    """A deep copy of ``model`` to prune, without the attention weights that the
    layers keep from their last call (``copy.deepcopy`` refuses tensors that are part
    of an autograd graph)."""
    for layer in model.layers:
        layer.self_attn_weights = layer.cross_attn_weights = None
    return copy.deepcopy(model)


def gates_without(heads: list[tuple[int, int]], n_layers: int, n_heads: int) -> Tensor:
    """(L, H) float gates: 1 everywhere, 0 for each (layer, head) in ``heads``."""
    gates = torch.ones(n_layers, n_heads)
    for layer, head in heads:
        gates[layer, head] = 0.0
    return gates


class OutputBias(nn.Module):
    """What is left of a self-attention whose every head was removed: W^O's bias.
    Called like ``MultiHeadAttention``; returns (bias broadcast to (B, T, D), None).
    ``pruned_heads`` holds all ``n_original`` head indices."""

    def __init__(self, bias: Tensor, n_original: int):
        super().__init__()
        self.bias = nn.Parameter(bias.detach().clone())
        self.n_heads, self.pruned_heads = 0, set(range(n_original))

    def forward(self, query: Tensor, *args, **kwargs) -> tuple[Tensor, None]:
        return self.bias.expand_as(query), None


def remove_heads(model, heads: list[tuple[int, int]]):
    """Remove the heads ``heads`` (pairs (layer, head), indices of the unpruned model,
    also after earlier calls) physically, in place: each layer's projections lose
    those heads' rows and columns (``MultiHeadAttention.prune_heads``); a layer that
    loses all its heads keeps only W^O's bias (``OutputBias``). A head already removed
    is ignored, so two calls equal one with both lists (Hugging Face's
    ``pruned_heads``). Equals gating those heads with 0. Returns ``model``.

    Raises ValueError for a layer or head index outside the unpruned model.
    Source: Michel et al. 2019, section 2.2.
    """
    by_layer: dict[int, set[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, set()).add(head)
    for layer, removed in by_layer.items():
        attn = model.layers[layer].self_attn if 0 <= layer < len(model.layers) else None
        n_original = attn.n_heads + len(attn.pruned_heads) if attn else 0
        if not (attn and removed <= set(range(n_original))):
            raise ValueError(
                f"heads: expected (layer, head) indices of the unpruned model, layer in "
                f"[0, {len(model.layers)}), got layer {layer}, heads {sorted(removed)}"
            )
        if removed | attn.pruned_heads != set(range(n_original)):
            attn.prune_heads(removed)
        elif attn.n_heads:  # the last heads go: only W^O's bias is left
            bias = attn.out_proj.bias
            if bias is None:
                bias = torch.zeros(attn.d_model, device=attn.out_proj.weight.device)
            model.layers[layer].self_attn = OutputBias(bias, n_original)
    return model


# ------------------------------------------------------ feed-forward neurons


def ffn_neuron_scores(ff: FeedForward) -> Tensor:
    """Score of each hidden neuron j of FFN(x) = W_2 act(W_1 x + b_1) + b_2: the norm
    of its incoming weights (row j of W_1 with b_1[j]) times the norm of its outgoing
    weights (column j of W_2). Returns (d_ff,)."""
    w_in = torch.cat([ff.linear1.weight, ff.linear1.bias[:, None]], dim=1)
    return (w_in.norm(dim=1) * ff.linear2.weight.norm(dim=0)).detach()


@torch.no_grad()
def remove_ffn_neurons(model, amount: float):
    """Remove the lowest-scoring share ``amount`` of every layer's feed-forward
    neurons physically (``linear1`` loses rows, ``linear2`` columns), in place.
    Returns ``model``. Raises ValueError for ``amount`` outside [0, 1)."""
    if not 0.0 <= amount < 1.0:
        raise ValueError(f"amount: expected a share in [0, 1), got {amount}")
    for layer in model.layers:
        ff = layer.ff
        scores = ffn_neuron_scores(ff)
        n_keep = len(scores) - round(amount * len(scores))
        keep = scores.topk(n_keep).indices.sort().values
        ff.linear1 = keep_features(ff.linear1, keep, 0)
        ff.linear2 = keep_features(ff.linear2, keep, 1)
    return model


# --------------------------------------------------- single weights (PyTorch)


def linear_weights(model) -> list[tuple[nn.Module, str]]:
    """(module, "weight") of every ``nn.Linear`` in the Transformer layers: the
    parameters that ``torch.nn.utils.prune.global_unstructured`` takes."""
    return [(m, "weight") for m in model.layers.modules() if isinstance(m, nn.Linear)]


def global_magnitude_prune(model, amount: float) -> list[tuple[nn.Module, str]]:
    """Zero the share ``amount`` of smallest-magnitude weights over all linear layers
    together (``torch.nn.utils.prune.global_unstructured`` with ``L1Unstructured``).
    The shapes stay dense: each module gets ``weight_orig`` and a ``weight_mask``
    buffer and recomputes ``weight = weight_orig * weight_mask`` before every forward,
    until ``make_permanent``. Returns the pruned (module, name) pairs.
    Source: Han et al. 2015; PyTorch's pruning tutorial."""
    params = linear_weights(model)
    torch_prune.global_unstructured(
        params, pruning_method=torch_prune.L1Unstructured, amount=amount
    )
    return params


def make_permanent(params: list[tuple[nn.Module, str]]) -> None:
    """``torch.nn.utils.prune.remove`` on each pair: the zeros become the plain
    ``weight`` parameter, the mask and the forward pre-hook go away."""
    for module, name in params:
        torch_prune.remove(module, name)


def sparsity(model) -> float:
    """Share of exact zeros among the weights of the Transformer layers' linears."""
    weights = [m.weight for m, _ in linear_weights(model)]
    zeros = sum(int((w == 0).sum()) for w in weights)
    return zeros / sum(w.numel() for w in weights)


def layer_parameters(model) -> int:
    """Number of parameters in the Transformer layers (embeddings excluded)."""
    return sum(p.numel() for p in model.layers.parameters())
