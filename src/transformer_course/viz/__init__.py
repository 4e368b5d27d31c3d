"""Figures, animations and interactive views. Functions take tensors and return a
matplotlib Figure or displayable HTML; nothing here trains or computes attention."""

from transformer_course.viz.animations import animation_html, query_scan_animation
from transformer_course.viz.interactive import interactive, static_mode
from transformer_course.viz.plots import (
    alt_text,
    attention_grid,
    attention_heatmap,
    register_alt_text_display,
    set_alt_text,
)

register_alt_text_display()  # alt text for every figure in the book build

__all__ = [
    "alt_text",
    "animation_html",
    "attention_grid",
    "attention_heatmap",
    "interactive",
    "query_scan_animation",
    "set_alt_text",
    "static_mode",
]
