"""Chapter 3's live view runs the real all-MiniLM-L6-v2: its exported graph's hidden states,
attention weights and scores equal the library's PyTorch encoder within 1e-4 on sentences
of lengths the export never traced (about 5 s: a 90 MB export)."""

import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from transformer_course import export as E
from transformer_course.pretrained import load_minilm_encoder, tokenize

SENTENCES = [
    "Attention is all you need.",
    "Héllo wörld, 你好 🙂: the reader's own sentence, typed in the page!",
]


def test_real_minilm_graph_equals_pytorch(tmp_path):
    model = load_minilm_encoder()
    exported = E.export_minilm(model, None, tmp_path)
    graph = ort.InferenceSession(str(exported.files["encoder"]))
    traced = len(tokenize(exported.config["example"])[1])
    for sentence in SENTENCES:
        ids, tokens = tokenize(sentence)
        assert len(tokens) != traced
        hidden, weights, scores = graph.run(None, {"input_ids": ids.numpy()})
        with torch.no_grad():
            out = model(ids)
        assert (torch.as_tensor(hidden) - out.hidden_states).abs().max() < 1e-4
        assert (torch.as_tensor(weights) - out.attentions[:, 0]).abs().max() < 1e-4
        softmax = torch.as_tensor(scores).softmax(-1)
        assert (softmax - out.attentions[:, 0]).abs().max() < 1e-4
    other = load_minilm_encoder()  # known wrong: one head's query weights changed
    with torch.no_grad():
        other.layers[0].self_attn.q_proj.weight[:32] *= 2
        theirs = other(ids).attentions[0, 0, 0]
    assert (torch.as_tensor(weights[0, 0]) - theirs).abs().max() > 1e-3
