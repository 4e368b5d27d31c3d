"""attention: scaled_dot_product_attention and the backend registry against PyTorch,
one MultiHeadAttention against nn.MultiheadAttention with copied weights (masks,
caches, grouped-query heads, pruning, score bias), chapter 2's claims about scaling,
stable softmax and dropout, and the pitfalls of ../shared/cases/PITFALLS.md (P1-P3,
P5, P6, P8-P14, P18)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course import (
    ATTENTION_BACKENDS,
    attention,
    causal_mask,
    from_key_padding_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer_course.additive import additive_attention
from transformer_course.attention import (
    MultiHeadAttention,
    masked_softmax,
    repeat_kv,
    sdpa_attention,
)
from transformer_course.interop import from_torch_mha, load_torch_mha
from transformer_course.kv_cache import KVCache

param = pytest.mark.parametrize


B, H, T, S, D = 2, 3, 5, 7, 8


def _random_mask(shape):
    mask = torch.rand(shape) > 0.4
    mask[..., 0] = (
        True  # every query sees a key, so PyTorch gives no NaN to compare with
    )
    return mask


D_MULTIHEAD, H_MULTIHEAD = 16, 4


def pair(d_model=D_MULTIHEAD, n_heads=H_MULTIHEAD, bias=True, backend="naive"):
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).eval()
    ours = from_torch_mha(ref, backend=backend).eval()
    return ours, ref


def close(a, b, atol=1e-5):
    return torch.allclose(a, b, atol=atol, rtol=1e-5)


def naive(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)[0]


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


@param("mask_shape", [None, (T, S), (B, 1, 1, S), (B, H, T, S), (1, H, T, 1)])
def test_equals_pytorch_sdpa(mask_shape, qkv):
    q, k, v = qkv(B, H, T, S, D)
    mask = None if mask_shape is None else _random_mask(mask_shape)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T), atol=1e-6, rtol=0)


def test_parity_check_can_fail(qkv):
    # the known-wrong input: a mask with the opposite polarity is not "close"
    q, k, v = qkv(B, H, T, S, D)
    mask = _random_mask((T, S))
    mask[:, -1] = False
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    wrong = F.scaled_dot_product_attention(
        q, k, v, attn_mask=~mask | ~mask.any(-1, True)
    )
    assert not torch.allclose(out, wrong, atol=1e-3)


@param("backend", sorted(ATTENTION_BACKENDS))
def test_backends_agree_with_naive(backend, qkv):
    q, k, v = qkv(B, H, T, S, D)
    mask = _random_mask((B, 1, T, S))
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    out, _ = ATTENTION_BACKENDS[backend](q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_scale_argument(qkv):
    q, k, v = qkv(B, H, T, S, D)
    out, _ = scaled_dot_product_attention(q, k, v, scale=0.5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.5))


@param("dtype", [torch.float32, torch.float16, torch.bfloat16])
@param("backend", sorted(ATTENTION_BACKENDS))
def test_p1_fully_masked_item_gives_zeros_and_clean_gradients(backend, dtype):
    fn = ATTENTION_BACKENDS[backend]
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, dtype=dtype, requires_grad=True) for _ in range(3))
    keep = torch.tensor(
        [[True, True, True], [False, False, False]]
    )  # item 1: all padding
    mask = keep[:, None, :]  # (B, 1, S)
    out, weights = fn(q, k, v, mask)
    out[0].sum().backward()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    if weights is not None:
        assert torch.equal(weights[1], torch.zeros_like(weights[1]))
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    # item 0 equals running item 0 alone
    q0, k0, v0 = (x.detach()[:1].clone().requires_grad_() for x in (q, k, v))
    out0, _ = fn(q0, k0, v0, None)
    out0.sum().backward()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[0], out0[0], atol=tol, rtol=tol)
    for x, x0 in ((q, q0), (k, k0), (v, v0)):
        torch.testing.assert_close(x.grad[0], x0.grad[0], atol=tol, rtol=tol)


def test_p1_plain_softmax_would_give_nan():
    # the known-wrong implementation this library avoids
    scores = torch.zeros(1, 3).masked_fill(
        torch.ones(1, 3, dtype=torch.bool), float("-inf")
    )
    assert torch.isnan(torch.softmax(scores, -1)).all()
    assert torch.equal(
        masked_softmax(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool)),
        torch.zeros(1, 3),
    )


def test_p3_causal_row_0_sees_only_itself_and_inverted_mask_differs():
    v = torch.eye(3)[None]  # (1, 3, 3)
    q = k = torch.randn(1, 3, 3)
    future = torch.triu(torch.ones(3, 3, dtype=torch.bool), diagonal=1)  # True = future
    mask = ~future  # this library: True = may attend
    assert torch.equal(mask, causal_mask(3))
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[0, 0], v[0, 0])
    inverted, _ = scaled_dot_product_attention(q, k, v, future)  # PyTorch-MHA polarity
    assert not torch.allclose(inverted[0, 0], v[0, 0])


def test_p3_converter_from_pytorch_key_padding_mask(qkv):
    kpm = torch.tensor([[False, False, True]])  # PyTorch: True = ignore
    mask = from_key_padding_mask(kpm)
    assert mask.shape == (1, 1, 1, 3)
    assert mask.tolist() == [[[[True, True, False]]]]
    q, k, v = qkv(1, 2, 3, 3, D)
    ours, _ = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~kpm[:, None, None, :])
    torch.testing.assert_close(ours, ref)


def test_p5_padding_masks_keys_not_queries(qkv):
    ids = torch.tensor([[5, 7, 0, 0]])
    mask = padding_mask(ids, pad_id=0) & causal_mask(4)  # (1, 1, 4, 4)
    q, k, v = qkv(1, 1, 4, 4, D)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(w[..., 2:], torch.zeros_like(w[..., 2:]))
    assert torch.isfinite(out).all()
    # the wrong shape (B, 1, T, 1) hides query rows instead: without the causal part,
    # real queries then attend to the padded keys
    wrong = (ids != 0)[:, None, :, None]  # (B, 1, T, 1)
    _, w_wrong = scaled_dot_product_attention(q, k, v, wrong)
    assert (w_wrong[0, 0, :2, 2:] > 0).all()
    _, w_right = scaled_dot_product_attention(q, k, v, padding_mask(ids, pad_id=0))
    assert torch.equal(w_right[..., 2:], torch.zeros_like(w_right[..., 2:]))


def test_p6_zero_valid_keys_gives_zeros_not_uniform():
    scores = torch.randn(1, 1, 4)
    mask = padding_mask(torch.tensor([0]), max_len=4)[0]  # valid length 0: (1, 1, 4)
    assert torch.equal(masked_softmax(scores, mask), torch.zeros(1, 1, 4))
    # the d2l-style fill with a large finite number gives the wrong, uniform answer
    wrong = torch.softmax(scores.masked_fill(~mask, -1e6), dim=-1)
    torch.testing.assert_close(wrong, torch.full((1, 1, 4), 0.25))


@param(
    "args, error, words",
    [
        (
            (torch.randn(2, 3, 4), torch.randn(2, 5, 6), torch.randn(2, 5, 6)),
            ValueError,
            ["k", "d_k = 4", "(2, 5, 6)"],
        ),
        (
            (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4)),
            ValueError,
            ["v", "S = 5", "(2, 6, 4)"],
        ),
        (
            (
                torch.randn(3, 4),
                torch.randn(5, 4),
                torch.randn(5, 4),
                torch.ones(4, 5, dtype=torch.bool),
            ),
            ValueError,
            ["mask", "(3, 5)", "(4, 5)"],
        ),
        (
            (
                torch.randn(3, 4),
                torch.randn(5, 4),
                torch.randn(5, 4),
                torch.zeros(3, 5),
            ),
            TypeError,
            ["mask", "float32", "bool"],
        ),
        (
            (torch.randn(4), torch.randn(5, 4), torch.randn(5, 4)),
            ValueError,
            ["q", "(4,)"],
        ),
        (
            (torch.ones(3, 4, dtype=torch.long), torch.randn(5, 4), torch.randn(5, 4)),
            TypeError,
            ["q", "int64"],
        ),
    ],
)
@param("backend", sorted(ATTENTION_BACKENDS))
def test_bad_input_names_argument_and_shapes(args, error, words, backend):
    with pytest.raises(error) as info:
        ATTENTION_BACKENDS[backend](*args)
    for word in words:
        assert word in str(info.value)


def test_mask_that_would_grow_the_output_is_rejected(qkv):
    q, k, v = qkv(1, H, T, S, D)
    with pytest.raises(ValueError, match="mask"):
        scaled_dot_product_attention(q, k, v, torch.ones(4, 1, T, S, dtype=torch.bool))


def test_additive_attention_equals_explicit_loop():
    q, k, v = torch.randn(3, 5), torch.randn(4, 6), torch.randn(4, 2)
    w_q, w_k, w = torch.randn(7, 5), torch.randn(7, 6), torch.randn(7)
    out, weights = additive_attention(q, k, v, w_q, w_k, w)
    scores = torch.tensor(
        [
            [float(w @ torch.tanh(w_q @ q[i] + w_k @ k[j])) for j in range(4)]
            for i in range(3)
        ]
    )
    ref_w = torch.softmax(scores, -1)
    torch.testing.assert_close(weights, ref_w)
    torch.testing.assert_close(out, ref_w @ v)
    with pytest.raises(ValueError, match="w_k"):
        additive_attention(q, k, v, w_q, torch.randn(7, 5), w)


def test_gradcheck_double():
    q, k, v = (
        torch.randn(1, 3, 4, dtype=torch.double, requires_grad=True) for _ in range(3)
    )
    mask = torch.tensor(
        [[True, False, True], [True, True, False], [False, False, False]]
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v)
    )


def test_dropout_zeroes_and_rescales_only_when_asked(qkv):
    q, k, v = qkv(B, H, T, S, D)
    a, _ = scaled_dot_product_attention(q, k, v)
    b, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(a, b)
    torch.manual_seed(3)
    c, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.allclose(a, c)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))  # weights before dropout
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)


def test_scale_default_is_inverse_sqrt_d_k(qkv):
    q, k, v = qkv(B, H, T, S, D)
    a, _ = scaled_dot_product_attention(q, k, v)
    b, _ = scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(D))
    c, _ = scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.equal(a, b) and not torch.allclose(a, c)


@param("backend", ["naive", "sdpa"])
@param("bias", [True, False])
@param("kind", ["self", "cross"])
def test_parity_with_torch_mha(backend, bias, kind):
    ours, ref = pair(bias=bias, backend=backend)
    x = torch.randn(3, 5, D_MULTIHEAD)
    mem = x if kind == "self" else torch.randn(3, 7, D_MULTIHEAD)
    out, w = ours(x, mem, mem)
    out_ref, w_ref = ref(x, mem, mem, average_attn_weights=False)
    assert out.shape == (3, 5, D_MULTIHEAD)
    assert close(out, out_ref)
    if backend == "naive":
        assert w.shape == (3, H_MULTIHEAD, 5, mem.shape[1])  # P13: per head
        assert close(w, w_ref)
    else:
        assert w is None


@param("backend", ["naive", "sdpa"])
def test_parity_padding_and_causal_masks(backend):
    """P3: PyTorch's masks say True = ignore; ours True = may attend."""
    ours, ref = pair(backend=backend)
    x = torch.randn(2, 4, D_MULTIHEAD)
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
    x, mem = torch.randn(2, 3, D_MULTIHEAD), torch.randn(2, 5, D_MULTIHEAD)
    kpm = torch.tensor([[False] * 5, [False, False, True, True, True]])
    out_ref, w_ref = ref(x, mem, mem, key_padding_mask=kpm, average_attn_weights=False)
    out, w = ours(x, mem, mem, from_key_padding_mask(kpm))
    assert close(out, out_ref) and close(w, w_ref)
    assert (w[1, :, :, 2:] == 0).all()


