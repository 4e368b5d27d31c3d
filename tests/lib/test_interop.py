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
gguf = pytest.importorskip("gguf")


param = pytest.mark.parametrize


LLAMA3_ROPE = {  # wavelengths 6.3, 63, 628, 6283 against bands at 16 and 64
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
# larger random weights than transformers' 0.02: positions then matter to the logits
# (the scaling ignored gives logits off by about 6, not 0.001); transformers wants a
# context longer than the original one
LLAMA3 = {"rope_parameters": LLAMA3_ROPE, "initializer_range": 0.2}
LLAMA3["max_position_embeddings"] = 128
LINEAR = {"rope_parameters": LINEAR_ROPE, "initializer_range": 0.2}

#: One tiny configuration per new option (each differs from the first in one way).
LLAMA_OPTIONS = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "head_dim": {"head_dim": 16},  # 4 heads of 16 in a d_model of 32
    "untied": {"tie_word_embeddings": False},
    "rope_base": {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    "eps": {"rms_norm_eps": 1e-2},
    # issue 40: each of these loaded without an error and gave other logits
    "rope_llama3": LLAMA3,  # a head's 4 pairs in 3 bands
    "rope_linear": LINEAR,
    "attention_bias": {"attention_bias": True},
    "mlp_bias": {"mlp_bias": True},
    "both_biases": {"attention_bias": True, "mlp_bias": True},
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
    with torch.no_grad():  # random gains and biases: copied 1s and 0s prove nothing
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
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
    ids = torch.randint(0, 61, (2, 40))  # 40 positions: slow RoPE pairs turn too
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


# ------------------------------------------- issue 40: every config key read or refused


def hf_dict(**overrides) -> dict:
    """A tiny LlamaConfig's keys and values, as ``to_dict()`` (or a config.json)."""
    return {**hf_llama().config.to_dict(), **overrides}


#: A changed value for every key llama_config_from_hf reads (``READ`` in its table).
HF_READ_CHANGES = {
    "vocab_size": 67,
    "hidden_size": 64,
    "intermediate_size": 50,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-3,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "mlp_bias": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
    "rope_theta": 500.0,  # transformers 4: without rope_parameters
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},  # transformers 4
}


def test_every_hf_key_is_read_skipped_or_refused_as_its_table_says():
    from transformer_course.checkpoint_keys import HF_LLAMA_KEYS, MUST, READ, SKIP

    reads = {k for k, (kind, _) in HF_LLAMA_KEYS.items() if kind == READ}
    assert reads == set(HF_READ_CHANGES)  # a new key read gets a test here
    base = llama_config_from_hf(hf_dict())
    for key, (kind, detail) in HF_LLAMA_KEYS.items():
        d = hf_dict()
        if key in ("rope_theta", "rope_scaling"):
            del d["rope_parameters"]
        if kind == READ:
            d[key] = HF_READ_CHANGES[key]
            assert llama_config_from_hf(d) != base, key
        elif kind == SKIP:  # any value: nothing read
            d[key] = "a value nothing reads"
            assert llama_config_from_hf(d) == base, key
        else:
            assert kind == MUST
            d[key] = "another value"
            with pytest.raises(ValueError, match=f"'{key}' must be"):
                llama_config_from_hf(d)
    assert llama_config_from_hf(hf_dict(model_type="llama")) == base  # known right


@param(
    "key, value",
    [
        ("sliding_window", 4),  # Mistral's: attention would be windowed
        ("layer_types", ["full_attention", "sliding_attention"]),
        ("logit_scale", 0.5),
    ],
)
def test_hf_config_refuses_an_unknown_key_by_name(key, value):
    with pytest.raises(ValueError, match=f"key '{key}' = .* refused"):
        llama_config_from_hf(hf_dict(**{key: value}))


@param("kind", ["dynamic", "yarn", "longrope", "proportional"])
def test_hf_config_refuses_a_rope_type_not_built(kind):
    rope = {"rope_type": kind, "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match=f"rope_type '{kind}'"):
        llama_config_from_hf(hf_dict(rope_parameters=rope))


@param(
    "rope, match",
    [
        ({**LINEAR_ROPE, "attention_factor": 0.5}, "'attention_factor'"),
        ({**LLAMA3_ROPE, "partial_rotary_factor": 0.5}, "'partial_rotary_factor'"),
        ({"rope_type": "default", "rope_theta": 1e4, "factor": 8.0}, "'factor'"),
        ({"rope_type": "linear", "rope_theta": 1e4}, "needs 'factor'"),
    ],
)
def test_hf_config_refuses_rope_keys_its_type_does_not_read(rope, match):
    with pytest.raises(ValueError, match=match):
        llama_config_from_hf(hf_dict(rope_parameters=rope))
    for ok in (LLAMA3_ROPE, LINEAR_ROPE, {**LINEAR_ROPE, "partial_rotary_factor": 1}):
        assert llama_config_from_hf(hf_dict(rope_parameters=ok)).rope_freq_factors


def test_llama3_factors_give_transformers_frequencies():
    from transformer_course.checkpoint_keys import llama3_freq_factors

    ref = hf_llama(**LLAMA3)
    theirs = ref.model.rotary_emb.inv_freq.double()  # (d/2,)
    plain = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    keys = ("factor", "low_freq_factor", "high_freq_factor")
    args = [LLAMA3_ROPE[k] for k in (*keys, "original_max_position_embeddings")]
    factors = torch.tensor(llama3_freq_factors(8, 10000.0, *args), dtype=torch.float64)
    assert torch.allclose(plain / factors, theirs, rtol=1e-6)
    assert factors[0] == 1 and factors[-1] == 8 and 1 < factors[1] < 8  # three bands


def test_a_checkpoint_saved_by_transformers_loads_from_its_files(tmp_path):
    """config.json (as a dict) and model.safetensors, as ``save_pretrained`` wrote
    them, with Llama 3 RoPE scaling and biases."""
    import json

    from safetensors.torch import load_file

    ref = hf_llama(**LLAMA3, attention_bias=True, mlp_bias=True)
    ref.save_pretrained(tmp_path)
    cfg = llama_config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert cfg == llama_config_from_hf(ref.config)
    sd = load_file(tmp_path / "model.safetensors")
    assert_same_logits(load_hf_llama(DecoderOnlyLM(cfg), sd).eval(), ref)


def test_hf_loader_refuses_a_tensor_the_model_has_no_place_for():
    ref = hf_llama(attention_bias=True)
    plain = DecoderOnlyLM(llama_config_from_hf(hf_llama().config))  # no biases
    with pytest.raises(
        ValueError, match=r"'model\.layers\.0\.self_attn\.q_proj\.bias'"
    ):
        load_hf_llama(plain, ref.state_dict())
    sd = {**hf_llama().state_dict(), "model.layers.0.self_attn.rotary_emb.inv_freq": 0}
    load_hf_llama(plain, sd)  # known harmless: old transformers' saved frequencies


# ------------------------------------------------------- issue 40: GGUF files, written here


def gguf_meta(ref) -> dict:
    """The metadata llama.cpp's converter writes for ``ref`` (key -> (value, type))."""
    c = ref.config
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {
        "llama.vocab_size": (c.vocab_size, u32),
        "llama.context_length": (c.max_position_embeddings, u32),
        "llama.embedding_length": (c.hidden_size, u32),
        "llama.block_count": (c.num_hidden_layers, u32),
        "llama.feed_forward_length": (c.intermediate_size, u32),
        "llama.attention.head_count": (c.num_attention_heads, u32),
        "llama.attention.head_count_kv": (c.num_key_value_heads, u32),
        "llama.attention.layer_norm_rms_epsilon": (c.rms_norm_eps, f32),
        "llama.rope.freq_base": (c.rope_parameters["rope_theta"], f32),
        "llama.rope.dimension_count": (c.head_dim, u32),
        "llama.attention.key_length": (c.head_dim, u32),
        "llama.attention.value_length": (c.head_dim, u32),
    }


def write_gguf(path, ref, *, meta=None, drop=(), tensors=None, big_endian=False):
    """``ref``'s weights as llama.cpp's converter writes them (W^Q, W^K and their
    biases permuted to the interleaved layout, no output.weight when tied), float32,
    with ``gguf_meta(ref)`` updated by ``meta``, less the keys in ``drop``, plus
    ``tensors`` (name -> array); returns a reader of the file."""
    c = ref.config
    order = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(str(path), "llama", endianess=order)
    for key, (value, vtype) in {**gguf_meta(ref), **(meta or {})}.items():
        if key not in drop:
            writer.add_key_value(key, value, vtype)
    writer.add_token_list([f"t{i}" for i in range(c.vocab_size)])
    n = c.num_hidden_layers
    flags = {"bias": c.attention_bias, "ff_bias": c.mlp_bias}
    hf_names = llama_names(n, "hf", **flags)
    sd = ref.state_dict()
    for mine, name in llama_names(n, "gguf", **flags).items():
        if name == "output.weight" and c.tie_word_embeddings:
            continue
        w = sd[hf_names[mine]].float()
        if "q_proj" in mine or "k_proj" in mine:
            heads = c.num_attention_heads if "q_proj" in mine else c.num_key_value_heads
            w = permute_rotary_rows(w.reshape(w.shape[0], -1), heads, "interleaved")
            w = w.reshape(sd[hf_names[mine]].shape)
        writer.add_tensor(name, w.numpy())
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(str(path))


def ours_from_gguf(reader) -> DecoderOnlyLM:
    from transformer_course.gguf_loader import llama_config_from_gguf, load_gguf_llama

    return load_gguf_llama(DecoderOnlyLM(llama_config_from_gguf(reader)), reader).eval()


def assert_same_logits(ours, ref, length=40):
    ids = torch.randint(0, ref.config.vocab_size, (2, length))
    with torch.no_grad():
        got, expected = ours(ids), ref(ids).logits
    got = getattr(got, "logits", got)  # ours, or a transformers model
    assert torch.isfinite(got).all()
    assert (got - expected).abs().max() < 1e-4


def test_a_gguf_written_here_is_the_hf_model_for_transformers_and_for_us(tmp_path):
    """The writer above is llama.cpp's layout: transformers reads its file back as the
    model it came from (the reference of every GGUF test below)."""
    pytest.importorskip("accelerate")
    ref = hf_llama(tie_word_embeddings=False)
    reader = write_gguf(tmp_path / "tiny.gguf", ref)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32
    ).eval()
    assert_same_logits(theirs, ref)
    assert_same_logits(ours_from_gguf(reader), ref)


def rope_freqs_of(ref):
    """llama.cpp's ``rope_freqs``: default frequencies / the reference's (Llama 3's)."""
    d = ref.config.head_dim
    plain = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return (plain / ref.model.rotary_emb.inv_freq.double()).float().numpy()


_S, _F, _U = (
    gguf.GGUFValueType.STRING,
    gguf.GGUFValueType.FLOAT32,
    gguf.GGUFValueType.UINT32,
)
LINEAR_META = {"llama.rope.scaling.type": ("linear", _S)}
LINEAR_META["llama.rope.scaling.factor"] = (4.0, _F)

#: Issue 40's GGUF kinds: (the reference's LlamaConfig options, write_gguf's options).
GGUF_KINDS = {
    "rope_freqs": (LLAMA3, {"rope_freqs": True}),
    "linear_scaling": (LINEAR, {"meta": LINEAR_META}),
    "key_length": ({"head_dim": 16}, {}),  # 4 heads of 16 in a d_model of 32
    "no_freq_base": ({}, {"drop": ("llama.rope.freq_base",)}),
    "no_vocab_size": ({}, {"drop": ("llama.vocab_size",)}),
    "biases": ({"attention_bias": True, "mlp_bias": True}, {}),
    "attention_biases": ({"attention_bias": True}, {}),
    "big_endian": ({"tie_word_embeddings": False}, {"big_endian": True}),
}


@param("kind", list(GGUF_KINDS))
def test_gguf_of_each_kind_loads_as_the_reference_model(tmp_path, kind):
    hf, args = GGUF_KINDS[kind]
    ref = hf_llama(**hf)
    args = dict(args)
    if args.pop("rope_freqs", False):  # the file keeps the plain base, as llama.cpp's
        args["tensors"] = {"rope_freqs.weight": rope_freqs_of(ref)}
    reader = write_gguf(tmp_path / "tiny.gguf", ref, **args)
    assert_same_logits(ours_from_gguf(reader), ref)


def test_a_big_endian_file_is_reported_and_its_quantized_tensors_refused(tmp_path):
    from gguf.quants import quantize

    from transformer_course.gguf_loader import gguf_tensor

    ref = hf_llama()
    w = ref.state_dict()["model.layers.0.mlp.up_proj.weight"].numpy()  # (48, 32)
    q8 = quantize(w, gguf.GGMLQuantizationType.Q8_0)
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_tensor("extra.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("plain.weight", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    assert reader.endianess == gguf.GGUFEndian.BIG
    assert torch.equal(gguf_tensor(reader, "plain.weight"), torch.from_numpy(w))
    with pytest.raises(ValueError, match="'extra.weight' is Q8_0.*byte order"):
        gguf_tensor(reader, "extra.weight")


@param(
    "meta, match",
    [
        ({"llama.attention.clamp_kqv": (8.0, _F)}, "'llama.attention.clamp_kqv'"),
        (
            {"llama.rope.scaling.type": ("yarn", _S)},
            "'llama.rope.scaling.type' = 'yarn'",
        ),
        (
            {"llama.rope.scaling.attn_factor": (0.5, _F)},
            "'llama.rope.scaling.attn_factor'",
        ),
        ({"llama.rope.dimension_count": (4, _U)}, "'llama.rope.dimension_count' = 4"),
        ({"llama.attention.value_length": (16, _U)}, "'llama.attention.value_length'"),
        ({"llama.expert_count": (8, _U)}, "'llama.expert_count' must be 0"),
    ],
)
def test_gguf_key_that_would_change_the_model_is_refused_by_name(tmp_path, meta, match):
    from transformer_course.gguf_loader import llama_config_from_gguf

    ref = hf_llama()
    with pytest.raises(ValueError, match=match):
        llama_config_from_gguf(write_gguf(tmp_path / "a.gguf", ref, meta=meta))
    llama_config_from_gguf(write_gguf(tmp_path / "b.gguf", ref))  # known right


@param("key", ["llama.block_count", "llama.context_length", "llama.embedding_length"])
def test_gguf_without_a_required_key_names_it(tmp_path, key):
    from transformer_course.gguf_loader import llama_config_from_gguf

    reader = write_gguf(tmp_path / "a.gguf", hf_llama(), drop=(key,))
    with pytest.raises(ValueError, match=f"'{key}' is missing"):
        llama_config_from_gguf(reader)


def test_gguf_tensor_the_model_has_no_place_for_is_refused(tmp_path):
    ref = hf_llama()
    extra = {"blk.0.ffn_gate_exps.weight": torch.zeros(2, 48, 32).numpy()}
    reader = write_gguf(tmp_path / "a.gguf", ref, tensors=extra)
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate_exps\.weight'"):
        ours_from_gguf(reader)


def test_gguf_loader_refuses_a_model_whose_rope_differs_from_the_file(tmp_path):
    from dataclasses import replace

    from transformer_course.gguf_loader import llama_config_from_gguf, load_gguf_llama

    ref = hf_llama(**LLAMA3)
    tensors = {"rope_freqs.weight": rope_freqs_of(ref)}
    reader = write_gguf(tmp_path / "a.gguf", ref, tensors=tensors)
    cfg = llama_config_from_gguf(reader)
    for field, value in (("rope_freq_factors", None), ("rope_base", 500.0)):
        with pytest.raises(ValueError, match=field):
            load_gguf_llama(DecoderOnlyLM(replace(cfg, **{field: value})), reader)
    load_gguf_llama(DecoderOnlyLM(cfg), reader)  # known right


def test_rope_freq_factors_divide_the_frequencies_in_every_path(tiny_config):
    """The factors the loaders set reach the rotary table (float32) and the float64
    path alike, and bad ones are refused by name."""
    from transformer_course.positional import RotaryEmbedding, apply_rotary

    factors = (1.0, 2.0, 8.0, 8.0)
    rot = RotaryEmbedding(8, freq_factors=factors)
    q, pos = torch.randn(1, 2, 5, 8, dtype=torch.float64), torch.arange(5)
    slow = rot(q, q)[0]  # float64: apply_rotary itself
    fast = rot(q.float(), q.float())[0]  # the float32 table
    assert torch.allclose(fast.double(), slow, atol=1e-6)
    assert torch.allclose(apply_rotary(q, pos, freq_factors=factors), slow)
    plain = apply_rotary(q, pos)
    assert not torch.allclose(plain, slow)
    assert torch.allclose(apply_rotary(q, pos, freq_factors=(1.0,) * 4), plain)
    with pytest.raises(ValueError, match="freq_factors"):
        RotaryEmbedding(8, freq_factors=(1.0, 2.0))
    for bad in ((1.0, 2.0), (1.0, 0.0, 1.0, 1.0), (1.0, float("nan"), 1.0, 1.0)):
        with pytest.raises(ValueError, match="rope_freq_factors"):
            tiny_config(positional="rope", rope_freq_factors=bad)
    assert tiny_config(rope_freq_factors=[1, 2, 4, 8]).rope_freq_factors == (1, 2, 4, 8)


#: A changed value for every key of GGUF_LLAMA_KEYS (one key for each "prefix.*"),
#: and what the loader must do with it.
GGUF_CHANGES = {
    "general.architecture": ("gemma", "refused"),
    "general.*": ("general.name", "another name", "skipped"),
    "GGUF.*": ("GGUF.kv_count", 99, "skipped"),
    "tokenizer.*": ("tokenizer.ggml.model", "gpt2", "skipped"),
    "llama.vocab_size": (67, "read"),
    "llama.context_length": (128, "read"),
    "llama.embedding_length": (64, "read"),
    "llama.block_count": (3, "read"),
    "llama.feed_forward_length": (50, "read"),
    "llama.attention.head_count": (8, "read"),
    "llama.attention.head_count_kv": (4, "read"),
    "llama.attention.key_length": (16, "read"),
    "llama.attention.value_length": (16, "refused"),  # not the head size 8
    "llama.rope.dimension_count": (4, "refused"),  # partial RoPE
    "llama.attention.layer_norm_rms_epsilon": (1e-3, "read"),
    "llama.rope.freq_base": (500.0, "read"),
    "llama.rope.scaling.type": ("yarn", "refused"),
    "llama.rope.scaling.factor": (4.0, "read"),  # the type's default is linear
    "llama.rope.scale_linear": (4.0, "read"),
    "llama.rope.scaling.original_context_length": (99, "skipped"),
    "llama.rope.scaling.finetuned": (True, "skipped"),
    "llama.expert_count": (8, "refused"),
    "llama.expert_used_count": (2, "refused"),
}


def test_every_gguf_key_is_read_skipped_or_refused_as_its_table_says(tmp_path):
    from types import SimpleNamespace

    from transformer_course.gguf_loader import GGUF_LLAMA_KEYS, llama_config_from_gguf

    assert set(GGUF_CHANGES) == set(GGUF_LLAMA_KEYS)  # a new key gets a test here
    drop = ("llama.attention.value_length", "llama.rope.dimension_count")
    reader = write_gguf(tmp_path / "a.gguf", hf_llama(), drop=drop)  # both optional

    def changed(key, value):
        fields = {**reader.fields, key: _Field(value)}
        return SimpleNamespace(fields=fields, tensors=reader.tensors, byte_order="I")

    base = llama_config_from_gguf(changed("general.architecture", "llama"))
    for entry, change in GGUF_CHANGES.items():
        key, value, outcome = change if entry.endswith(".*") else (entry, *change)
        if outcome == "refused":
            with pytest.raises(ValueError, match=f"{key}"):
                llama_config_from_gguf(changed(key, value))
        else:
            cfg = llama_config_from_gguf(changed(key, value))
            assert (cfg != base) == (outcome == "read"), key
    with pytest.raises(ValueError, match="'llama.attention.clamp_kqv'"):
        llama_config_from_gguf(changed("llama.attention.clamp_kqv", 8.0))  # unknown


def test_a_tied_model_refuses_a_checkpoint_with_an_output_projection_of_its_own(
    tmp_path,
):
    from dataclasses import replace

    from transformer_course.gguf_loader import llama_config_from_gguf, load_gguf_llama

    ref = hf_llama(tie_word_embeddings=False)
    tied = replace(llama_config_from_hf(ref.config), tie_embeddings=True)
    with pytest.raises(ValueError, match="'lm_head.weight' differs"):
        load_hf_llama(DecoderOnlyLM(tied), ref.state_dict())
    reader = write_gguf(tmp_path / "a.gguf", ref)
    cfg = llama_config_from_gguf(reader)
    with pytest.raises(ValueError, match="tie_embeddings"):
        load_gguf_llama(DecoderOnlyLM(replace(cfg, tie_embeddings=True)), reader)
    tied_ref = hf_llama()  # known right: a tied checkpoint (lm_head is the embedding)
    assert "lm_head.weight" in tied_ref.state_dict()
    load_hf_llama(
        DecoderOnlyLM(llama_config_from_hf(tied_ref.config)), tied_ref.state_dict()
    )
