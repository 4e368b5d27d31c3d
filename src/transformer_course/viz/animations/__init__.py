"""Animations that play on the static site: matplotlib ``FuncAnimation`` rendered to
self-contained JavaScript HTML (``animation_html`` in ``_player``), one module per topic,
each function taking a chapter's own tensors and returning the displayable HTML (the
frame bookkeeping lives here, not in the chapters)."""

from transformer_course.viz.animations._player import animation_html
from transformer_course.viz.animations.attention import query_scan_animation
from transformer_course.viz.animations.captions import (
    caption_animation,
    zero_shot_animation,
)
from transformer_course.viz.animations.flash import (
    flash_backward_animation,
    tiles_animation,
)
from transformer_course.viz.animations.kv_cache import kv_cache_animation

__all__ = [
    "animation_html",
    "caption_animation",
    "flash_backward_animation",
    "kv_cache_animation",
    "query_scan_animation",
    "tiles_animation",
    "zero_shot_animation",
]
