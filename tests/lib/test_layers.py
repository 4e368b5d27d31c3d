"""Chapter 10's modern decoder: RMSNorm, SwiGLU, GQA with a free head size, RoPE bases
and layouts, no biases, tied unscaled embeddings. The backbone is parity with Hugging
Face's ``LlamaForCausalLM`` on tiny random configurations, weights copied through
``interop.load_hf_llama`` (the LLMs-from-scratch pattern)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.layers import RMSNorm, SwiGLU, TransformerLayer

transformers = pytest.importorskip("transformers")


def test_rmsnorm_matches_torch_and_hf():
    x = torch.randn(3, 5, 16) * 4 + 1
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    expected = F.rms_norm(x, (16,), norm.weight, eps=1e-6)
    assert (norm(x) - expected).abs().max() < 1e-6
    hf = transformers.models.llama.modeling_llama.LlamaRMSNorm(16, eps=1e-6)
    hf.weight.data.copy_(norm.weight.data)
    assert (norm(x) - hf(x)).abs().max() < 1e-6
    layer = F.layer_norm(x, (16,), norm.weight, eps=1e-6)  # subtracts the mean too
    assert (norm(x) - layer).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rmsnorm_is_its_formula_bit_for_bit(dtype):
    x = (torch.randn(3, 5, 16) * 4 + 1).to(dtype)
    norm = RMSNorm(16, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    h = x.float()
    formula = norm.weight * (
        h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    ).to(dtype)
    assert torch.equal(norm(x), formula)  # float32: PyTorch's fused rms_norm
    assert not torch.equal(norm(x), norm.weight * x)  # known wrong: not normalised


def test_layer_dropout_only_in_training():
    layer = TransformerLayer(32, 4, 64, dropout=0.5, norm="rms", activation="swiglu")
    x = torch.randn(2, 5, 32)
    assert not torch.equal(layer.train()(x), layer(x))  # each call draws anew
    assert torch.equal(layer.eval()(x), layer(x))


def test_rmsnorm_raises_on_wrong_width():
    with pytest.raises(ValueError, match=r"\(\.\.\., 16\)"):
        RMSNorm(16)(torch.randn(2, 8))


def test_swiglu_matches_hf_llama_mlp():
    cfg = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=24, num_attention_heads=4
    )
    hf = transformers.models.llama.modeling_llama.LlamaMLP(cfg)
    ours = SwiGLU(16, 24)
    ours.gate_proj.weight.data.copy_(hf.gate_proj.weight.data)
    ours.up_proj.weight.data.copy_(hf.up_proj.weight.data)
    ours.down_proj.weight.data.copy_(hf.down_proj.weight.data)
    x = torch.randn(2, 5, 16)
    assert (ours(x) - hf(x)).abs().max() < 1e-6
    ungated = ours.down_proj(F.silu(ours.up_proj(x)))  # no gate: a different function
    assert (ungated - hf(x)).abs().max() > 1e-3


def test_layer_defaults_are_the_2017_layer():
    layer = TransformerLayer(32, 4, 64)
    assert isinstance(layer.self_attn_norm, nn.LayerNorm)
    assert layer.self_attn.q_proj.bias is not None and hasattr(layer.ff, "linear1")
    modern = TransformerLayer(32, 4, 64, norm="rms", activation="swiglu", bias=False)
    assert isinstance(modern.ff_norm, RMSNorm) and isinstance(modern.ff, SwiGLU)
    assert modern.self_attn.q_proj.bias is None
