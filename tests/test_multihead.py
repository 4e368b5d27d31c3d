"""MultiHeadAttention: parity with torch.nn.MultiheadAttention (copied weights) and the
head pitfalls P2, P3, P8, P9, P10, P13, P14 from ../shared/cases/PITFALLS.md."""

import pytest
import torch
from torch import nn

from transformer_course.attention import ATTENTION_BACKENDS, MultiHeadAttention
from transformer_course.exercises import pitfalls
from transformer_course.interop import from_torch_mha, load_torch_mha
from transformer_course.masks import causal_mask, from_key_padding_mask

param = pytest.mark.parametrize
D, H = 16, 4


def pair(d_model=D, n_heads=H, bias=True, backend="naive"):
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).eval()
    ours = from_torch_mha(ref, backend=backend).eval()
    return ours, ref


def close(a, b, atol=1e-5):
    return torch.allclose(a, b, atol=atol, rtol=1e-5)


# ------------------------------------------------------------------ parity with PyTorch


@param("backend", ["naive", "sdpa"])
@param("bias", [True, False])
@param("kind", ["self", "cross"])
def test_parity_with_torch_mha(backend, bias, kind):
    ours, ref = pair(bias=bias, backend=backend)
    x = torch.randn(3, 5, D)
    mem = x if kind == "self" else torch.randn(3, 7, D)
    out, w = ours(x, mem, mem)
    out_ref, w_ref = ref(x, mem, mem, average_attn_weights=False)
    assert out.shape == (3, 5, D)
    assert close(out, out_ref)
    if backend == "naive":
        assert w.shape == (3, H, 5, mem.shape[1])  # P13: per head
        assert close(w, w_ref)
    else:
        assert w is None


@param("backend", ["naive", "sdpa"])
def test_parity_padding_and_causal_masks(backend):
    """P3: PyTorch's masks say True = ignore; ours True = may attend."""
    ours, ref = pair(backend=backend)
    x = torch.randn(2, 4, D)
    kpm = torch.tensor([[False, False, False, True], [False, False, True, True]])
    causal_blocked = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    out_ref, w_ref = ref(
        x,
        x,
        x,
        key_padding_mask=kpm,
        attn_mask=causal_blocked,
        average_attn_weights=False,
    )
    mask = from_key_padding_mask(kpm) & causal_mask(4)  # (B, 1, T, S)
    out, w = ours(x, x, x, mask)
    assert close(out, out_ref)
    if w is not None:
        assert close(w, w_ref)
    # the known-wrong input: PyTorch's polarity passed straight in changes the output
    out_wrong, _ = ours(x, x, x, causal_blocked)
    assert not close(out_wrong, out_ref)


def test_parity_cross_attention_with_padding():
    ours, ref = pair()
    x, mem = torch.randn(2, 3, D), torch.randn(2, 5, D)
    kpm = torch.tensor([[False] * 5, [False, False, True, True, True]])
    out_ref, w_ref = ref(x, mem, mem, key_padding_mask=kpm, average_attn_weights=False)
    out, w = ours(x, mem, mem, from_key_padding_mask(kpm))
    assert close(out, out_ref) and close(w, w_ref)
    assert (w[1, :, :, 2:] == 0).all()


