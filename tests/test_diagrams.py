"""Block diagrams traced from the real modules (viz.diagrams) and the drawn schematics
(viz.schematics): the boxes, arrows and shapes each known module gives, and what the
rendered SVG carries to the page (alt text, unique ids, readable text)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from transformer_course.attention import MultiHeadAttention
from transformer_course.decoding import KVCache
from transformer_course.layers import TransformerLayer
from transformer_course.masks import causal_mask
from transformer_course.model import Transformer
from transformer_course.pretrained import MiniLMEncoder
from transformer_course.student import make_student
from transformer_course.vision import Captioner
from transformer_course.viz import style
from transformer_course.viz.diagrams import (
    diagram,
    side_by_side,
    teacher_student_diagram,
)
from transformer_course.viz.schematics import (
    course_map,
    kv_cache_diagram,
    tile_schedule,
    tiles_diagram,
)

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="Graphviz's dot is missing: tools/ensure_graphviz.sh",
)
X = torch.randn(1, 5, 32)


def mha_diagram(**kw):
    return diagram(MultiHeadAttention(32, 4, **kw), X, X, X, causal_mask(5))


def tiny_minilm(n_layers=3):
    cfg = {
        "d_model": 32,
        "n_heads": 4,
        "d_k": 8,
        "d_ff": 64,
        "n_layers": n_layers,
        "vocab_size": 50,
        "max_len": 16,
        "layer_norm_eps": 1e-12,
        "pad_id": 0,
    }
    return MiniLMEncoder(cfg)


def edges(d):
    return set(d.edge_labels())


# -- module graphs -------------------------------------------------------------------


def test_mha_diagram_projects_splits_attends_and_merges():
    d = mha_diagram()
    assert d.boxes("input") == ["query = key = value"]
    assert d.boxes("box") == [
        "q_proj: Linear 32\u219232", "split heads",
        "k_proj: Linear 32\u219232", "split heads",
        "v_proj: Linear 32\u219232", "split heads",
        "scaled dot-product attention", "merge heads", "out_proj: Linear 32\u219232",
    ]  # fmt: skip
    e = edges(d)
    assert ("split heads", "scaled dot-product attention", (1, 4, 5, 8)) in e
    assert ("merge heads", "out_proj: Linear 32\u219232", (1, 5, 32)) in e
    assert ("out_proj: Linear 32\u219232", "output", (1, 5, 32)) in e
    roles = [n.role for n in d.nodes if n.label == "split heads"]
    assert roles == ["query", "key", "value"]  # Q, K and V keep their colours


def test_mask_box_feeds_the_attention_it_masks():
    d = mha_diagram()
    assert d.boxes("mask") == ["mask"]
    assert ("mask", "scaled dot-product attention", (5, 5)) in edges(d)
    unmasked = diagram(MultiHeadAttention(32, 4), X, X, X)
    assert unmasked.boxes("mask") == []  # known-wrong input: nothing to draw


def test_grouped_query_diagram_repeats_the_kv_heads():
    d = mha_diagram(n_kv_heads=2)
    assert "k_proj: Linear 32\u219216" in d.boxes()
    assert d.boxes().count("repeat K/V heads") == 2
    assert "repeat K/V heads" not in mha_diagram().boxes()  # n_rep = 1: not drawn


def test_layer_residuals_follow_the_code():
    d = diagram(TransformerLayer(32, 4, 64), X)
    assert d.boxes("box") == [
        "self_attn_norm: LayerNorm", "self_attn: multi-head attention H=4",
        "ff_norm: LayerNorm", "ff: feed-forward 32\u219264",
    ]  # fmt: skip
    assert d.boxes("op") == ["+", "+"]
    assert sum(e.residual for e in d.edges) == 2

    class NoResidual(nn.Module):  # known-wrong: a layer that forgot its skip paths
        def __init__(self):
            super().__init__()
            self.norm, self.ff = nn.LayerNorm(32), nn.Linear(32, 32)

        def forward(self, x):
            return self.ff(self.norm(x))

    assert sum(e.residual for e in diagram(NoResidual(), X).edges) == 0


def test_post_ln_layer_adds_before_it_normalises():
    d = diagram(TransformerLayer(32, 4, 64, norm_first=False), X)
    labels = [n.label for n in d.nodes]
    assert labels.index("+") < labels.index("self_attn_norm: LayerNorm")
    pre = [n.label for n in diagram(TransformerLayer(32, 4, 64), X).nodes]
    assert pre.index("+") > pre.index("self_attn_norm: LayerNorm")


def test_transformer_diagram_groups_encoder_decoder_and_masks(tiny_config):
    model = Transformer(tiny_config(n_layers=2))
    src, tgt = torch.randint(1, 20, (1, 7)), torch.randint(1, 12, (1, 6))
    d = diagram(model, src, tgt)
    assert [c.label for c in d.clusters] == [
        "encoder: Encoder", "embed: InputEmbedding", "TransformerLayer \u00d7 2",
        "decoder: Decoder", "embed: InputEmbedding", "TransformerLayer \u00d7 2",
    ]  # fmt: skip
    assert d.boxes("mask") == ["src_mask (bool)", "tgt_mask (bool)"]
    e = edges(d)
    cross = "cross_attn: multi-head attention H=4"
    assert ("norm: LayerNorm", cross, (1, 7, 32)) in e  # memory into cross-attention
    assert ("src_mask (bool)", cross, (1, 1, 1, 7)) in e
    assert ("tgt_mask (bool)", "self_attn: multi-head attention H=4", (1, 1, 6, 6)) in e
    assert d.boxes().count("positions: sinusoidal positions") == 2
    assert ("out: Linear 32\u219212", "output", (1, 6, 12)) in e
    every = diagram(model, src, tgt, repeat=False)  # all layers drawn
    assert every.boxes().count("self_attn: multi-head attention H=4") == 4


def test_positions_enter_where_the_config_says(tiny_config):
    src, tgt = torch.randint(1, 20, (1, 4)), torch.randint(1, 12, (1, 3))
    learned = diagram(Transformer(tiny_config(positional="learned")), src, tgt)
    assert "positions: learned positions" in learned.boxes()
    rope = diagram(Transformer(tiny_config(positional="rope")), src, tgt)
    assert not [b for b in rope.boxes() if b.startswith("positions")]


def test_captioner_cross_attends_to_the_patches(tiny_config):
    model = Captioner(tiny_config(n_layers=1), (8, 24), 4)
    d = diagram(model, torch.rand(1, 8, 24), torch.randint(1, 12, (1, 5)))
    assert "patches: patches + positions" in d.boxes()
    n_patches = (8 // 4) * (24 // 4)
    cross = "cross_attn: multi-head attention H=4"
    assert ("norm: LayerNorm", cross, (1, n_patches, 32)) in edges(d)
    expanded = diagram(
        model, torch.rand(1, 8, 24), torch.randint(1, 12, (1, 5)),
        expand=("encoder.patches",)
    )  # fmt: skip
    assert "patchify" in expanded.boxes()


def test_teacher_and_student_side_by_side():
    teacher = tiny_minilm(3)
    student = make_student(teacher, n_layers=2)
    d = teacher_student_diagram(teacher, student, torch.randint(1, 50, (1, 6)))
    tops = [c.label for c in d.clusters if c.parent is None]
    assert tops == ["teacher: 3 layers", "student: 2 layers"]
    assert (
        "TransformerLayer \u00d7 3" in d.boxes()
        and "TransformerLayer \u00d7 2" in d.boxes()
    )
    assert d.boxes().count("key_mask (bool)") == 2
    with pytest.raises(ValueError, match="labels: expected 2 labels, got 1"):
        side_by_side([d, d], ["one"], title="x")


def test_diagram_rejects_bad_arguments():
    with pytest.raises(TypeError, match="module: expected a torch.nn.Module, got str"):
        diagram("MultiHeadAttention", X)
    with pytest.raises(ValueError, match="rankdir: expected 'TB' or 'LR', got 'BT'"):
        diagram(MultiHeadAttention(32, 4), X, X, X, rankdir="BT")


def test_tracing_leaves_the_module_as_it_was():
    mha = MultiHeadAttention(32, 4).train()
    before = sys.getprofile()
    diagram(mha, X, X, X)
    assert mha.training and sys.getprofile() is before
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in mha.modules())


def test_core_modules_do_not_import_viz():
    code = (
        "import sys, transformer_course.model, transformer_course.attention, "
        "transformer_course.layers, transformer_course.vision; "
        "bad = {'graphviz', 'matplotlib', 'IPython'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- schematics ----------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_tile_schedule_is_what_tiled_attention_computes(causal):
    tiles = tile_schedule(10, 10, block_q=4, block_k=4, causal=causal)
    expected = [
        (q0, min(q0 + 4, 10), k0, min(k0 + 4, 10))
        for q0 in range(0, 10, 4)
        for k0 in range(0, 10, 4)
        if not causal
        or k0 < min(q0 + 4, 10)  # key block starts at or before the row end
    ]
    assert tiles == expected
    d = tiles_diagram(10, 10, block_q=4, block_k=4, causal=causal)
    assert d.parts == expected
    assert ("3 tiles above the causal diagonal skipped" in d.alt_text) is causal


def test_kv_cache_diagram_reads_the_caches():
    caches = []
    for _ in range(2):
        c = KVCache()
        c.update(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))
        c.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        caches.append(c)
    d = kv_cache_diagram(caches)
    assert d.parts == [(0, "K", 6), (0, "V", 6), (1, "K", 6), (1, "V", 6)]
    kib = 2 * 2 * 1 * 2 * 6 * 8 * 4 / 1024
    assert f"{kib:.1f} KiB" in d.alt_text
    with pytest.raises(ValueError, match="caches: expected at least one"):
        kv_cache_diagram([])
    with pytest.raises(TypeError, match=r"caches\[0\]: expected a filled KVCache"):
        kv_cache_diagram([KVCache()])
    with pytest.raises(ValueError, match="new_tokens: expected at most S = 6, got 7"):
        kv_cache_diagram(caches, new_tokens=7)


def test_course_map_lists_chapters_and_rejects_unknown_ones():
    d = course_map({"1": "Q, K, V", "2": "Scaled"}, [("1", "2")])
    assert d.parts == ["1. Q, K, V", "2. Scaled"]
    assert "2. Scaled (builds on 1)" in d.alt_text
    with pytest.raises(ValueError, match="builds_on: expected one of"):
        course_map({"1": "Q, K, V"}, [("1", "9")])


# -- rendering -----------------------------------------------------------------------


def all_pictures():
    model_x = torch.randint(1, 20, (1, 7)), torch.randint(1, 12, (1, 6))
    from transformer_course.model import TransformerConfig

    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=12, d_model=32,
                            n_heads=4, d_ff=64, dropout=0.0, max_len=16)  # fmt: skip
    teacher = tiny_minilm(3)
    cache = KVCache()
    cache.update(torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8))
    return {
        "mha": mha_diagram(),
        "layer": diagram(TransformerLayer(32, 4, 64), X),
        "transformer": diagram(Transformer(cfg), *model_x),
        "captioner": diagram(
            Captioner(cfg, (8, 24), 4), torch.rand(1, 8, 24), model_x[1]
        ),
        "teacher_student": teacher_student_diagram(
            teacher, make_student(teacher), torch.randint(1, 50, (1, 6))
        ),
        "kv_cache": kv_cache_diagram([cache, cache]),
        "tiles": tiles_diagram(16, 16, block_q=4, block_k=4, causal=True),
    }


@needs_dot
def test_every_picture_renders_readable_svg_with_alt_text():
    for name, picture in all_pictures().items():
        svg = picture.svg()
        assert svg.startswith('<svg role="img" aria-label="'), name
        assert "<?xml" not in svg and svg.count("<title>") == 1, name
        assert picture.min_text_px() >= style.MIN_TEXT_PX, (name, picture.min_text_px())
        html = picture._repr_html_()
        assert html.startswith('<figure class="tc-diagram" data-min-text-px="'), name


@needs_dot
def test_alt_text_lists_every_box_and_ids_are_unique_per_picture():
    d = mha_diagram()
    for label in d.boxes("box"):
        assert label in d.alt_text
    a, b = mha_diagram().svg(), mha_diagram().svg()
    ids_a, ids_b = (set(re.findall(r'id="([^"]+)"', svg)) for svg in (a, b))
    assert ids_a and not ids_a & ids_b


@needs_dot
def test_qkv_colours_are_the_book_colours():
    svg = mha_diagram().svg()
    for role in ("query", "key", "value"):
        assert style.ROLE_COLORS[role].lower() in svg.lower()


def test_smallest_text_px_catches_a_too_wide_svg():
    from transformer_course.viz.graph_render import svg_min_text_px

    narrow = '<svg width="300pt" height="10pt"><text font-size="10.00">a</text></svg>'
    wide = '<svg width="1200pt" height="10pt"><text font-size="10.00">a</text></svg>'
    assert svg_min_text_px(narrow) == pytest.approx(10 * 4 / 3)
    assert svg_min_text_px(wide) < style.MIN_TEXT_PX  # known-wrong: scaled to 5.7 px


def test_expanding_the_attention_function_shows_its_steps():
    from transformer_course.attention import scaled_dot_product_attention

    mha = MultiHeadAttention(32, 1)
    d = diagram(mha, X, X, X, causal_mask(5), expand=(scaled_dot_product_attention,))
    steps = d.boxes()[d.boxes().index("matmul") :][:4]
    assert steps == ["matmul", f"\u00d7 {32**-0.5:.3g}", "softmax (masked)", "matmul"]
    assert [c.label for c in d.clusters] == ["scaled dot-product attention"]
    assert "matmul" not in mha_diagram().boxes()  # not expanded: one box
