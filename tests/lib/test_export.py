"""The live views' ONNX graphs (``transformer_course.export``) compute what the library's
PyTorch modules compute: onnxruntime's outputs, attention weights and pre-softmax scores
equal PyTorch's within 1e-4 on lengths the export never traced; and the live-view markup
(``viz.live``) carries its kind, its config and the pre-rendered fallback.

Small random-weight models (built from the library's configs) keep the tier fast; the real
MiniLM weights are checked in tests/slow/test_export_minilm.py."""

import html.parser
import json
import math

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from transformer_course import export as E
from transformer_course.data import BOS_ID
from transformer_course.model import TransformerConfig, make_model
from transformer_course.pretrained import (
    MiniLMEncoder,
    load_minilm_config,
    load_minilm_tokenizer,
)
from transformer_course.translation_data import make_translation_data
from transformer_course.viz.live import live_view, live_view_html, live_view_of

TOL = 1e-4


@pytest.fixture(scope="module")
def data():
    return make_translation_data(3000, tgt_vocab_size=60)


def small_translator(data, seed=0, **kw):
    cfg = TransformerConfig(
        src_vocab_size=data.src_tok.vocab_size,
        tgt_vocab_size=data.tgt_tok.vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_layers=2,
        dropout=0.0,
        max_len=32,
        **kw,
    )
    torch.manual_seed(seed)
    return make_model(cfg).eval()


@pytest.fixture(scope="module")
def translator(data, tmp_path_factory):
    model = small_translator(data)
    return model, E.export_translator(model, data, tmp_path_factory.mktemp("live"))


def small_minilm(seed=0):
    cfg = dict(load_minilm_config(), d_model=32, n_heads=4, d_k=8, d_ff=64, n_layers=2)
    torch.manual_seed(seed)
    model = MiniLMEncoder(cfg)
    with torch.no_grad():  # LayerNorms off their identity start, so they are tested too
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    model = small_minilm()
    return model, E.export_minilm(model, None, tmp_path_factory.mktemp("live"))


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


class Inputs:
    """The (query, key) each attention module of ``model`` was last called with."""

    def __init__(self, model):
        self.seen = {}
        for mod in model.modules():
            if type(mod).__name__ == "MultiHeadAttention":
                mod.register_forward_pre_hook(self._keep)

    def _keep(self, mod, args):
        self.seen[mod] = (args[0], args[1])

    def scores(self, mod):
        """q.k/sqrt(d_k) (H, T, S) written out again: per head h, the rows h*d_k:(h+1)*d_k
        of W^Q and W^K (the paper's W^Q_h, W^K_h)."""
        query, key = self.seen[mod]
        d_k = mod.d_k
        q = (query[0] @ mod.q_proj.weight.T + mod.q_proj.bias).unflatten(-1, (-1, d_k))
        k = (key[0] @ mod.k_proj.weight.T + mod.k_proj.bias).unflatten(-1, (-1, d_k))
        return torch.einsum("thd,shd->hts", q, k) / math.sqrt(d_k)


def close(name, ours, theirs):
    diff = (torch.as_tensor(ours) - theirs).abs().max().item()
    assert diff <= TOL, f"{name}: max difference {diff:.2e} > {TOL}"


def texts_of_unseen_lengths(data, traced: int, n: int = 4) -> list[str]:
    """Test texts whose token counts differ from the traced one and from each other."""
    out, lengths = [], {traced}
    for text in data.src_texts["test"]:
        length = len(data.src_tok.encode(text))
        if length not in lengths:
            out.append(text)
            lengths.add(length)
        if len(out) == n:
            break
    return [*out, "five"]  # and one token


