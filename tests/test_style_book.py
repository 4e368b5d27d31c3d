"""The book style (viz.style): one set of role colours, text no smaller than 10 px on
the 684 px page column, figures that fit it, and the library's figures obeying it."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest
import torch

from transformer_course.viz import style
from transformer_course.viz.plots import attention_grid, attention_heatmap, figure_html


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