def test_gradients_match_torch():
    ours, ref = pair()
    ours.train(), ref.train()
    x = torch.randn(2, 5, D_MULTIHEAD, requires_grad=True)
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
        ours.q_proj.weight.copy_(ref.in_proj_weight[D_MULTIHEAD : 2 * D_MULTIHEAD])
    x = torch.randn(2, 5, D_MULTIHEAD)
    assert not close(ours(x, x, x)[0], ref(x, x, x)[0])


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
    x = torch.randn(2, 5, D_MULTIHEAD)
    _, w = ours(x, x, x)
    assert w.shape == (2, H_MULTIHEAD, 5, 5)
    assert close(w.sum(-1), torch.ones(2, H_MULTIHEAD, 5))
    _, w_avg = ref(x, x, x)  # PyTorch averages over heads by default
    assert close(w.mean(1), w_avg)
    assert not close(w[:, 0], w_avg)  # one head is not the average


@param("backend", ["naive", "sdpa"])
def test_p14_eval_no_grad_equals_training_path(backend):
    ours, _ = pair(backend=backend)
    x = torch.randn(2, 3, D_MULTIHEAD)
    mask = torch.tensor([[True, True, False], [True, True, False]])[:, None, None, :]
    ours.train()
    out_train, _ = ours(x, x, x, mask)
    ours.eval()
    with torch.no_grad():
        out_eval, _ = ours(x, x, x, mask)
    assert out_eval.shape == (2, 3, D_MULTIHEAD)
    assert close(out_eval, out_train)


