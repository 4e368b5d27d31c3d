"""Alt text of the library's figures, animations and interactive views, so that every
image on the static site says what it shows (checked on the built site by test_a11y)."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.animation import FuncAnimation
from matplotlib.figure import Figure

from transformer_course.viz import (
    alt_text,
    animation_html,
    attention_grid,
    attention_heatmap,
    query_scan_animation,
    set_alt_text,
)
from transformer_course.viz.interactive import static_html
from transformer_course.viz.plots import describe_figure, register_alt_text_display


def labelled_figure(title="Scores", xlabel="key", ylabel="query"):
    fig, ax = plt.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    plt.close(fig)
    return fig


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