def test_translator_graphs_equal_pytorch_on_unseen_lengths(data, translator):
    _, exported = translator
    ref = E.load_exported_translator(exported.folder)
    inputs = Inputs(ref)
    enc, dec = session(exported.files["encoder"]), session(exported.files["decoder"])
    traced = len(data.src_tok.encode(exported.config["example"]))
    texts = texts_of_unseen_lengths(data, traced)
    assert len({len(data.src_tok.encode(t)) for t in texts}) == len(texts)
    for i, text in enumerate(texts):
        src = torch.tensor([data.src_tok.encode(text)])
        memory, enc_w, enc_s = enc.run(None, {"src_ids": src.numpy()})
        with torch.no_grad():
            ref_memory, src_mask = ref.encode(src)
        close("memory", memory, ref_memory[0:1])
        layers = ref.encoder.layers
        close(
            "enc_attentions",
            enc_w,
            torch.stack([la.self_attn_weights[0] for la in layers]),
        )
        close(
            "enc_scores",
            enc_s,
            torch.stack([inputs.scores(la.self_attn) for la in layers]),
        )
        t_len = [1, 3, 9, 14, 20][i % 5]  # the trace had S + 2 target tokens
        tgt = torch.tensor([[BOS_ID, *torch.randint(4, 50, (t_len - 1,)).tolist()]])
        feeds = {"src_ids": src.numpy(), "memory": memory, "tgt_ids": tgt.numpy()}
        logits, self_w, self_s, cross_w, cross_s = dec.run(None, feeds)
        with torch.no_grad():
            ref_logits = ref.decode(tgt, ref_memory, src_mask)
        close("logits", logits, ref_logits)
        layers = ref.decoder.layers
        close(
            "self_attentions",
            self_w,
            torch.stack([la.self_attn_weights[0] for la in layers]),
        )
        close(
            "cross_attentions",
            cross_w,
            torch.stack([la.cross_attn_weights[0] for la in layers]),
        )
        close(
            "self_scores",
            self_s,
            torch.stack([inputs.scores(la.self_attn) for la in layers]),
        )
        close(
            "cross_scores",
            cross_s,
            torch.stack([inputs.scores(la.cross_attn) for la in layers]),
        )
        # the weights are the softmax of the scores (the causal mask on the self-attention)
        causal = torch.ones(t_len, t_len).tril().bool()
        masked = torch.as_tensor(self_s).masked_fill(~causal, float("-inf"))
        close("softmax(self_scores)", self_w, masked.softmax(-1))
        close("softmax(cross_scores)", cross_w, torch.as_tensor(cross_s).softmax(-1))


def test_the_exported_weights_are_the_models(data, translator):
    model, exported = translator
    ref = E.load_exported_translator(exported.folder)
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name


def test_a_model_with_other_weights_gives_other_numbers(data, translator):
    _, exported = translator
    other = small_translator(data, seed=1)  # known wrong: same config, other weights
    src = torch.tensor([data.src_tok.encode("seven hundred and eleven")])
    memory = session(exported.files["encoder"]).run(None, {"src_ids": src.numpy()})[0]
    with torch.no_grad():
        theirs = other.encode(src)[0]
    assert (torch.as_tensor(memory) - theirs).abs().max() > 100 * TOL


def test_graph_greedy_decoding_equals_pytorch(data, translator):
    from transformer_course.decoding import greedy_decode

    _, exported = translator
    ref = E.load_exported_translator(exported.folder)
    enc, dec = session(exported.files["encoder"]), session(exported.files["decoder"])
    cfg = exported.config
    for text in data.src_texts["test"][:3]:
        src = torch.tensor([data.src_tok.encode(text)])
        memory = enc.run(None, {"src_ids": src.numpy()})[0]
        out = [cfg["bos_id"]]
        while len(out) <= cfg["max_len"] and out[-1] != cfg["eos_id"]:
            feeds = {
                "src_ids": src.numpy(),
                "memory": memory,
                "tgt_ids": torch.tensor([out]).numpy(),
            }
            logits = dec.run(["logits"], feeds)[0][0, -1]
            logits[cfg["pad_id"]] = -float("inf")  # as greedy_decode: never padding
            out.append(int(logits.argmax()))
        ours = [t for t in out[1:] if t != cfg["eos_id"]]
        assert ours == greedy_decode(ref, src, cfg["max_len"])[0]