def test_dropout_only_in_training():
    mha = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD, dropout=0.5)
    x = torch.randn(2, 6, D_MULTIHEAD)
    mha.eval()
    assert torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.train()
    assert not torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])


def test_cache_step_by_step_equals_full_causal():
    mha = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD).eval()
    x = torch.randn(2, 6, D_MULTIHEAD)
    full, _ = mha(x, x, x, causal_mask(6))
    cache, steps = KVCache(), []
    prompt = x[:, :3]
    steps.append(mha(prompt, prompt, prompt, causal_mask(3), cache=cache)[0])
    for t in range(3, 6):
        xt = x[:, t : t + 1]
        steps.append(mha(xt, xt, xt, causal_mask(1, t + 1), cache=cache)[0])
    assert close(torch.cat(steps, dim=1), full)
    assert cache.k.shape == (2, H_MULTIHEAD, 6, D_MULTIHEAD // H_MULTIHEAD)


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
    mha = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD)
    x = torch.randn(2, 5, D_MULTIHEAD)
    with pytest.raises(
        ValueError, match=r"query: expected shape \(B, length, d_model\)"
    ):
        mha(torch.randn(2, 5, D_MULTIHEAD + 1), x, x)
    with pytest.raises(ValueError, match="key"):
        mha(x, torch.randn(2, 5), x)
    with pytest.raises(ValueError, match="query, key, value"):
        mha(x, x, torch.randn(2, 4, D_MULTIHEAD))
    with pytest.raises(TypeError, match="query"):
        mha(x.long(), x, x)
    with pytest.raises(TypeError, match="mask"):
        mha(x, x, x, torch.zeros(5, 5))
    with pytest.raises(ValueError, match=r"mask: expected a shape.*\(2, 4, 5, 5\)"):
        mha(x, x, x, torch.ones(3, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mha"):
        load_torch_mha(mha, nn.Linear(D_MULTIHEAD, D_MULTIHEAD))
    with pytest.raises(ValueError, match="n_heads"):
        load_torch_mha(mha, nn.MultiheadAttention(D_MULTIHEAD, 2))


def test_backends_registry_has_naive_and_sdpa():
    assert {"naive", "sdpa"} <= set(ATTENTION_BACKENDS)


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


@param("backend", ["naive", "sdpa", "tiled"])
def test_score_bias_is_added_before_the_softmax(backend):
    from transformer_course.alibi import alibi_bias

    mha = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD, backend=backend).eval()
    x = torch.randn(2, 6, D_MULTIHEAD)
    bias = alibi_bias(H_MULTIHEAD, 6)  # (H, T, S)
    mask = causal_mask(6)
    out, _ = mha(x, x, x, mask, bias=bias)
    q = mha.split_heads(mha.q_proj(x))  # (B, H, T, d_k)
    k = mha.split_heads(mha.k_proj(x))
    v = mha.split_heads(mha.v_proj(x))
    scores = (q @ k.transpose(-2, -1)) / (
        D_MULTIHEAD // H_MULTIHEAD
    ) ** 0.5 + bias  # (B, H, T, S)
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    ref = mha.out_proj(mha.merge_heads(w @ v))  # (B, T, D)
    assert close(out, ref)
    assert not close(mha(x, x, x, mask)[0], ref)  # known wrong: the bias dropped
    with pytest.raises(TypeError, match="P4"):  # a float mask is still refused
        mha(x, x, x, torch.zeros(6, 6), bias=bias)
    with pytest.raises(ValueError, match="bias"):
        mha(x, x, x, mask, bias=torch.zeros(3, 6, 6))


def test_head_gates_of_one_change_nothing_and_zero_equals_pruning():
    mha = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD).eval()
    x = torch.randn(2, 5, D_MULTIHEAD)
    full, w = mha(x, x, x)
    ones, w_ones = mha(x, x, x, head_mask=torch.ones(H_MULTIHEAD))
    assert torch.equal(ones, full) and torch.equal(w_ones, w)
    gates = torch.ones(H_MULTIHEAD)
    gates[2] = 0.0
    gated, _ = mha(x, x, x, head_mask=gates)
    pruned = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD).eval()
    pruned.load_state_dict(mha.state_dict())
    pruned.prune_heads([2])
    assert pruned.n_heads == H_MULTIHEAD - 1
    assert pruned.q_proj.weight.shape == (
        (H_MULTIHEAD - 1) * (D_MULTIHEAD // H_MULTIHEAD),
        D_MULTIHEAD,
    )
    assert pruned.out_proj.weight.shape == (
        D_MULTIHEAD,
        (H_MULTIHEAD - 1) * (D_MULTIHEAD // H_MULTIHEAD),
    )
    out, weights = pruned(x, x, x)
    assert close(out, gated)
    assert weights.shape == (2, H_MULTIHEAD - 1, 5, 5)
    assert torch.equal(weights[:, 2], w[:, 3])  # head 3 is now head 2
    assert not close(out, full)  # known wrong: the head really mattered
    per_item = torch.stack([gates, torch.ones(H_MULTIHEAD)])  # (B, H): gate item 0 only
    both, _ = mha(x, x, x, head_mask=per_item)
    assert close(both[0], gated[0]) and close(both[1], full[1])
    with pytest.raises(ValueError, match="head_mask"):
        mha(x, x, x, head_mask=torch.ones(H_MULTIHEAD + 1))
    with pytest.raises(ValueError, match="heads"):
        pruned.prune_heads([h for h in range(H_MULTIHEAD) if h != 2])  # every head left
    with pytest.raises(ValueError, match="heads"):
        pruned.prune_heads([H_MULTIHEAD])  # outside the unpruned module


def test_prune_heads_in_two_calls_equals_one_call():
    """Indices are the unpruned module's in every call (Hugging Face's
    ``pruned_heads``); a head already removed is ignored."""
    mha = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD).eval()
    x = torch.randn(2, 5, D_MULTIHEAD)
    gates = torch.ones(H_MULTIHEAD)
    gates[[0, 2]] = 0.0
    gated, _ = mha(x, x, x, head_mask=gates)
    twice = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD).eval()
    twice.load_state_dict(mha.state_dict())
    twice.prune_heads([0]).prune_heads([2, 0])
    assert twice.n_heads == H_MULTIHEAD - 2 and twice.pruned_heads == {0, 2}
    assert close(twice(x, x, x)[0], gated)
    wrong = torch.ones(H_MULTIHEAD)
    wrong[[0, 3]] = 0.0  # known wrong: 2 read as an index of the pruned module
    assert not close(mha(x, x, x, head_mask=wrong)[0], gated)


