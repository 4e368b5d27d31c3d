"""Chapter 10's modern decoder: RMSNorm, SwiGLU, GQA with a free head size, RoPE bases
and layouts, no biases, tied unscaled embeddings. The backbone is parity with Hugging
Face's ``LlamaForCausalLM`` on tiny random configurations, weights copied through
``interop.load_hf_llama`` (the LLMs-from-scratch pattern)."""

from __future__ import annotations

import torch

from transformer_course.mla import MultiHeadLatentAttention


def test_mla_absorbed_equals_naive():
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(32, 4, d_latent=12).eval()
    x = torch.randn(2, 7, 32)
    naive = mla(x)
    absorbed = mla(x, absorbed=True)
    assert (naive - absorbed).abs().max() < 1e-5
    # a wrong absorption (W^UK not transposed into the query side) differs
    other = MultiHeadLatentAttention(32, 4, d_latent=12).eval()
    assert (other(x, absorbed=True) - naive).abs().max() > 1e-3


def test_mla_cache_stores_only_the_latent():
    mla = MultiHeadLatentAttention(32, 4, d_latent=12).eval()
    x = torch.randn(1, 6, 32)
    full = mla(x)
    cache = []
    steps = [mla(x[:, :4], latent_cache=cache, absorbed=True)]
    steps += [mla(x[:, t : t + 1], latent_cache=cache, absorbed=True) for t in (4, 5)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5
    assert torch.cat(cache, dim=1).shape == (
        1,
        6,
        12,
    )  # d_latent per token, not 2 H d_k
