"""Animations that play on the static site: matplotlib ``FuncAnimation`` rendered to
self-contained JavaScript HTML (``animation_html`` in ``_player``), one module per topic,
each function taking a chapter's own tensors and returning the displayable HTML (the
frame bookkeeping lives here, not in the chapters)."""

from transformer_course.viz.animations._player import animation_html
from transformer_course.viz.animations.attention import (
    query_scan_animation,
    softmax_animation,
    weighted_sum_animation,
)
from transformer_course.viz.animations.captions import (
    caption_animation,
    zero_shot_animation,
)
from transformer_course.viz.animations.decoding import (
    beam_search_animation,
    cross_attention_decode_animation,
)
from transformer_course.viz.animations.flash import (
    flash_backward_animation,
    tiles_animation,
)
from transformer_course.viz.animations.heads import (
    head_patterns_animation,
    split_merge_animation,
)
from transformer_course.viz.animations.kv_cache import kv_cache_animation
from transformer_course.viz.animations.llm import (
    generation_animation,
    grouped_query_animation,
)
from transformer_course.viz.animations.masks import (
    decode_step_animation,
    mask_scores_animation,
)
from transformer_course.viz.animations.positions import (
    rotary_pairs_animation,
    sinusoidal_offset_animation,
)
from transformer_course.viz.animations.pruning import (
    head_pruning_animation,
    soft_target_animation,
)
from transformer_course.viz.animations.scaling import (
    scaled_scores_animation,
    softmax_saturation_animation,
)
from transformer_course.viz.animations.serving import (
    paged_pool_animation,
    speculative_animation,
)

__all__ = [
    "animation_html",
    "beam_search_animation",
    "caption_animation",
    "cross_attention_decode_animation",
    "decode_step_animation",
    "flash_backward_animation",
    "generation_animation",
    "grouped_query_animation",
    "head_patterns_animation",
    "head_pruning_animation",
    "kv_cache_animation",
    "mask_scores_animation",
    "paged_pool_animation",
    "query_scan_animation",
    "rotary_pairs_animation",
    "scaled_scores_animation",
    "sinusoidal_offset_animation",
    "soft_target_animation",
    "softmax_animation",
    "softmax_saturation_animation",
    "speculative_animation",
    "split_merge_animation",
    "tiles_animation",
    "weighted_sum_animation",
    "zero_shot_animation",
]