def test_rotary_attention_under_a_cache_equals_the_full_pass():
    from transformer_course.positional import RotaryEmbedding

    mha = MultiHeadAttention(
        D_MULTIHEAD, H_MULTIHEAD, rotary=RotaryEmbedding(D_MULTIHEAD // H_MULTIHEAD)
    ).eval()
    x = torch.randn(2, 7, D_MULTIHEAD)
    full, _ = mha(x, x, x, causal_mask(7))
    cache = KVCache()
    steps = [mha(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=cache)[0]]
    for t in range(3, 7):
        xt = x[:, t : t + 1]
        steps.append(mha(xt, xt, xt, causal_mask(1, t + 1), cache=cache)[0])
    assert close(torch.cat(steps, dim=1), full)
    # known wrong (P16): every new token rotated as if it were at position 0
    cache = KVCache()
    mha(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=cache)
    xt = x[:, 3:4]
    bug, _ = mha(
        xt, xt, xt, causal_mask(1, 4), cache=cache, positions=torch.tensor([0])
    )
    assert not close(bug, full[:, 3:4])
    plain = MultiHeadAttention(D_MULTIHEAD, H_MULTIHEAD).eval()
    plain.load_state_dict(mha.state_dict())
    assert not close(plain(x, x, x, causal_mask(7))[0], full)  # rotary really rotates


def test_dot_product_variance_grows_like_d_k():
    for d_k in (4, 64, 256):
        q, k = torch.randn(20000, d_k), torch.randn(20000, d_k)
        var = (q * k).sum(-1).var().item()
        assert abs(var / d_k - 1) < 0.1
        assert abs((q * k).sum(-1).div(math.sqrt(d_k)).var().item() - 1) < 0.1


def test_unscaled_softmax_saturates_and_its_gradient_vanishes():
    d_k = 512
    q, k = torch.randn(256, d_k), torch.randn(256, 16, d_k)
    raw = (k @ q[:, :, None]).squeeze(-1)  # (N, S)

    def grad_norm(scores):
        s = scores.clone().requires_grad_(True)
        w = torch.softmax(s, -1)
        (w * torch.randn_like(w)).sum().backward()
        return s.grad.norm(dim=-1).mean().item()

    assert grad_norm(raw) < 0.3 * grad_norm(raw / math.sqrt(d_k))

    def entropy(scores):
        w = torch.softmax(scores, -1)
        return -(w * w.clamp_min(1e-12).log()).sum(-1).mean().item()

    assert entropy(raw) < 0.5 * entropy(raw / math.sqrt(d_k))


def test_stable_softmax_handles_large_scores_and_naive_does_not():
    s = torch.tensor([[1000.0, 1001.0, 999.0]])
    naive = torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)
    assert torch.isnan(naive).all()  # the known-wrong version
    assert torch.allclose(masked_softmax(s), torch.softmax(s, -1))


