"""The MiniLM encoder built from this library's MultiHeadAttention equals Hugging Face's
BertModel (eager attention) with the same real weights, offline."""

import os

import pytest
import torch

from transformer_course import pretrained as P

os.environ.setdefault("HF_HUB_OFFLINE", "1")


transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf():
    model = transformers.BertModel.from_pretrained(
        str(P.minilm_dir()), attn_implementation="eager"
    )
    return model.eval()


slow = pytest.mark.slow


CHAT_PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def smol():
    pytest.importorskip("gguf")
    return P.load_smollm2()


@pytest.fixture(scope="module")
def smol_tokenizer():
    from transformer_course.chat import gguf_tokenizer

    return gguf_tokenizer(P.smollm2_reader())


@pytest.fixture(scope="module")
def hf_smol():
    pytest.importorskip("accelerate")
    path = P.smollm2_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def chat_ids(smol_tokenizer):
    from transformer_course.chat import encode_chats

    return encode_chats(smol_tokenizer, [CHAT_PROMPT])[0]  # (1, T)


TEXTS = [
    "What is the capital of France?",
    "  Attention, illustrated:\n\tqueries, keys & values!",
    "naïve café — déjà vu 😀",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
]


@slow
def test_smollm2_config_is_read_from_the_gguf_metadata(smol):
    cfg = smol.cfg
    sizes = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_k, cfg.d_ff)
    assert sizes == (30, 576, 9, 3, 64, 1536)
    assert (cfg.tgt_vocab_size, cfg.rope_base, cfg.tie_embeddings) == (49152, 1e5, True)
    assert (cfg.norm, cfg.activation, cfg.rope_layout) == (
        "rms",
        "swiglu",
        "interleaved",
    )


@slow
def test_smollm2_logits_match_transformers(smol, hf_smol, chat_ids):
    with torch.no_grad():
        expected = hf_smol(chat_ids).logits
        got = smol(chat_ids)
    assert (got - expected).abs().max() < 1e-4


@slow
def test_smollm2_half_layout_is_refused_and_would_be_wrong(smol, chat_ids):
    from dataclasses import replace

    from transformer_course.interop import load_gguf_llama
    from transformer_course.model import DecoderOnlyLM

    wrong = DecoderOnlyLM(replace(smol.cfg, rope_layout="half")).eval()
    with pytest.raises(ValueError, match="interleaved"):
        load_gguf_llama(wrong, P.smollm2_reader())
    wrong.load_state_dict(smol.state_dict())  # the same weights, pairs taken wrongly
    with torch.no_grad():
        assert (wrong(chat_ids) - smol(chat_ids)).abs().max() > 1.0


@slow
def test_smollm2_greedy_generation_matches_transformers(smol, hf_smol, smol_tokenizer):
    from transformer_course.chat import encode_chats
    from transformer_course.decoding import generate

    ids = encode_chats(smol_tokenizer, ["Explain attention in transformers."])[0]
    expected = hf_smol.generate(  # no stop token on either side: all 32 are compared
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=32,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    got = generate(smol, ids, 32)
    assert got.shape == (1, ids.shape[1] + 32)
    assert got.tolist() == expected.tolist()


@slow
def test_smollm2_answers_the_chat_prompt(smol, smol_tokenizer):
    from transformer_course.chat import chat

    assert (
        chat(smol, smol_tokenizer, CHAT_PROMPT, 24) == "The capital of France is Paris."
    )


@slow
def test_smollm2_kv_cache_equals_no_cache(smol, chat_ids):
    from transformer_course.decoding import new_caches

    caches = new_caches(smol)
    with torch.no_grad():
        full = smol(chat_ids)
        T = chat_ids.shape[1]
        first = smol(chat_ids[:, : T - 3], caches=caches)
        rest = [smol(chat_ids[:, t : t + 1], caches=caches) for t in range(T - 3, T)]
    assert (torch.cat([first, *rest], dim=1) - full).abs().max() < 1e-4


@slow
def test_smollm2_tokenizer_matches_transformers(smol_tokenizer):
    path = P.smollm2_path()
    hf = transformers.AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name
    )
    for text in TEXTS:
        ids = smol_tokenizer.encode(text).ids
        assert ids == hf(text, add_special_tokens=False)["input_ids"], text
        assert smol_tokenizer.decode(ids, skip_special_tokens=False) == text
    # digits one by one, as llama.cpp's "smollm" pre-tokenizer splits them
    assert len(smol_tokenizer.encode("2026").ids) == 4


@slow
def test_chat_template_equals_the_files_jinja_template():
    import jinja2

    from transformer_course.chat import apply_chat_template

    template = P.smollm2_reader().fields["tokenizer.chat_template"].contents()
    for messages in (
        [{"role": "user", "content": CHAT_PROMPT}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ):
        want = jinja2.Template(template).render(
            messages=messages, add_generation_prompt=True
        )
        assert apply_chat_template(messages) == want
    assert apply_chat_template([{"role": "user", "content": "Hi"}]).count("system") == 1


@slow
def test_q4_1_reader_matches_gguf_on_a_real_tensor():
    from gguf.quants import dequantize

    from transformer_course.quantize import dequantize_q4_1, quantize_q4_1

    t = next(t for t in P.smollm2_reader().tensors if t.name == "blk.3.ffn_down.weight")
    raw = torch.from_numpy(t.data.copy())
    mine = dequantize_q4_1(raw)
    assert torch.equal(mine, torch.from_numpy(dequantize(t.data, t.tensor_type)))
    assert torch.equal(quantize_q4_1(mine), raw)  # llama.cpp's own rounding
