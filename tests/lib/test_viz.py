"""viz: the book style (role colours, text no smaller than 10 px on the page), the
block diagrams drawn from a module and one forward pass, schematics, and the alt text
of every figure, animation and interactive view."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.animation import FuncAnimation
from matplotlib.figure import Figure
from torch import nn

from transformer_course.attention import MultiHeadAttention
from transformer_course.decoding import KVCache
from transformer_course.layers import TransformerLayer
from transformer_course.masks import causal_mask
from transformer_course.model import Transformer
from transformer_course.pretrained import MiniLMEncoder
from transformer_course.student import make_student
from transformer_course.vision import Captioner
from transformer_course.viz import (
    alt_text,
    animation_html,
    query_scan_animation,
    set_alt_text,
    style,
)
from transformer_course.viz.diagrams import (
    diagram,
    side_by_side,
    teacher_student_diagram,
)
from transformer_course.viz.interactive import static_html
from transformer_course.viz.plots import (
    attention_grid,
    attention_heatmap,
    describe_figure,
    figure_html,
    register_alt_text_display,
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


def all_pictures(tiny_config):
    model_x = torch.randint(1, 20, (1, 7)), torch.randint(1, 12, (1, 6))
    cfg = tiny_config()
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


def labelled_figure(title="Scores", xlabel="key", ylabel="query"):
    fig, ax = plt.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    plt.close(fig)
    return fig


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


@needs_dot
def test_every_picture_renders_readable_svg_with_alt_text(tiny_config):
    for name, picture in all_pictures(tiny_config).items():
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


def test_on_page_px_is_the_documented_formula():
    # 10 pt in a 9.5 in figure at 100 dpi: 950 px scaled to 684 px
    assert style.on_page_px(10, 9.5, 100) == pytest.approx(10 * 100 / 72 * 684 / 950)
    # narrower than the column: shown at its own size, not enlarged
    assert style.on_page_px(10, 4, 100) == pytest.approx(10 * 100 / 72)
    assert style.on_page_px(6, 19.2, 100) < style.MIN_TEXT_PX  # the old 12-head grid


def test_on_page_px_rejects_non_positive_sizes():
    with pytest.raises(ValueError, match="width_in: expected a positive number, got 0"):
        style.on_page_px(10, 0)


def test_fit_width_keeps_the_aspect_and_the_column():
    assert style.fit_width((4.0, 3.0)) == (4.0, 3.0)
    w, h = style.fit_width((19.0, 4.0))
    assert w == style.MAX_WIDTH_IN and h == pytest.approx(4.0 * w / 19.0)
    assert style.on_page_px(style.FONT_PT["small"], w) >= style.MIN_TEXT_PX


def test_role_colours_distinct_and_unknown_role_named():
    qkv = [style.role_color(r) for r in ("query", "key", "value")]
    assert len(set(qkv)) == 3
    with pytest.raises(ValueError, match="role: expected one of .* got 'queries'"):
        style.role_color("queries")


def test_importing_viz_applies_the_book_style():
    mpl.rcParams["font.size"] = 6  # someone else's default
    style.use_book_style()
    assert mpl.rcParams["font.size"] == style.FONT_PT["base"]
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    assert colors[:3] == [style.ROLE_COLORS[r] for r in ("query", "key", "value")]


def test_smallest_text_px_catches_tiny_text():
    fig, ax = plt.subplots(figsize=(19.2, 3))
    ax.set_title("tiny", fontsize=6)
    plt.close(fig)
    assert style.smallest_text_px(fig) < style.MIN_TEXT_PX  # known-wrong figure
    with pytest.raises(TypeError, match="fig: expected a matplotlib Figure, got str"):
        style.smallest_text_pt("figure")


def test_attention_grid_text_is_readable_with_twelve_heads():
    w = torch.softmax(torch.randn(2, 12, 6, 6), -1)
    fig = attention_grid(w, tokens=list("abcdef"))
    assert fig.get_size_inches()[0] <= style.MAX_WIDTH_IN
    assert style.smallest_text_px(fig) >= style.MIN_TEXT_PX


def test_annotated_heatmap_text_is_readable():
    fig = attention_heatmap(torch.softmax(torch.randn(5, 5), -1), annotate=True)
    assert style.smallest_text_px(fig) >= style.MIN_TEXT_PX


def test_figure_html_carries_its_smallest_text():
    fig = attention_heatmap(torch.softmax(torch.randn(3, 3), -1))
    html = figure_html(fig)
    assert 'class="tc-figure"' in html
    px = float(html.split('data-min-text-px="')[1].split('"')[0])
    assert px == pytest.approx(style.smallest_text_px(fig), abs=0.05)


def test_heatmap_and_grid_describe_what_they_show():
    fig = attention_heatmap(
        torch.full((2, 3), 1 / 3), ["a", "b", "c"], ["x", "y"], title="W"
    )
    text = alt_text(fig)
    assert text.startswith("W: heatmap of attention weights")
    assert "2 queries (x, y)" in text and "3 keys (a, b, c)" in text
    grid = attention_grid(torch.full((2, 4, 3, 3), 1 / 3))
    assert "grid of 2 by 4 attention weight maps" in alt_text(grid)


def test_describe_figure_uses_titles_and_axis_labels():
    assert describe_figure(labelled_figure()) == "Figure: Scores, x: key, y: query"
    bare, _ = plt.subplots()
    plt.close(bare)
    assert describe_figure(bare) == "Figure with 1 panel(s)"  # nothing stated: generic


def test_set_alt_text_wins_and_rejects_empty_text():
    fig = set_alt_text(labelled_figure(), "Two bars")
    assert alt_text(fig) == "Two bars"
    with pytest.raises(TypeError, match="text"):
        set_alt_text(fig, "  ")
    with pytest.raises(TypeError, match="fig"):
        set_alt_text("not a figure", "x")


def test_animation_frame_has_alt_text_and_its_slider_a_label():
    fig = labelled_figure()
    ax = fig.axes[0]
    html = animation_html(
        FuncAnimation(fig, lambda i: ax.set_title(f"frame {i}"), frames=3)
    ).data
    (img,) = re.findall(r'<img id="_anim_img\w+"[^>]*>', html)
    assert 'alt="Animation. Figure: frame' in img
    assert re.search(
        r'<input id="_anim_slider\w+" type="range" class="anim-slider" '
        r'aria-label="Animation frame"',
        html,
    )
    html = query_scan_animation(torch.tensor([1.0, 0.0]), ["<a>", "b"]).data
    assert "scans the keys &lt;a&gt;, b" in html  # escaped


def test_interactive_view_is_described_by_its_first_figure_unless_told():
    def fn(title):
        return labelled_figure(title=title)

    html = static_html(fn, {"title": ["one", "two"]})
    assert re.search(r'<img class="tc-frame" alt="Figure: one, x: key, y: query"', html)
    html = static_html(fn, {"title": ["one"]}, alt="Given")
    assert '<img class="tc-frame" alt="Given"' in html


def test_book_build_shows_figures_as_img_with_alt(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert register_alt_text_display()
        fig = set_alt_text(labelled_figure(), "A described figure")
        monkeypatch.delenv("TRANSFORMER_COURSE_STATIC", raising=False)
        data, _ = shell.display_formatter.format(fig)
        assert "text/html" not in data  # a live kernel keeps the usual PNG
        monkeypatch.setenv("TRANSFORMER_COURSE_STATIC", "1")
        data, _ = shell.display_formatter.format(fig)
        assert data["text/html"].startswith('<img src="data:image/png;base64,')
        assert 'alt="A described figure"' in data["text/html"]
        # the inline backend drops every Figure formatter when it starts; the next cell
        # (pre_execute) and the figure display after a cell (post_execute) restore it
        for formatter in shell.display_formatter.formatters.values():
            formatter.pop(Figure, None)
        assert "text/html" not in shell.display_formatter.format(fig)[0]
        shell.events.trigger("post_execute")
        assert "text/html" in shell.display_formatter.format(fig)[0]
    finally:
        InteractiveShell.clear_instance()


def test_an_animation_is_laid_out_once(monkeypatch):
    """animation_html keeps the constrained layout of the first frame for all frames
    (solving it for every frame doubled the rendering time of the chapters' animations)."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    from transformer_course.viz import animation_html

    solved = []
    execute = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(
        ConstrainedLayoutEngine,
        "execute",
        lambda self, fig: solved.append(1) or execute(self, fig),
    )
    fig, ax = plt.subplots(figsize=(2, 2), dpi=30, layout="constrained")
    (line,) = ax.plot([0, 1], [0, 1])

    def update(frame):
        line.set_ydata([0, frame])
        ax.set_title(f"frame {frame}")
        return (line,)

    html = animation_html(FuncAnimation(fig, update, frames=4), alt="a line")
    assert html.data.count("data:image/png;base64") == 4
    assert len(solved) == 1  # a known-wrong renderer solves it 4 or 8 times
    assert not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)


