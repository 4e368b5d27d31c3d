"""Animations that play on the static site: matplotlib ``FuncAnimation`` rendered to
self-contained JavaScript HTML (``animation_html`` in ``_player``), one module per topic,
each function taking a chapter's own tensors and returning the displayable HTML (the
frame bookkeeping lives here, not in the chapters)."""

from transformer_course.viz.animations._player import animation_html
from transformer_course.viz.animations.attention import query_scan_animation
from transformer_course.viz.animations.flash import flash_backward_animation
from transformer_course.viz.animations.llm import (
    generation_animation,
    grouped_query_animation,
)
from transformer_course.viz.animations.pruning import (
    head_pruning_animation,
    soft_target_animation,
)

__all__ = [
    "animation_html",
    "flash_backward_animation",
    "generation_animation",
    "grouped_query_animation",
    "head_pruning_animation",
    "query_scan_animation",
    "soft_target_animation",
]