def test_translator_vocab_json_matches_the_python_tokenizers(data, translator):
    _, exported = translator
    vocab = json.loads(exported.files["vocab"].read_text("utf-8"))
    assert vocab["src"]["kind"] == "word" and vocab["tgt"]["kind"] == "bpe"
    assert vocab["src"]["tokens"] == data.src_tok.tokens(range(data.src_tok.vocab_size))
    assert vocab["tgt"]["tokens"] == data.tgt_tok.tokens(range(data.tgt_tok.vocab_size))
    assert len(vocab["examples"]) > 3
    for ex in vocab["examples"]:
        assert ex["ids"] == data.src_tok.encode(ex["text"])
    assert (vocab["bos_id"], vocab["eos_id"], vocab["pad_id"]) == (BOS_ID, 2, 0)


def test_minilm_graph_equals_pytorch_on_unseen_lengths(minilm):
    _, exported = minilm
    ref = E.load_exported_minilm(exported.folder)
    inputs = Inputs(ref)
    graph = session(exported.files["encoder"])
    tok = load_minilm_tokenizer()
    traced = len(tok.encode(exported.config["example"]).ids)
    sentences = [
        "Hi",
        "Attention, illustrated: the reader's own sentence!",
        "Héllo wörld, 你好 🙂 42 times over, with a much longer tail of words than before.",
    ]
    for sentence in sentences:
        ids = torch.tensor([tok.encode(sentence).ids])
        assert ids.shape[1] != traced
        hidden, weights, scores = graph.run(None, {"input_ids": ids.numpy()})
        with torch.no_grad():
            out = ref(ids)
        close("last_hidden_state", hidden, out.hidden_states)
        close("attentions", weights, out.attentions[:, 0])
        close(
            "scores",
            scores,
            torch.stack([inputs.scores(la.self_attn) for la in ref.layers]),
        )
        close("softmax(scores)", weights, torch.as_tensor(scores).softmax(-1))


def test_minilm_vocab_json_is_the_shipped_wordpiece(minilm):
    _, exported = minilm
    vocab = json.loads(exported.files["vocab"].read_text("utf-8"))
    tok = load_minilm_tokenizer()
    assert vocab["kind"] == "wordpiece" and len(vocab["vocab"]) == tok.get_vocab_size()
    assert all(tok.token_to_id(t) == i for i, t in enumerate(vocab["vocab"]))
    assert vocab["do_lower_case"] is True and vocab["continuing_subword_prefix"] == "##"
    assert {"content": "[CLS]", "id": 101} in vocab["added_tokens"]
    example = vocab["examples"][0]
    assert example["ids"] == tok.encode(example["text"]).ids
    assert exported.config["n_layers"] == 2 and exported.config["max_len"] == 128


def test_folders_are_named_by_the_files_hash(data, translator, tmp_path, monkeypatch):
    model, exported = translator
    monkeypatch.setenv(E.LIVE_DIR_ENV, str(tmp_path))
    assert E.live_dir() == tmp_path
    again = E.export_translator(model, data)  # the same files, into the env's folder
    assert again.folder.parent == tmp_path
    assert again.folder.name == exported.folder.name
    assert again.folder.name.startswith("translator-") and len(again.folder.name) == 27
    other = E.export_translator(small_translator(data, seed=2), data)
    assert other.folder.name != exported.folder.name
    assert sorted(p.name for p in again.folder.iterdir()) == [
        "config.json",
        "decoder.onnx",
        "encoder.onnx",
        "state_dict.pt",
        "vocab.json",
    ]
    assert set(again.sizes_mb()) == {"encoder", "decoder", "vocab"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_the_library_checks_are_back_after_an_export(data, translator):
    model, _ = translator
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.encode(torch.tensor([[10_000]]))


def test_bad_inputs_are_rejected_with_clear_messages(
    data, translator, minilm, tmp_path
):
    model, _ = translator
    encoder, _ = minilm
    with pytest.raises(TypeError, match="model: expected a model.Transformer"):
        E.export_translator(encoder, data, tmp_path)
    with pytest.raises(TypeError, match="encoder: expected a pretrained.MiniLMEncoder"):
        E.export_minilm(model, None, tmp_path)
    with pytest.raises(TypeError, match="data: expected a translation_data"):
        E.export_translator(model, object(), tmp_path)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        E.export_translator(model, data, tmp_path, example="forty-two apples")
    other = make_translation_data(3000, tgt_vocab_size=50)  # known wrong: its sizes
    with pytest.raises(ValueError, match="data.tgt_tok: expected 60 tokens"):
        E.export_translator(model, other, tmp_path)
    with pytest.raises(
        ValueError, match="tokenizer_or_path: expected a tokenizer.json"
    ):
        E.export_minilm(encoder, tmp_path / "nowhere", tmp_path)
    with pytest.raises(TypeError, match="module: expected a pretrained.MiniLMEncoder"):
        E.export(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="expected a translator export"):
        E.load_exported_translator(minilm[1].folder)
    rope = small_translator(data, positional="rope")
    with pytest.raises(ValueError, match="sinusoidal, learned or no positions"):
        E.export_translator(rope, data, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written by a rejected call


# ------------------------------------------------------------------------ the markup


class _Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.elements = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))