def test_gradients_match_torch():
    ours, ref = pair()
    ours.train(), ref.train()
    x = torch.randn(2, 5, D, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    ours(x, x, x)[0].square().sum().backward()
    ref(x_ref, x_ref, x_ref)[0].square().sum().backward()
    assert close(x.grad, x_ref.grad, atol=1e-4)
    assert close(ours.out_proj.weight.grad, ref.out_proj.weight.grad, atol=1e-4)
    w_in = torch.cat(
        [ours.q_proj.weight.grad, ours.k_proj.weight.grad, ours.v_proj.weight.grad]
    )
    assert close(w_in, ref.in_proj_weight.grad, atol=1e-4)


def test_wrong_weight_copy_is_detected():
    """Known-wrong input for the parity check: swap W^Q and W^K."""
    ours, ref = pair()
    with torch.no_grad():
        ours.q_proj.weight.copy_(ref.in_proj_weight[D : 2 * D])
    x = torch.randn(2, 5, D)
    assert not close(ours(x, x, x)[0], ref(x, x, x)[0])


# ----------------------------------------------------------------------------- pitfalls


@param("backend", ["naive", "sdpa"])
@param("need_weights", [True, False])
def test_p2_fully_masked_head_gives_zeros(backend, need_weights):
    mha = MultiHeadAttention(3, 3, backend=backend).eval()
    x = torch.randn(1, 5, 3, requires_grad=True)
    mask = torch.ones(1, 3, 5, 5, dtype=torch.bool)
    mask[:, 2] = False  # head 2 sees no key
    out, w = mha(x, x, x, mask, need_weights=need_weights)
    out_other, _ = mha(x, x, x, mask, need_weights=not need_weights)
    assert torch.isfinite(out).all() and torch.equal(out, out_other)
    if w is not None:
        assert (w[:, 2] == 0).all() and torch.isfinite(w).all()
        assert close(w[:, :2].sum(-1), torch.ones(1, 2, 5))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_p8_split_heads_keeps_tokens_apart():
    mha = MultiHeadAttention(4, 2)
    x = torch.arange(8.0).view(1, 2, 4)
    heads = mha.split_heads(x)  # (1, 2, 2, 2)
    for h in range(2):
        for t in range(2):
            assert torch.equal(heads[0, h, t], x[0, t, 2 * h : 2 * h + 2])
    wrong = x.view(1, 2, 2, 2)  # view(B, H, T, d_k): the bug
    assert not torch.equal(wrong, heads)


def test_p8_block_diagonal_equals_separate_single_heads():
    """With block-diagonal projections, H heads = H independent single-head attentions."""
    d, h = 4, 2
    mha = MultiHeadAttention(d, h, bias=False)
    blocks = [torch.randn(2, 2) for _ in range(3)]
    with torch.no_grad():
        for proj, blk in zip((mha.q_proj, mha.k_proj, mha.v_proj), blocks):
            proj.weight.copy_(torch.block_diag(blk, blk))
        mha.out_proj.weight.copy_(torch.eye(d))
    x = torch.randn(1, 3, d)
    out, _ = mha(x, x, x)
    for head in range(h):
        single = MultiHeadAttention(2, 1, bias=False)
        with torch.no_grad():
            for proj, blk in zip((single.q_proj, single.k_proj, single.v_proj), blocks):
                proj.weight.copy_(blk)
            single.out_proj.weight.copy_(torch.eye(2))
        part = x[..., 2 * head : 2 * head + 2]
        assert close(out[..., 2 * head : 2 * head + 2], single(part, part, part)[0])


def test_p9_merge_heads_concatenates_per_token():
    mha = MultiHeadAttention(4, 2)
    heads = torch.arange(8.0).view(1, 2, 2, 2)  # (B, H, T, d)
    merged = mha.merge_heads(heads)  # (1, 2, 4)
    assert torch.equal(merged[0, 0], torch.cat([heads[0, 0, 0], heads[0, 1, 0]]))
    wrong = heads.reshape(1, 2, 4)  # straight reshape: the bug
    assert not torch.equal(wrong, merged)


def test_p10_view_after_transpose_raises_and_reshape_is_right():
    heads = torch.randn(2, 3, 5, 4)
    t = heads.transpose(1, 2)  # (B, T, H, d): not contiguous
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        t.view(2, 5, 12)
    mha = MultiHeadAttention(12, 3)
    assert torch.equal(mha.merge_heads(heads), t.contiguous().view(2, 5, 12))


def test_p13_per_head_weights_and_their_mean():
    ours, ref = pair()
    x = torch.randn(2, 5, D)
    _, w = ours(x, x, x)
    assert w.shape == (2, H, 5, 5)
    assert close(w.sum(-1), torch.ones(2, H, 5))
    _, w_avg = ref(x, x, x)  # PyTorch averages over heads by default
    assert close(w.mean(1), w_avg)
    assert not close(w[:, 0], w_avg)  # one head is not the average


@param("backend", ["naive", "sdpa"])
def test_p14_eval_no_grad_equals_training_path(backend):
    ours, _ = pair(backend=backend)
    x = torch.randn(2, 3, D)
    mask = torch.tensor([[True, True, False], [True, True, False]])[:, None, None, :]
    ours.train()
    out_train, _ = ours(x, x, x, mask)
    ours.eval()
    with torch.no_grad():
        out_eval, _ = ours(x, x, x, mask)
    assert out_eval.shape == (2, 3, D)
    assert close(out_eval, out_train)


def test_dropout_only_in_training():
    mha = MultiHeadAttention(D, H, dropout=0.5)
    x = torch.randn(2, 6, D)
    mha.eval()
    assert torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.train()
    assert not torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])


# ------------------------------------------------------------------------------- cache


