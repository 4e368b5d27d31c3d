"""Self-checks for the chapters' exercises, one module per chapter.

A check runs a learner's function on inputs whose sizes all differ (so a mixed-up axis
shows), compares the result with the library's reference, and when it is wrong names
the mistake with a hint that does not give the answer away. It prints
"passed: ..." and returns True, or prints "✗ message" and "Hint: ..." and returns False
(``check.strict(fn)`` raises ``CheckError`` instead). An untouched stub prints
"not attempted yet".

Messages come in English or Chinese: ``set_language("zh")`` (or the environment
variable ``TRANSFORMER_COURSE_LANG=zh``, which the Chinese notebooks' install cell sets)
switches them; ``_language`` and the catalog ``locale/zh/LC_MESSAGES/exercises.po`` hold
the translations.

- ``ch01`` ... ``ch11``: the checks of each chapter;
- ``pitfalls``: the known-wrong functions the checks recognise;
- ``_method``: how an answer computes (a call into the library's own version, a loop
  the exercise forbids, a row read at once where it is streamed), which the checks
  refuse even when the numbers are right;
- ``public_test``: the public otter test of a coding exercise (shapes and types only).
"""

from transformer_course.exercises._common import (
    CheckError,
    ShapeError,
    check_close,
    check_shape,
    exercise_check,
    public_test,
)
from transformer_course.exercises._language import get_language, set_language
from transformer_course.exercises.ch01 import (
    check_dot_product_attention,
    check_encoder_attention,
    check_soft_lookup,
)
from transformer_course.exercises.ch02 import (
    check_attention_bthd,
    check_masked_attention,
    check_stable_softmax,
)
from transformer_course.exercises.ch03 import (
    check_merge_folded_heads,
    check_merge_heads,
    check_multi_head_attention,
    check_split_heads,
    check_split_qkv,
)
from transformer_course.exercises.ch04 import (
    check_new_token_positions,
    check_rotary_half,
    check_sinusoidal_encoding,
)
from transformer_course.exercises.ch05 import (
    check_attention_properties,
    check_causal_leakage,
    check_causal_mask,
    check_decoder_mask,
    check_fully_masked_rows,
    check_mask_polarity,
    check_padding_invariance,
    check_padding_mask,
)
from transformer_course.exercises.ch06 import (
    check_label_smoothed_loss,
    check_noam_lr,
    check_teacher_forcing_loss,
)
from transformer_course.exercises.ch07 import (
    check_online_softmax,
    check_quantize_int8,
    check_repeat_kv,
    check_streaming_attention,
)
from transformer_course.exercises.ch08 import check_clip_loss, check_patchify
from transformer_course.exercises.ch09 import (
    check_mean_pool,
    check_neighbour_agreement,
    check_soft_target_loss,
)
from transformer_course.exercises.ch10 import (
    check_gqa_cache_bytes,
    check_rms_norm,
    check_swiglu,
    check_unpermute_rows,
)
from transformer_course.exercises.ch11 import (
    check_kivi_keys,
    check_paged_gather,
    check_speculative_accept,
)

__all__ = [
    "CheckError",
    "ShapeError",
    "check_attention_bthd",
    "check_attention_properties",
    "check_causal_leakage",
    "check_causal_mask",
    "check_clip_loss",
    "check_close",
    "check_decoder_mask",
    "check_dot_product_attention",
    "check_encoder_attention",
    "check_fully_masked_rows",
    "check_gqa_cache_bytes",
    "check_kivi_keys",
    "check_label_smoothed_loss",
    "check_mask_polarity",
    "check_masked_attention",
    "check_mean_pool",
    "check_merge_folded_heads",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_neighbour_agreement",
    "check_new_token_positions",
    "check_noam_lr",
    "check_online_softmax",
    "check_padding_invariance",
    "check_padding_mask",
    "check_paged_gather",
    "check_patchify",
    "check_quantize_int8",
    "check_repeat_kv",
    "check_rms_norm",
    "check_rotary_half",
    "check_shape",
    "check_sinusoidal_encoding",
    "check_soft_lookup",
    "check_soft_target_loss",
    "check_speculative_accept",
    "check_split_heads",
    "check_split_qkv",
    "check_stable_softmax",
    "check_streaming_attention",
    "check_swiglu",
    "check_teacher_forcing_loss",
    "check_unpermute_rows",
    "exercise_check",
    "get_language",
    "public_test",
    "set_language",
]