def parse(markup: str):
    parser = _Parser()
    parser.feed(markup)
    return parser.elements


LOOKUP = {
    "query": [1.0, 0.0],
    "keys": [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]],
    "values": [[1.0], [2.0], [3.0]],
    "key_labels": ["cat", "dog", "it's"],
    "scale": 1 / math.sqrt(2),
}


def test_live_view_markup_holds_kind_config_and_fallback():
    markup = live_view_html("lookup", LOOKUP, "<p class='old-view'>pre-rendered</p>")
    elements = parse(markup)
    tag, attrs = elements[0]
    assert tag == "div" and attrs["class"] == "live-view"
    assert attrs["data-live-kind"] == "lookup"
    assert (
        json.loads(attrs["data-live-config"]) == LOOKUP
    )  # quotes survive the attribute
    assert ("div", {"class": "live-fallback"}) in elements
    assert ("p", {"class": "old-view"}) in elements
    assert live_view("lookup", LOOKUP, "<p>x</p>").data == live_view_html(
        "lookup", LOOKUP, "<p>x</p>"
    )


def test_live_view_renders_a_figure_fallback_as_an_image():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title("old view")
    markup = live_view_html("lookup", LOOKUP, fig)
    plt.close(fig)
    assert any(
        tag == "img" and "old view" in a.get("alt", "") for tag, a in parse(markup)
    )


def test_live_view_rejects_bad_configs():
    with pytest.raises(ValueError, match="kind: expected one of"):
        live_view_html("gpt", LOOKUP, "")
    with pytest.raises(ValueError, match="missing \\['scale'\\]"):
        live_view_html("lookup", {k: v for k, v in LOOKUP.items() if k != "scale"}, "")
    with pytest.raises(ValueError, match="d_k = len\\(query\\) = 2"):
        live_view_html("lookup", dict(LOOKUP, keys=[[1.0], [0.0], [1.0]]), "")
    with pytest.raises(ValueError, match="one value per key"):
        live_view_html("lookup", dict(LOOKUP, values=[[1.0]]), "")
    with pytest.raises(ValueError, match="finite"):
        live_view_html("lookup", dict(LOOKUP, query=[float("nan"), 0.0]), "")
    with pytest.raises(TypeError, match="fallback: expected a matplotlib Figure"):
        live_view_html("lookup", LOOKUP, None)
    with pytest.raises(TypeError, match="config: expected a dict"):
        live_view_html("minilm", [1, 2], "")


def test_live_view_of_exports_and_points_at_the_files(
    data, translator, tmp_path, monkeypatch
):
    model, _ = translator
    monkeypatch.delenv("TRANSFORMER_COURSE_STATIC", raising=False)
    widget = object()  # in a live kernel the fallback (a widget) comes back as it is
    assert live_view_of(model, data, widget, out_dir=tmp_path) is widget
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("TRANSFORMER_COURSE_STATIC", "1")  # the book build
    view = live_view_of(
        model, data, "<p>fallback</p>", out_dir=tmp_path, example="five"
    )
    attrs = parse(view.data)[0][1]
    config = json.loads(attrs["data-live-config"])
    assert attrs["data-live-kind"] == "translator" and config["example"] == "five"
    for key in ("encoder", "decoder", "vocab"):
        assert (tmp_path / config[key]).is_file()