def test_fully_masked_row_is_zero_not_nan_or_uniform():
    scores = torch.randn(1, 1, 4)
    mask = torch.zeros(1, 1, 4, dtype=torch.bool)
    assert torch.equal(masked_softmax(scores, mask), torch.zeros(1, 1, 4))  # P1, P6
    wrong = torch.softmax(scores.masked_fill(~mask, -1e9), -1)  # P6's bug
    assert torch.allclose(wrong, torch.full((1, 1, 4), 0.25))
    assert torch.isnan(
        torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    ).all()


def test_dropout_on_weights_only_in_training():
    q, k, v = torch.randn(3, 2, 5, 8).unbind(0)
    a, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    c, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert not torch.allclose(a, b)
    assert torch.allclose(c, scaled_dot_product_attention(q, k, v)[0])
    # expected value is preserved: survivors are scaled by 1 / (1 - p)
    runs = torch.stack(
        [scaled_dot_product_attention(q, k, v, dropout_p=0.5)[0] for _ in range(2000)]
    )
    assert torch.allclose(runs.mean(0), c, atol=0.1)


@param("backend", ["naive", "sdpa"])
@param("with_mask", [False, True])
def test_library_equals_pytorch_sdpa(backend, with_mask):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    mask = torch.rand(2, 1, 5, 7) > 0.3 if with_mask else None
    if mask is not None:
        mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out, _ = ATTENTION_BACKENDS[backend](q, k, v, mask)
    assert torch.allclose(out, ref, atol=1e-5)
    wrong_scale, _ = ATTENTION_BACKENDS[backend](q, k, v, mask, scale=1.0)
    assert not torch.allclose(wrong_scale, ref, atol=1e-3)


