"""Figures, animations, interactive views and diagrams. Functions take tensors (or
modules) and return a matplotlib Figure or something displayable; nothing here trains
or computes attention. Importing it applies the book style (``viz.style``)."""

from transformer_course.viz.animations import (
    animation_html,
    beam_search_animation,
    caption_animation,
    cross_attention_decode_animation,
    decode_step_animation,
    flash_backward_animation,
    generation_animation,
    grouped_query_animation,
    head_patterns_animation,
    head_pruning_animation,
    kv_cache_animation,
    mask_scores_animation,
    paged_pool_animation,
    query_scan_animation,
    rotary_pairs_animation,
    scaled_scores_animation,
    sinusoidal_offset_animation,
    soft_target_animation,
    softmax_animation,
    softmax_saturation_animation,
    speculative_animation,
    split_merge_animation,
    tiles_animation,
    weighted_sum_animation,
    zero_shot_animation,
)
from transformer_course.viz.diagrams import diagram, teacher_student_diagram
from transformer_course.viz.interactive import interactive, static_mode
from transformer_course.viz.paged import PagedTrace, paged_cache_schematic
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
    "PagedTrace",
    "alt_text",
    "animation_html",
    "attention_grid",
    "attention_heatmap",
    "beam_search_animation",
    "caption_animation",
    "course_map",
    "cross_attention_decode_animation",
    "decode_step_animation",
    "diagram",
    "flash_backward_animation",
    "generation_animation",
    "grouped_query_animation",
    "head_patterns_animation",
    "head_pruning_animation",
    "interactive",
    "kv_cache_animation",
    "kv_cache_diagram",
    "mask_scores_animation",
    "paged_cache_schematic",
    "paged_pool_animation",
    "query_scan_animation",
    "rotary_pairs_animation",
    "scaled_scores_animation",
    "set_alt_text",
    "sinusoidal_offset_animation",
    "soft_target_animation",
    "softmax_animation",
    "softmax_saturation_animation",
    "speculative_animation",
    "split_merge_animation",
    "static_mode",
    "teacher_student_diagram",
    "tiles_animation",
    "tiles_diagram",
    "use_book_style",
    "weighted_sum_animation",
    "zero_shot_animation",
]
