"""Positional encodings (chapter 4): sinusoidal (P15), learned, rotary in both layouts
against Hugging Face's LLaMA / GPT-J code, ALiBi against BLOOM's slopes, and positions
under a KV cache and left padding (P16)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
from transformers.models.gptj import modeling_gptj as gptj
from transformers.models.llama import modeling_llama as llama

from transformer_course.alibi import alibi_bias, alibi_slopes
from transformer_course.attention import scaled_dot_product_attention
from transformer_course.masks import causal_mask
from transformer_course.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    apply_rotary,
    position_ids,
    relative_shift_matrix,
    sinusoidal_encoding,
)

param = pytest.mark.parametrize


def _hf_cos_sin(positions, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = positions.float()[..., None] * inv  # (B, T, d/2)
    return freqs, torch.cat((freqs, freqs), -1)


def _rotary_attention(x, positions, mask, w):
    q, k = apply_rotary(x @ w[0], positions), apply_rotary(x @ w[1], positions)
    return scaled_dot_product_attention(q, k, x @ w[2], mask)[0], k


def test_p15_odd_d_model_table():
    pe = sinusoidal_encoding(10, 5, dtype=torch.float64)
    assert pe.shape == (10, 5)
    pos = torch.arange(10, dtype=torch.float64)
    for col, expo in zip((0, 2, 4), (0.0, 0.4, 0.8)):
        torch.testing.assert_close(pe[:, col], torch.sin(pos / 10000**expo))
    for col, expo in zip((1, 3), (0.0, 0.4)):
        torch.testing.assert_close(pe[:, col], torch.cos(pos / 10000**expo))
    wrong = pe.clone()
    wrong[:, 4] = torch.cos(pos / 10000**0.8)  # a cosine where the unpaired sine goes
    assert not torch.allclose(wrong, pe)


@param("d_model", [4, 8, 64])
def test_sinusoidal_matches_gptj_table(d_model):
    ref = gptj.create_sinusoidal_positions(30, d_model).double()  # [sin ... | cos ...]
    ours = sinusoidal_encoding(30, d_model, dtype=torch.float64)
    half = d_model // 2
    torch.testing.assert_close(ours[:, 0::2], ref[:, :half], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours[:, 1::2], ref[:, half:], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(ours, ref, atol=1e-3)  # the layouts differ


@settings(max_examples=30, deadline=None)
@given(max_len=st.integers(1, 60), d_model=st.integers(1, 33))
def test_sinusoidal_shape_and_range(max_len, d_model):
    pe = sinusoidal_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model)
    assert pe.abs().max() <= 1.0
    assert torch.equal(pe[0, 0::2], torch.zeros((d_model + 1) // 2))  # sin(0)
    assert torch.equal(pe[0, 1::2], torch.ones(d_model // 2))  # cos(0)


@param("k", [1, 3, -2, 17])
def test_shift_matrix_maps_pos_to_pos_plus_k(k):
    pe = sinusoidal_encoding(80, 16, dtype=torch.float64)
    m = relative_shift_matrix(k, 16, dtype=torch.float64)
    lo, hi = max(0, -k), 80 - max(0, k)
    torch.testing.assert_close(pe[lo:hi] @ m, pe[lo + k : hi + k], atol=1e-10, rtol=0)
    wrong = relative_shift_matrix(k + 1, 16, dtype=torch.float64)
    assert (pe[lo : hi - 1] @ wrong - pe[lo + k : hi + k - 1]).abs().max() > 1e-3


def test_shift_matrix_rejects_odd_d_model():
    with pytest.raises(ValueError, match="d_model"):
        relative_shift_matrix(1, 5)


@param("module", ["sinusoidal", "learned"])
def test_absolute_modules_add_table_at_given_positions(module):
    d, max_len = 6, 12
    layer = (
        SinusoidalPositionalEncoding(d, max_len)
        if module == "sinusoidal"
        else LearnedPositionalEmbedding(d, max_len)
    )
    table = layer.pe if module == "sinusoidal" else layer.embedding.weight
    x = torch.randn(2, 4, d)
    torch.testing.assert_close(layer(x), x + table[:4])
    pos = torch.tensor([[5, 6, 7, 8], [0, 0, 1, 2]])
    torch.testing.assert_close(layer(x, pos), x + table[pos])
    with pytest.raises(ValueError, match="max_len"):
        layer(x, torch.tensor([9, 10, 11, 12]))
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        layer(torch.randn(2, 4, d + 1))
    with pytest.raises(TypeError, match="positions"):
        layer(x, torch.arange(4.0))
    assert "pe" not in layer.state_dict()  # a buffer, not saved


def test_rotary_half_matches_llama():
    b, h, t, d = 2, 3, 7, 16
    q, k = torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8, 9]])
    _, emb = _hf_cos_sin(pos, d)
    q_ref, k_ref = llama.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    torch.testing.assert_close(apply_rotary(q, pos, layout="half"), q_ref)
    torch.testing.assert_close(apply_rotary(k, pos, layout="half"), k_ref)
    assert not torch.allclose(
        apply_rotary(q, pos, layout="interleaved"), q_ref, atol=1e-3
    )


def test_rotary_interleaved_matches_gptj():
    b, t, h, d = 2, 5, 2, 8  # GPT-J keeps heads after time: (B, T, H, d)
    x = torch.randn(b, t, h, d)
    pos = torch.arange(t).expand(b, t)
    freqs, _ = _hf_cos_sin(pos, d)
    ref = gptj.apply_rotary_pos_emb(x, freqs.sin(), freqs.cos())
    ours = apply_rotary(x.transpose(1, 2), pos, layout="interleaved").transpose(1, 2)
    torch.testing.assert_close(ours, ref)


def test_layouts_differ_by_a_fixed_permutation():
    d = 8
    x = torch.randn(4, 6, d)
    pos = torch.arange(6)
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))  # 0 2 4 6 1 3 5 7
    half = apply_rotary(x[..., perm], pos, layout="half")
    inter = apply_rotary(x, pos, layout="interleaved")
    torch.testing.assert_close(half, inter[..., perm])


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(0, 500),
    n=st.integers(0, 500),
    shift=st.integers(0, 500),
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 99),
)
def test_rotary_dot_depends_only_on_offset(m, n, shift, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(1, 32, generator=gen, dtype=torch.float64),
        torch.randn(1, 32, generator=gen, dtype=torch.float64),
    )

    def score(i, j):
        qi = apply_rotary(q, torch.tensor([i]), layout=layout)
        kj = apply_rotary(k, torch.tensor([j]), layout=layout)
        return (qi @ kj.T).item()

    assert math.isclose(score(m, n), score(m + shift, n + shift), abs_tol=1e-9)
    qm = apply_rotary(q, torch.tensor([m]), layout=layout)
    assert math.isclose(qm.norm().item(), q.norm().item(), rel_tol=1e-12)


def test_rotary_relative_property_can_fail():
    q, k = torch.randn(1, 16), torch.randn(1, 16)

    def score(i, j):
        return apply_rotary(q, torch.tensor([i])) @ apply_rotary(k, torch.tensor([j])).T

    assert not torch.allclose(score(3, 1), score(3, 2))  # a different offset differs


def test_rotary_errors():
    with pytest.raises(ValueError, match="even d"):
        apply_rotary(torch.randn(3, 5), torch.arange(3))
    with pytest.raises(ValueError, match="layout"):
        apply_rotary(torch.randn(3, 4), torch.arange(3), layout="neox")
    with pytest.raises(ValueError, match=r"T = 3"):
        apply_rotary(torch.randn(3, 4), torch.arange(4))
    with pytest.raises(TypeError, match="positions"):
        apply_rotary(torch.randn(3, 4), torch.arange(3.0))
    with pytest.raises(ValueError, match="even head size"):
        RotaryEmbedding(7)


def test_rotary_module_aligns_queries_to_last_keys():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    q_rot, k_rot = rope(q, k)
    torch.testing.assert_close(q_rot, apply_rotary(q, torch.tensor([4])))
    torch.testing.assert_close(k_rot, apply_rotary(k, torch.arange(5)))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_module_table_equals_apply_rotary(layout):
    """The module's cos/sin table gives apply_rotary's numbers (the interleaved
    complex product up to float32 rounding), also after the table grows, for batched
    positions, a head view, in-place changed positions and float64."""
    rope = RotaryEmbedding(8, base=500.0, layout=layout)
    rot = {"layout": layout, "base": 500.0}
    same = torch.equal if layout == "half" else torch.allclose  # rtol 1e-5
    x = torch.randn(2, 3, 5, 8).transpose(1, 2)  # (B, H, T, d), as split_heads gives
    for pos in (torch.arange(3), torch.tensor([[0, 1, 2], [100, 200, 300]])):
        q_rot, k_rot = rope(x, x, pos, pos)
        assert same(q_rot, apply_rotary(x, pos, **rot))
        assert same(k_rot, apply_rotary(x, pos, **rot))
    pos.add_(1)  # changed in place: the kept rows must not be reused
    assert same(rope(x, x, pos, pos)[0], apply_rotary(x, pos, **rot))
    wide = x.double()
    assert torch.equal(rope(wide, wide)[0], apply_rotary(wide, torch.arange(3), **rot))
    back = torch.tensor([-2, -1, 0])  # negative positions rotate backwards
    assert torch.equal(rope(x, x, back, back)[0], apply_rotary(x, back, **rot))
    assert not torch.equal(rope(x, x, back, back)[0], x)  # the check can fail


def test_rotary_half_precision_keeps_dtype():
    x = torch.randn(2, 6, 8)
    out = apply_rotary(x.to(torch.bfloat16), torch.arange(6))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), apply_rotary(x, torch.arange(6)), atol=0.05, rtol=0.02
    )


def test_position_ids_offset_and_left_padding():
    assert position_ids(3, offset=4).tolist() == [4, 5, 6]
    keep = torch.tensor([[False, False, True, True, True], [True] * 5])
    assert position_ids(2, offset=3, keep=keep).tolist() == [[1, 2], [3, 4]]
    assert position_ids(5, keep=keep[:, None, None, :]).tolist() == [
        [0, 0, 0, 1, 2],
        [0, 1, 2, 3, 4],
    ]
    with pytest.raises(ValueError, match="offset \\+ q_len"):
        position_ids(2, offset=1, keep=keep)


def test_position_ids_are_ordinary_tensors_under_inference_mode():
    """The shared rotary table trusts its last rows only for a tensor whose version
    counter it can check; inference tensors have none (generate runs in that mode)."""
    keep = torch.tensor([[False, True, True]])
    with torch.inference_mode():
        assert torch.arange(3).is_inference()  # known wrong: what arange gives here
        assert not position_ids(3).is_inference()
        assert not position_ids(1, offset=2, keep=keep).is_inference()
        assert torch.is_inference_mode_enabled()  # the mode is back after the call
    assert position_ids(1, offset=2, keep=keep).tolist() == [[1]]


@param("wrong", [False, True])
def test_p16_cached_decoding_matches_full_recompute(wrong):
    torch.manual_seed(0)
    d, prompt, steps = 8, 4, 3
    w = torch.randn(3, d, d) / math.sqrt(d)
    x = torch.randn(1, prompt + steps, d)
    full, _ = _rotary_attention(
        x, torch.arange(prompt + steps), causal_mask(prompt + steps), w
    )
    _, k_cache = _rotary_attention(x[:, :prompt], torch.arange(prompt), None, w)
    v_cache = x[:, :prompt] @ w[2]
    for step in range(steps):
        new = x[:, prompt + step : prompt + step + 1]  # (1, 1, d)
        pos = torch.tensor([0]) if wrong else position_ids(1, offset=k_cache.shape[-2])
        if not wrong:
            assert pos.item() == prompt + step
        q, k = apply_rotary(new @ w[0], pos), apply_rotary(new @ w[1], pos)
        k_cache = torch.cat((k_cache, k), -2)
        v_cache = torch.cat((v_cache, new @ w[2]), -2)
        out, _ = scaled_dot_product_attention(q, k_cache, v_cache)
        same = torch.allclose(out[0, 0], full[0, prompt + step], atol=1e-5)
        assert same != wrong


@param("n_heads", [1, 2, 3, 4, 6, 8, 12, 16, 24])
def test_alibi_slopes_match_bloom(n_heads):
    torch.testing.assert_close(
        alibi_slopes(n_heads), _get_alibi_slopes(n_heads, "cpu").float()
    )


def test_alibi_bias_values_and_alignment():
    bias = alibi_bias(4, 5)
    assert bias.shape == (4, 5, 5)
    assert torch.equal(torch.diagonal(bias, dim1=-2, dim2=-1), torch.zeros(4, 5))
    torch.testing.assert_close(bias[:, 4, 1], -alibi_slopes(4) * 3)
    torch.testing.assert_close(alibi_bias(4, 1, 5)[:, 0], bias[:, -1])  # bottom-right
    assert not torch.allclose(alibi_bias(4, 1, 5)[:, 0], bias[:, 0])


def test_alibi_causal_rows_equal_bloom_up_to_a_row_constant():
    # BLOOM adds m * j (key position) only; softmax is shift-invariant per row, so under
    # a causal mask the weights equal ours (-m * (i - j)).
    h, t = 4, 6
    scores = torch.randn(1, h, t, t)
    mask = causal_mask(t)
    bloom = _get_alibi_slopes(h, "cpu").float()[:, None, None] * torch.arange(t)
    w_ours = torch.softmax(
        (scores + alibi_bias(h, t)).masked_fill(~mask, -math.inf), -1
    )
    w_bloom = torch.softmax((scores + bloom).masked_fill(~mask, -math.inf), -1)
    torch.testing.assert_close(w_ours, w_bloom)
    w_open = torch.softmax(scores + alibi_bias(h, t), -1)  # without the causal mask
    assert not torch.allclose(w_open, torch.softmax(scores + bloom, -1), atol=1e-3)


def test_alibi_errors():
    with pytest.raises(ValueError, match="n_heads"):
        alibi_bias(0, 3)
    with pytest.raises(TypeError, match="q_len"):
        alibi_bias(2, 3.0)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=4
    ),
    n_new=st.integers(1, 6),
)
def test_position_ids_count_real_tokens(rows, n_new):
    keep = torch.tensor(rows)
    pos = position_ids(6, keep=keep)  # (B, S)
    for b in range(keep.shape[0]):
        real = pos[b][keep[b]]
        assert real.tolist() == list(range(int(keep[b].sum())))  # 0, 1, 2, ... in order
    tail = position_ids(n_new, offset=6 - n_new, keep=keep)
    assert torch.equal(tail, pos[:, 6 - n_new :])  # the cached call agrees


def test_attention_without_positions_is_permutation_equivariant():
    from transformer_course.attention import MultiHeadAttention

    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        out = mha(x, x, x)[0]
        torch.testing.assert_close(
            mha(x[:, perm], x[:, perm], x[:, perm])[0], out[:, perm]
        )
        pe = SinusoidalPositionalEncoding(16, 8)  # with positions, order matters
        xp, xq = pe(x), pe(x[:, perm])
        assert not torch.allclose(
            mha(xq, xq, xq)[0], mha(xp, xp, xp)[0][:, perm], atol=1e-3
        )


@param("k", [0, 1, 5, 40])
def test_sinusoidal_dot_product_depends_only_on_distance(k):
    pe = sinusoidal_encoding(128, 32, dtype=torch.float64)
    dots = (pe[: 128 - k] * pe[k:]).sum(-1)  # PE(p) . PE(p + k) for every p
    omega = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    torch.testing.assert_close(dots, torch.cos(k * omega).sum().expand_as(dots))
    assert not torch.allclose(dots, torch.cos((k + 1) * omega).sum().expand_as(dots))


@param("cls", [SinusoidalPositionalEncoding, LearnedPositionalEmbedding])
def test_positional_classes_take_d_model_then_max_len(cls):
    layer = cls(6, 12)  # one order for every positional class
    assert (layer.d_model, layer.max_len) == (6, 12)
    table = layer.pe if cls is SinusoidalPositionalEncoding else layer.embedding.weight
    assert table.shape == (12, 6)  # (max_len, d_model) rows of positions
    with pytest.raises(ValueError, match="x: expected shape"):
        layer(torch.randn(1, 3, 12))  # known wrong: the sizes swapped
    with pytest.raises(ValueError, match="max_len"):
        cls(6, 0)