def test_p11_softmax_over_keys_not_batch():
    q, k = torch.randn(1, 1, 3), torch.randn(1, 2, 3)
    v = torch.randn(1, 2, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(3)  # (1, 1, 2)
    wrong = torch.softmax(scores, dim=0)  # over the batch of size 1
    assert torch.equal(wrong, torch.ones(1, 1, 2))  # every weight is 1
    _, w = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(w.sum(-1), torch.ones(1, 1))
    qb, kb, vb = torch.randn(4, 3, 8), torch.randn(4, 5, 8), torch.randn(4, 5, 2)
    perm = torch.tensor([2, 0, 3, 1])
    out_b, _ = scaled_dot_product_attention(qb, kb, vb)
    out_p, _ = scaled_dot_product_attention(qb[perm], kb[perm], vb[perm])
    assert torch.allclose(out_p, out_b[perm], atol=1e-6)


def test_p12_missing_scale():
    q = torch.ones(1, 4)
    k = torch.stack([torch.ones(4), torch.zeros(4)])
    v = torch.tensor([[1.0], [0.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(w, torch.tensor([[0.881, 0.119]]), atol=1e-3)
    assert abs(out.item() - 0.881) < 1e-3
    wrong = torch.softmax(q @ k.T, -1) @ v
    assert abs(wrong.item() - 0.982) < 1e-3


@param("backend", ["naive", "sdpa", "tiled"])
def test_backends_agree_for_every_length_p18(backend, qkv):
    fn = ATTENTION_BACKENDS[backend]
    max_len = 24
    q, k, v = qkv(1, 2, max_len, d=8)
    for t in range(1, max_len + 1):
        mask = causal_mask(t)
        args = (q[..., :t, :], k[..., :t, :], v[..., :t, :])
        kwargs = {"block_q": 5, "block_k": 7} if backend == "tiled" else {}
        out, _ = fn(*args, mask, **kwargs)
        assert max_err(out, naive(*args, mask)) < 1e-5, f"T = {t}"


@param("backend", ["naive", "sdpa", "tiled"])
def test_earlier_outputs_ignore_later_tokens_p18(backend, qkv):
    fn = ATTENTION_BACKENDS[backend]
    q, k, v = qkv(1, 2, 16, d=8)
    mask = causal_mask(16)
    out, _ = fn(q, k, v, mask)
    for t in (1, 7, 15):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[..., t:, :] = torch.randn_like(x[..., t:, :])
        out2, _ = fn(q2, k2, v2, mask)
        assert torch.allclose(out2[..., :t, :], out[..., :t, :], atol=1e-6)
        leaky, _ = fn(q2, k2, v2)  # no causal mask: the future leaks in
        assert not torch.allclose(leaky[..., :t, :], out[..., :t, :], atol=1e-3)


def test_repeat_kv():
    x = torch.randn(2, 3, 5, 4)
    y = repeat_kv(x, 4)
    assert y.shape == (2, 12, 5, 4)
    assert torch.equal(y, x.repeat_interleave(4, dim=1))
    assert torch.equal(y[:, 7], x[:, 1])
    assert not torch.equal(y, x.repeat(1, 4, 1, 1))  # tiling heads is the wrong order
    assert repeat_kv(x, 1) is x


def test_gqa_with_n_kv_heads_equal_n_heads_is_multihead():
    mha = MultiHeadAttention(32, 4).eval()
    gqa = MultiHeadAttention(32, 4, n_kv_heads=4).eval()
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 7, 32)
    mask = causal_mask(7)
    (out, w), (ref, w_ref) = gqa(x, x, x, mask), mha(x, x, x, mask)
    assert max_err(out, ref) < 1e-6 and max_err(w, w_ref) < 1e-6
    other = MultiHeadAttention(32, 4, n_kv_heads=4).eval()
    assert max_err(other(x, x, x, mask)[0], ref) > 1e-3


@param("n_kv_heads", [1, 2, 4])
@param("backend", ["naive", "sdpa", "tiled"])
def test_gqa_matches_pytorch_enable_gqa(n_kv_heads, backend):
    d_model, n_heads, d_k = 32, 4, 8
    gqa = MultiHeadAttention(
        d_model, n_heads, n_kv_heads=n_kv_heads, backend=backend
    ).eval()
    assert gqa.k_proj.weight.shape == (n_kv_heads * d_k, d_model)
    x = torch.randn(2, 9, d_model)
    out, _ = gqa(x, x, x, causal_mask(9))
    q = gqa.q_proj(x).view(2, 9, n_heads, d_k).transpose(1, 2)  # (B, H, T, d_k)
    k = gqa.k_proj(x).view(2, 9, n_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
    v = gqa.v_proj(x).view(2, 9, n_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = gqa.out_proj(ref.transpose(1, 2).reshape(2, 9, d_model))  # (B, T, D)
    assert max_err(out, ref) < 1e-5


@param("n_kv_heads", [2, 3])
@param("masked", [False, True])
def test_sdpa_takes_grouped_kv_heads_as_they_are(n_kv_heads, masked):
    q = torch.randn(2, 6, 4, 8)  # (B, H, T, d_k)
    k, v = torch.randn(2, n_kv_heads, 5, 8), torch.randn(2, n_kv_heads, 5, 3)
    mask = _random_mask((2, 1, 4, 5)) if masked else None
    out, _ = sdpa_attention(q, k, v, mask)
    n_rep = 6 // n_kv_heads
    ref, _ = scaled_dot_product_attention(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask
    )
    assert max_err(out, ref) < 1e-6
    tiled, _ = sdpa_attention(
        q, k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1), mask
    )
    assert max_err(tiled, ref) > 1e-3  # known wrong: heads tiled, not grouped


def test_grouped_kv_heads_must_divide_the_query_heads():
    q, kv3 = torch.randn(1, 6, 4, 8), torch.randn(1, 3, 5, 8)
    assert sdpa_attention(q, kv3, kv3)[0].shape == (1, 6, 4, 8)
    kv4 = torch.randn(1, 4, 5, 8)
    with pytest.raises(
        ValueError, match=r"H_kv key/value heads dividing H.*\(1, 4, 5, 8\)"
    ):
        sdpa_attention(q, kv4, kv4)
    for fn in (scaled_dot_product_attention, ATTENTION_BACKENDS["tiled"]):
        with pytest.raises(ValueError, match="the same leading"):  # H heads only
            fn(q, kv3, kv3)


def test_gqa_decoding_on_sdpa_shares_kv_heads_without_a_copy(monkeypatch):
    naive = MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    fused = MultiHeadAttention(32, 4, n_kv_heads=2, backend="sdpa").eval()
    fused.load_state_dict(naive.state_dict())
    copies = []
    monkeypatch.setattr(
        attention, "repeat_kv", lambda x, n: copies.append(n) or repeat_kv(x, n)
    )
    x, caches = torch.randn(1, 6, 32), (KVCache(), KVCache())
    fused(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=caches[0])
    naive(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=caches[1])
    assert copies == [2, 2, 2, 2]  # masked: repeated on every backend (CUDA's kernels)
    for t in range(3, 6):  # one token a step, no mask: every key is visible
        step, before = x[:, t : t + 1], len(copies)
        out, _ = fused(step, step, step, cache=caches[0])
        assert len(copies) == before  # the grouped heads went to PyTorch as they are
        ref, _ = naive(step, step, step, cache=caches[1])
        assert len(copies) == before + 2  # known wrong: the naive backend copies them
        assert max_err(out, ref) < 1e-6


@param("n_kv_heads", [1, 2])
def test_gqa_cache_stores_kv_heads_and_matches_full(n_kv_heads):
    gqa = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(1, 6, 32)
    full, _ = gqa(x, x, x, causal_mask(6))
    cache, steps = KVCache(), []
    for t in range(6):
        step = x[:, t : t + 1]
        out, _ = gqa(step, step, step, causal_mask(1, t + 1), cache=cache)
        steps.append(out)
    assert cache.k.shape == (1, n_kv_heads, 6, 8)
    assert max_err(torch.cat(steps, dim=1), full) < 1e-5


def test_language_model_with_gqa_layers_cached_equals_uncached(tiny_config):
    from transformer_course.decoding import new_caches
    from transformer_course.model import DecoderOnlyLM

    lm = DecoderOnlyLM(tiny_config(tgt_vocab_size=20)).eval()
    for layer in lm.layers:
        layer.self_attn = MultiHeadAttention(32, 4, n_kv_heads=2)
    ids = torch.randint(4, 20, (2, 10))
    with torch.no_grad():
        full = lm(ids)  # (B, T, V)
        caches = new_caches(lm)
        steps = [lm(ids[:, :4], caches=caches)]
        steps += [lm(ids[:, t : t + 1], caches=caches) for t in range(4, 10)]
    assert caches[0].k.shape == (2, 2, 10, 8)  # the cache holds H_kv = 2 heads
    assert max_err(torch.cat(steps, dim=1), full) < 1e-5
