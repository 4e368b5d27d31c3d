"""Chapter 10's modern decoder: RMSNorm, SwiGLU, GQA with a free head size, RoPE bases
and layouts, no biases, tied unscaled embeddings. The backbone is parity with Hugging
Face's ``LlamaForCausalLM`` on tiny random configurations, weights copied through
``interop.load_hf_llama`` (the LLMs-from-scratch pattern)."""

from __future__ import annotations

import pytest
import torch

from transformer_course.decoding import KVCache
from transformer_course.interop import (
    llama_config_from_hf,
    llama_names,
    load_hf_llama,
    permute_rotary_rows,
)
from transformer_course.model import DecoderOnlyLM, TransformerConfig

transformers = pytest.importorskip("transformers")


param = pytest.mark.parametrize


#: One tiny configuration per new option (each differs from the first in one way).
LLAMA_OPTIONS = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "head_dim": {"head_dim": 16},  # 4 heads of 16 in a d_model of 32
    "untied": {"tie_word_embeddings": False},
    "rope_base": {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    "eps": {"rms_norm_eps": 1e-2},
}


def hf_llama(**overrides):
    base = {
        "vocab_size": 61,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    cfg = transformers.LlamaConfig(**{**base, **overrides})
    cfg._attn_implementation = "eager"
    ref = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random norm gains: a copied gain of 1 would prove nothing
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return ref


def ours_from(ref) -> DecoderOnlyLM:
    ours = DecoderOnlyLM(llama_config_from_hf(ref.config)).eval()
    return load_hf_llama(ours, ref.state_dict())


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


@param("option", list(LLAMA_OPTIONS))
def test_decoder_matches_hf_llama(option):
    ref = hf_llama(**LLAMA_OPTIONS[option])
    ours = ours_from(ref)
    ids = torch.randint(0, 61, (2, 11))
    with torch.no_grad():
        expected = ref(ids).logits
        got = ours(ids)
    assert (got - expected).abs().max() < 1e-5
    # a model with other weights is far off: the comparison can fail
    other = DecoderOnlyLM(ours.cfg).eval()
    with torch.no_grad():
        assert (other(ids) - expected).abs().max() > 1e-2


def test_decoder_matches_hf_llama_with_left_padding():
    ref = hf_llama()
    ours = ours_from(ref)
    ids = torch.randint(1, 61, (2, 9))
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[1, :3] = False
    with torch.no_grad():
        alone = ours(ids[1:, 3:])[0, -1]
        padded = ours(ids, attention_mask=keep)[1, -1]
        hf_alone = ref(ids[1:, 3:]).logits[0, -1]
    assert (padded - alone).abs().max() < 1e-5
    assert (alone - hf_alone).abs().max() < 1e-5


def test_llama_kv_cache_equals_no_cache():
    ours = ours_from(hf_llama())
    ids = torch.randint(0, 61, (2, 10))
    caches = [KVCache() for _ in ours.layers]
    with torch.no_grad():
        full = ours(ids)
        steps = [ours(ids[:, :6], caches=caches)]
        steps += [ours(ids[:, t : t + 1], caches=caches) for t in range(6, 10)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5
    assert caches[0].k.shape == (2, 2, 10, 8)  # (B, H_kv, S, d_k): 2 KV heads, not 4


def test_hf_loader_rejects_interleaved_layout():
    ref = hf_llama()
    cfg = llama_config_from_hf(ref.config)
    wrong = DecoderOnlyLM(
        TransformerConfig(**{**cfg.__dict__, "rope_layout": "interleaved"})
    )
    with pytest.raises(ValueError, match="rope_layout"):
        load_hf_llama(wrong, ref.state_dict())
    ids = torch.randint(0, 61, (1, 12))
    load_hf_llama(wrong, ref.state_dict(), check_layout=False)
    with torch.no_grad():  # what the check prevents: silently different logits
        assert (wrong.eval()(ids) - ref(ids).logits).abs().max() > 1e-3


def test_permuted_rows_restore_the_model_in_the_other_layout():
    """GGUF's rows (interleaved) in an interleaved model equal HF's rows in a half one."""
    ref = hf_llama()
    cfg = llama_config_from_hf(ref.config)
    sd = dict(ref.state_dict())
    for name in list(sd):
        if "q_proj" in name or "k_proj" in name:
            n = cfg.n_heads if "q_proj" in name else cfg.n_kv_heads
            sd[name] = permute_rotary_rows(sd[name], n, "interleaved")
    inter = DecoderOnlyLM(
        TransformerConfig(**{**cfg.__dict__, "rope_layout": "interleaved"})
    )
    load_hf_llama(inter, sd, check_layout=False)
    ids = torch.randint(0, 61, (1, 12))
    with torch.no_grad():
        assert (inter.eval()(ids) - ref(ids).logits).abs().max() < 1e-5
    w = torch.randn(2 * 8, 5)
    back = permute_rotary_rows(permute_rotary_rows(w, 2, "interleaved"), 2, "half")
    assert torch.equal(back, w)
    assert not torch.equal(permute_rotary_rows(w, 2, "interleaved"), w)


def test_hf_loader_names_the_missing_tensor():
    ref = hf_llama()
    sd = dict(ref.state_dict())
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_llama(DecoderOnlyLM(llama_config_from_hf(ref.config)), sd)


def test_hf_loader_names_the_misshaped_tensor():
    ref = hf_llama()
    sd = dict(ref.state_dict())
    sd["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32)  # 4 KV heads
    with pytest.raises(ValueError, match=r"k_proj\.weight.*\(32, 32\).*\(16, 32\)"):
        load_hf_llama(DecoderOnlyLM(llama_config_from_hf(ref.config)), sd)


def test_hf_loader_rejects_a_model_with_biases():
    ref = hf_llama()
    cfg = llama_config_from_hf(ref.config)
    with pytest.raises(KeyError, match="q_proj.bias"):
        load_hf_llama(
            DecoderOnlyLM(TransformerConfig(**{**cfg.__dict__, "bias": True})),
            ref.state_dict(),
        )


def test_llama_names_cover_every_parameter():
    model = DecoderOnlyLM(
        llama_config_from_hf(hf_llama(tie_word_embeddings=False).config)
    )
    names = llama_names(len(model.layers), "gguf")
    assert {n for n, _ in model.named_parameters()} == set(names)
    assert names["layers.1.self_attn.out_proj.weight"] == "blk.1.attn_output.weight"


@param(
    "overrides, match",
    [
        ({"norm": "batch"}, "norm"),
        ({"activation": "swish"}, "activation"),
        ({"n_kv_heads": 3}, "n_kv_heads"),
        ({"rope_layout": "pairs"}, "rope_layout"),
        ({"d_model": 30}, "d_model"),
    ],
)
def test_config_rejects_bad_modern_options(overrides, match, tiny_config):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)
    tiny_config()  # known right: the same config without the override is accepted


def test_head_dim_frees_d_model_from_n_heads(tiny_config):
    cfg = tiny_config(d_model=30, head_dim=8, positional="rope")  # 4 heads of 8
    model = DecoderOnlyLM(cfg)
    assert model.layers[0].self_attn.q_proj.weight.shape == (32, 30)
    assert model(torch.randint(1, 12, (1, 5))).shape == (1, 5, 12)


def test_gguf_config_rejects_another_architecture():
    from types import SimpleNamespace

    from transformer_course.interop import llama_config_from_gguf

    reader = SimpleNamespace(
        fields={"general.architecture": _Field("gemma")}, tensors=[]
    )
    with pytest.raises(ValueError, match="'llama'.*'gemma'"):
        llama_config_from_gguf(reader)


def test_permute_rotary_rows_rejects_odd_heads():
    with pytest.raises(ValueError, match="n_heads=3"):
        permute_rotary_rows(torch.randn(9, 4), 3, "half")
    with pytest.raises(ValueError, match="to"):
        permute_rotary_rows(torch.randn(8, 4), 2, "sideways")
