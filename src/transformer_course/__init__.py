"""Attention, Illustrated: the shared library behind the course.

One concept per module, each derived in a chapter of the book:

- ``device``      picking CPU / CUDA / MPS and seeding (preface)
- ``recurrent``   LSTM encoder-decoders with and without attention, copy task (chapter 1)
- ``masks``       boolean attention masks, True = may attend (chapters 1, 5)
- ``additive``    additive (Bahdanau) attention (chapter 1)
- ``attention``   scaled dot-product attention, the backend registry and one
                  ``MultiHeadAttention`` (grouped-query, biases, head gates) (2, 3)
- ``pretrained``, ``head_roles``  the real all-MiniLM-L6-v2 and what its heads do (1, 3)
- ``positional``, ``alibi``  sinusoidal, learned, rotary positions; ALiBi (chapter 4)
- ``layers``      ``FeedForward`` and the one ``TransformerLayer`` every model uses (6)
- ``model``, ``decoding``, ``training``, ``data``  the full Transformer, a decoder-only
                  LM and batched generation (chapters 6, 7)
- ``interop``     weight copies from PyTorch modules and the Hugging Face checkpoint
- ``flash``, ``local``, ``quantize``, ``measure``, ``triton_kernels``  making attention
                  fast: tiled attention, sliding windows, int8, timing and memory (7)
- ``viz``         figures, animations and interactive views used by every chapter
- ``exercises``   self-checks for the exercises (one module per chapter, pitfalls)
"""

from transformer_course.additive import additive_attention
from transformer_course.attention import (
    ATTENTION_BACKENDS,
    scaled_dot_product_attention,
)
from transformer_course.device import get_device, set_cpu_threads, set_seed
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
    "set_cpu_threads",
    "set_seed",
    "sliding_window_mask",
]
