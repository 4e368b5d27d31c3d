"""Figures, animations, interactive views and diagrams. Functions take tensors (or
modules) and return a matplotlib Figure or something displayable; nothing here trains
or computes attention. Importing it applies the book style (``viz.style``)."""

from transformer_course.viz.animations import (
    animation_html,
    generation_animation,
    grouped_query_animation,
    head_pruning_animation,
    query_scan_animation,
    soft_target_animation,
)
from transformer_course.viz.diagrams import diagram, teacher_student_diagram
from transformer_course.viz.interactive import interactive, static_mode
from transformer_course.viz.plots import (
    alt_text,
    attention_grid,
    attention_heatmap,
    register_alt_text_display,
    set_alt_text,
)
from transformer_course.viz.schematics import (
    course_map,
    kv_cache_diagram,
    tiles_diagram,
)
from transformer_course.viz.style import ROLE_COLORS, use_book_style

use_book_style()  # one style for every figure of the book

register_alt_text_display()  # alt text for every figure in the book build

__all__ = [
    "ROLE_COLORS",
    "alt_text",
    "animation_html",
    "attention_grid",
    "attention_heatmap",
    "course_map",
    "diagram",
    "generation_animation",
    "grouped_query_animation",
    "head_pruning_animation",
    "interactive",
    "kv_cache_diagram",
    "query_scan_animation",
    "set_alt_text",
    "soft_target_animation",
    "static_mode",
    "teacher_student_diagram",
    "tiles_diagram",
    "use_book_style",
]
