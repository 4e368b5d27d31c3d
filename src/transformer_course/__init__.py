"""Attention, Illustrated: the shared library behind the course.

Each module holds one concept and is derived in one chapter of the book:

- ``device``     picking CPU / CUDA / MPS and seeding (preface)
- ``recurrent``  LSTM encoder-decoders with and without attention, copy task (chapter 1)
- ``masks``      boolean attention masks, True = may attend (chapters 1, 5)
- ``attention``  scaled dot-product, additive and multi-head attention (chapters 1-3)
- ``positional`` sinusoidal, learned, rotary and ALiBi positions (chapter 4)
- ``model``, ``decoding``, ``training``, ``data``  the full Transformer (chapter 6)
- ``efficient``  tiled (FlashAttention-style), sliding-window, grouped-query (chapter 7)
- ``pretrained`` the real all-MiniLM-L6-v2 weights in this library's encoder (chapters 1, 3)
- ``viz``        figures, animations and interactive views used by every chapter
- ``checks``     self-checks for the exercises
"""

from transformer_course import efficient as _efficient  # noqa: F401 (registers "tiled")
from transformer_course.attention import (
    ATTENTION_BACKENDS,
    additive_attention,
    scaled_dot_product_attention,
)
from transformer_course.device import get_device, set_seed
from transformer_course.masks import (
    causal_mask,
    combine_masks,
    from_key_padding_mask,
    padding_mask,
    sliding_window_mask,
)

__version__ = "0.1.0"

__all__ = [
    "ATTENTION_BACKENDS",
    "additive_attention",
    "causal_mask",
    "combine_masks",
    "from_key_padding_mask",
    "get_device",
    "padding_mask",
    "scaled_dot_product_attention",
    "set_seed",
    "sliding_window_mask",
]