# --- Chapters 9 (smaller models) and 10 (a modern LLM): viz.animations.pruning, .llm


def _capture(monkeypatch, module_name: str) -> list:
    """Make ``module_name``'s animation functions return their FuncAnimation (the
    frames are then drawn one by one with ``anim._func(frame)``)."""
    import importlib

    module = importlib.import_module(module_name)
    captured = []

    def keep(anim, **kwargs):
        captured.append(anim)
        return animation_html(anim, **kwargs)

    monkeypatch.setattr(module, "animation_html", keep)
    return captured


def test_head_pruning_animation_draws_each_count_and_its_fidelity(monkeypatch):
    from transformer_course.viz import head_pruning_animation

    captured = _capture(monkeypatch, "transformer_course.viz.animations.pruning")
    order = [(i // 3, i % 3) for i in reversed(range(6))]  # (2 layers, 3 heads)
    counts, rho = [0, 2, 4, 6], torch.tensor([1.0, 0.9, 0.7, 0.4])
    html = head_pruning_animation(order, counts, rho, n_layers=2, n_heads=3).data
    assert html.count("data:image/png;base64") == len(counts)
    anim = captured[0]
    fig = anim._fig
    for frame, k in enumerate(counts):
        artists = anim._func(frame)
        crossed = [a for a in artists[: len(order)] if a.get_visible()]
        outlined = [a for a in artists[len(order) : 2 * len(order)] if a.get_visible()]
        assert len(crossed) == k  # the first k heads of the order are crossed
        assert len(outlined) == (
            counts[frame + 1] - k if frame + 1 < len(counts) else 0
        )
        line = artists[2 * len(order)]
        assert list(line.get_xdata()) == counts[: frame + 1]
        assert torch.allclose(torch.tensor(line.get_ydata()), rho[: frame + 1].double())
    first = anim._func(0)
    assert [a.get_visible() for a in first[len(order) : len(order) + 2]] == [True] * 2
    assert "0 of 6 heads removed" in fig._suptitle.get_text()  # the idea at frame 0
    plt.close(fig)


def test_head_pruning_animation_rejects_an_order_missing_a_head():
    from transformer_course.viz import head_pruning_animation

    order = [(0, 0), (0, 1), (0, 1)]  # known-wrong: head (0, 2) missing, (0, 1) twice
    with pytest.raises(ValueError, match=r"order: expected each of the 1 x 3 heads"):
        head_pruning_animation(order, [0, 3], [1.0, 0.5], n_layers=1, n_heads=3)
    with pytest.raises(ValueError, match=r"fidelity: expected shape \(2,\)"):
        head_pruning_animation([(0, 0)], [0, 1], [1.0], n_layers=1, n_heads=1)
    with pytest.raises(ValueError, match="n_removed: expected increasing counts"):
        head_pruning_animation([(0, 0)], [1, 0], [1.0, 0.5], n_layers=1, n_heads=1)


def test_soft_target_animation_draws_the_students_softmax_and_the_library_loss(
    monkeypatch,
):
    from transformer_course import distill
    from transformer_course.viz import soft_target_animation

    captured = _capture(monkeypatch, "transformer_course.viz.animations.pruning")
    teacher = torch.tensor([2.0, 0.0, -1.0, 0.5])
    students = torch.stack([torch.zeros(4), 0.5 * teacher, teacher])  # (F, C)
    T = 2.0
    html = soft_target_animation(teacher, students, T, steps=[0, 5, 10]).data
    assert html.count("data:image/png;base64") == 3
    anim = captured[0]
    for frame, s in enumerate(students):
        _, dots, title = anim._func(frame)
        q = torch.softmax(s / T, -1).double()
        assert torch.allclose(torch.tensor(dots.get_ydata()), q)
        loss = distill.soft_target_loss(s[None], teacher[None], T).item()
        assert f"= {loss:.3f}" in title.get_text()  # the library's loss, T^2 KL
    assert title.get_text().startswith("step 10:")
    plt.close(anim._fig)


def test_soft_target_animation_rejects_logits_of_another_width():
    from transformer_course.viz import soft_target_animation

    with pytest.raises(ValueError, match=r"student_logits: expected shape \(F, 4\)"):
        soft_target_animation(torch.zeros(4), torch.zeros(2, 5), 1.0)  # known-wrong
    with pytest.raises(ValueError, match="temperature: expected a number > 0"):
        soft_target_animation(torch.zeros(4), torch.zeros(2, 4), 0.0)
    with pytest.raises(ValueError, match="steps: expected 2 labels, got 3"):
        soft_target_animation(torch.zeros(4), torch.zeros(2, 4), 1.0, steps=[0, 1, 2])


def test_generation_animation_draws_the_top_tokens_nucleus_and_cache(monkeypatch):
    from transformer_course.decoding import filter_logits
    from transformer_course.viz import generation_animation

    captured = _capture(monkeypatch, "transformer_course.viz.animations.llm")
    probs = torch.softmax(
        torch.randn(3, 10, generator=torch.Generator().manual_seed(1)), -1
    )
    chosen, lengths = probs.argmax(-1), torch.tensor([5, 6, 7])
    html = generation_animation(
        probs, chosen, lengths, lambda i: f"t{i}", top_p=0.5, top_k=4
    ).data
    assert html.count("data:image/png;base64") == 3
    anim = captured[0]
    key = mpl.colors.to_rgba(style.ROLE_COLORS["attention"])
    for frame in range(3):
        artists = anim._func(frame)
        bars = artists[:4]
        top = probs[frame].sort(descending=True).values[:4].double()
        assert torch.allclose(torch.tensor([b.get_width() for b in bars]), top)
        kept = filter_logits(probs[frame : frame + 1].log(), top_p=0.5).isfinite()
        assert sum(b.get_facecolor() == key for b in bars) == int(kept.sum())
        cells = artists[4:-2]
        filled = [c for c in cells if c.get_facecolor() != mpl.colors.to_rgba("white")]
        assert len(filled) == int(lengths[frame])  # one cell per cached token
        assert f"KV cache: {int(lengths[frame])} tokens" in artists[-1].get_text()
    plt.close(anim._fig)


def test_generation_animation_rejects_a_cache_that_does_not_grow():
    from transformer_course.viz import generation_animation

    probs = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="cache_lengths: expected increasing"):
        generation_animation(probs, [0, 1], [5, 5], str)  # known-wrong: no growth
    with pytest.raises(ValueError, match=r"chosen: expected shape \(2,\)"):
        generation_animation(probs, [0], [5, 6], str)
    with pytest.raises(ValueError, match="top_p: expected a probability in"):
        generation_animation(probs, [0, 1], [5, 6], str, top_p=1.5)


def test_grouped_query_animation_shows_each_heads_map_and_its_group(monkeypatch):
    from transformer_course.viz import grouped_query_animation

    captured = _capture(monkeypatch, "transformer_course.viz.animations.llm")
    w = torch.softmax(torch.randn(6, 4, 4), -1)  # (H, T, T), 6 query heads
    html = grouped_query_animation(w, 2, list("abcd"), layer=3).data
    assert html.count("data:image/png;base64") == 6
    anim = captured[0]
    for h in range(6):
        artists = anim._func(h)
        image, title = artists[-2], artists[-1]
        assert torch.allclose(torch.tensor(image.get_array().data), w[h].double())
        assert f"query head {h} reads key/value head {h // 3}" in title.get_text()
    plt.close(anim._fig)


def test_grouped_query_animation_rejects_kv_heads_that_do_not_divide():
    from transformer_course.viz import grouped_query_animation

    w = torch.softmax(torch.randn(9, 4, 4), -1)
    with pytest.raises(ValueError, match="n_kv_heads: expected a divisor of H = 9"):
        grouped_query_animation(w, 2)  # known-wrong: 9 heads in groups of 2
    with pytest.raises(ValueError, match=r"weights: expected shape \(H, T, T\)"):
        grouped_query_animation(torch.zeros(9, 4, 5), 3)
    with pytest.raises(ValueError, match="tokens: expected 4 labels, got 3"):
        grouped_query_animation(w, 3, list("abc"))