def test_cache_step_by_step_equals_full_causal(list_cache):
    mha = MultiHeadAttention(D, H).eval()
    x = torch.randn(2, 6, D)
    full, _ = mha(x, x, x, causal_mask(6))
    cache, steps = list_cache(), []
    prompt = x[:, :3]
    steps.append(mha(prompt, prompt, prompt, causal_mask(3), cache=cache)[0])
    for t in range(3, 6):
        xt = x[:, t : t + 1]
        steps.append(mha(xt, xt, xt, causal_mask(1, t + 1), cache=cache)[0])
    assert close(torch.cat(steps, dim=1), full)
    assert cache.k.shape == (2, H, 6, D // H)


# ---------------------------------------------------------------------------- bad input


@param(
    "kwargs, error, words",
    [
        ({"d_model": 10, "n_heads": 3}, ValueError, "multiple of n_heads"),
        ({"d_model": 8.0, "n_heads": 2}, TypeError, "d_model"),
        ({"d_model": 8, "n_heads": 0}, ValueError, "n_heads"),
        ({"d_model": 8, "n_heads": 2, "dropout": 1.0}, ValueError, "dropout"),
        ({"d_model": 8, "n_heads": 2, "backend": "nope"}, ValueError, "backend"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        MultiHeadAttention(**kwargs)


def test_bad_forward_inputs_name_the_argument():
    mha = MultiHeadAttention(D, H)
    x = torch.randn(2, 5, D)
    with pytest.raises(
        ValueError, match=r"query: expected shape \(B, length, d_model\)"
    ):
        mha(torch.randn(2, 5, D + 1), x, x)
    with pytest.raises(ValueError, match="key"):
        mha(x, torch.randn(2, 5), x)
    with pytest.raises(ValueError, match="query, key, value"):
        mha(x, x, torch.randn(2, 4, D))
    with pytest.raises(TypeError, match="query"):
        mha(x.long(), x, x)
    with pytest.raises(TypeError, match="mask"):
        mha(x, x, x, torch.zeros(5, 5))
    with pytest.raises(ValueError, match=r"mask: expected a shape.*\(2, 4, 5, 5\)"):
        mha(x, x, x, torch.ones(3, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mha"):
        load_torch_mha(mha, nn.Linear(D, D))
    with pytest.raises(ValueError, match="n_heads"):
        load_torch_mha(mha, nn.MultiheadAttention(D, 2))


def test_backends_registry_has_naive_and_sdpa():
    assert {"naive", "sdpa"} <= set(ATTENTION_BACKENDS)


# ------------------------------------------------------------- chapter 3 exercise checks


def split_ok(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)


split_p8 = pitfalls.split_heads_view_only


def merge_ok(heads):
    B, H, T, d = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * d)


merge_p9 = pitfalls.merge_heads_no_transpose


def mha_ok(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
    from transformer_course.attention import scaled_dot_product_attention

    q, k, v = (
        split_ok(x @ w.T, n_heads) for x, w in ((query, w_q), (key, w_k), (value, w_v))
    )
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return merge_ok(out) @ w_o.T, weights


mha_averaged = pitfalls.multi_head_averaged_weights


mha_p9 = pitfalls.multi_head_merge_no_transpose


def test_ch3_checks_accept_right_answers_and_skip_stubs(capsys):
    from transformer_course.exercises import (
        check_merge_heads,
        check_multi_head_attention,
        check_split_heads,
    )

    def stub(*args):
        raise NotImplementedError("your code here")

    assert check_split_heads(split_ok) and check_merge_heads(merge_ok)
    assert check_multi_head_attention(mha_ok)
    assert not any(
        c(stub)
        for c in (check_split_heads, check_merge_heads, check_multi_head_attention)
    )
    out = capsys.readouterr().out
    assert out.count("passed") == 3 and out.count("not attempted yet") == 3


@param(
    "check_name, fn, words",
    [
        ("check_split_heads", split_p8, "P8"),
        ("check_merge_heads", merge_p9, "P9"),
        ("check_multi_head_attention", mha_averaged, "P13"),
        ("check_multi_head_attention", mha_p9, "P9"),
    ],
)
def test_ch3_checks_reject_the_pitfalls(check_name, fn, words):
    from transformer_course import exercises

    with pytest.raises(exercises.CheckError, match=words):
        getattr(exercises, check_name).strict(fn)


@param("n_heads", [1, 4, 12])
def test_parameters_and_flops_do_not_depend_on_heads(n_heads):
    from torch.utils.flop_counter import FlopCounterMode

    mha = MultiHeadAttention(48, n_heads)
    assert sum(p.numel() for p in mha.parameters()) == 4 * (48 * 48 + 48)
    x = torch.randn(1, 10, 48)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        mha(x, x, x)
    d_model, T = 48, 10
    expected = 2 * (4 * T * d_model * d_model + 2 * T * T * d_model)  # matmuls only
    assert counter.get_total_flops() == expected


# ----------------------------------------------- score bias, head gates, pruning, rotary


@param("backend", ["naive", "sdpa", "tiled"])
def test_score_bias_is_added_before_the_softmax(backend):
    from transformer_course.alibi import alibi_bias

    mha = MultiHeadAttention(D, H, backend=backend).eval()
    x = torch.randn(2, 6, D)
    bias = alibi_bias(H, 6)  # (H, T, S)
    mask = causal_mask(6)
    out, _ = mha(x, x, x, mask, bias=bias)
    q = mha.split_heads(mha.q_proj(x))  # (B, H, T, d_k)
    k = mha.split_heads(mha.k_proj(x))
    v = mha.split_heads(mha.v_proj(x))
    scores = (q @ k.transpose(-2, -1)) / (D // H) ** 0.5 + bias  # (B, H, T, S)
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    ref = mha.out_proj(mha.merge_heads(w @ v))  # (B, T, D)
    assert close(out, ref)
    assert not close(mha(x, x, x, mask)[0], ref)  # known wrong: the bias dropped
    with pytest.raises(TypeError, match="P4"):  # a float mask is still refused
        mha(x, x, x, torch.zeros(6, 6), bias=bias)
    with pytest.raises(ValueError, match="bias"):
        mha(x, x, x, mask, bias=torch.zeros(3, 6, 6))


def test_head_gates_of_one_change_nothing_and_zero_equals_pruning():
    mha = MultiHeadAttention(D, H).eval()
    x = torch.randn(2, 5, D)
    full, w = mha(x, x, x)
    ones, w_ones = mha(x, x, x, head_mask=torch.ones(H))
    assert torch.equal(ones, full) and torch.equal(w_ones, w)
    gates = torch.ones(H)
    gates[2] = 0.0
    gated, _ = mha(x, x, x, head_mask=gates)
    pruned = MultiHeadAttention(D, H).eval()
    pruned.load_state_dict(mha.state_dict())
    pruned.prune_heads([2])
    assert pruned.n_heads == H - 1
    assert pruned.q_proj.weight.shape == ((H - 1) * (D // H), D)
    assert pruned.out_proj.weight.shape == (D, (H - 1) * (D // H))
    out, weights = pruned(x, x, x)
    assert close(out, gated)
    assert weights.shape == (2, H - 1, 5, 5)
    assert torch.equal(weights[:, 2], w[:, 3])  # head 3 is now head 2
    assert not close(out, full)  # known wrong: the head really mattered
    per_item = torch.stack([gates, torch.ones(H)])  # (B, H): gate item 0 only
    both, _ = mha(x, x, x, head_mask=per_item)
    assert close(both[0], gated[0]) and close(both[1], full[1])
    with pytest.raises(ValueError, match="head_mask"):
        mha(x, x, x, head_mask=torch.ones(H + 1))
    with pytest.raises(ValueError, match="heads"):
        pruned.prune_heads([h for h in range(H) if h != 2])  # every head left
    with pytest.raises(ValueError, match="heads"):
        pruned.prune_heads([H])  # outside the unpruned module


def test_prune_heads_in_two_calls_equals_one_call():
    """Indices are the unpruned module's in every call (Hugging Face's
    ``pruned_heads``); a head already removed is ignored."""
    mha = MultiHeadAttention(D, H).eval()
    x = torch.randn(2, 5, D)
    gates = torch.ones(H)
    gates[[0, 2]] = 0.0
    gated, _ = mha(x, x, x, head_mask=gates)
    twice = MultiHeadAttention(D, H).eval()
    twice.load_state_dict(mha.state_dict())
    twice.prune_heads([0]).prune_heads([2, 0])
    assert twice.n_heads == H - 2 and twice.pruned_heads == {0, 2}
    assert close(twice(x, x, x)[0], gated)
    wrong = torch.ones(H)
    wrong[[0, 3]] = 0.0  # known wrong: 2 read as an index of the pruned module
    assert not close(mha(x, x, x, head_mask=wrong)[0], gated)


def test_rotary_attention_under_a_cache_equals_the_full_pass(list_cache):
    from transformer_course.positional import RotaryEmbedding

    mha = MultiHeadAttention(D, H, rotary=RotaryEmbedding(D // H)).eval()
    x = torch.randn(2, 7, D)
    full, _ = mha(x, x, x, causal_mask(7))
    cache = list_cache()
    steps = [mha(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=cache)[0]]
    for t in range(3, 7):
        xt = x[:, t : t + 1]
        steps.append(mha(xt, xt, xt, causal_mask(1, t + 1), cache=cache)[0])
    assert close(torch.cat(steps, dim=1), full)
    # known wrong (P16): every new token rotated as if it were at position 0
    cache = list_cache()
    mha(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=cache)
    xt = x[:, 3:4]
    bug, _ = mha(
        xt, xt, xt, causal_mask(1, 4), cache=cache, positions=torch.tensor([0])
    )
    assert not close(bug, full[:, 3:4])
    plain = MultiHeadAttention(D, H).eval()
    plain.load_state_dict(mha.state_dict())
    assert not close(plain(x, x, x, causal_mask(7))[0], full)  # rotary really rotates
