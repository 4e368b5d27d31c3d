"""Figures, animations and interactive views. Functions take tensors and return a
matplotlib Figure or displayable HTML; nothing here trains or computes attention."""

from transformer_course.viz.animations import animation_html, query_scan_animation
from transformer_course.viz.interactive import interactive, static_mode
from transformer_course.viz.plots import attention_grid, attention_heatmap

__all__ = [
    "animation_html",
    "attention_grid",
    "attention_heatmap",
    "interactive",
    "query_scan_animation",
    "static_mode",
]
