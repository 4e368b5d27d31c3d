"""Boolean attention masks. Convention everywhere in this library: True = may attend.

Derived in chapter 1 (first use) and chapter 5 ("Masks"). Shapes broadcast against the
attention scores, which are (B, H, T, S):

    B batch, H heads, T query length, S key length.

PyTorch's ``nn.MultiheadAttention`` and ``nn.Transformer`` use the opposite polarity for
bool masks (True = ignore); ``from_key_padding_mask`` converts. Masks are combined with a
logical and, never by adding large negative floats, which overflows in float16
(transformers PR #17306).

One name per meaning:

- ``mask``: what attention takes, any shape broadcasting to the scores, True = may
  attend (``causal_mask``, ``sliding_window_mask``, ``combine_masks``).
- ``padding_mask``: the (B, 1, 1, S) mask that hides padded keys, True = real key
  (``padding_mask()``); passed to cross-attention it is the ``memory_mask``
  (``nn.Transformer``'s name for the mask over the encoder's output).
- ``attention_mask``: Hugging Face's (B, S) token mask, True = real token
  (``DecoderOnlyLM``, ``decoding.generate``), which the model turns into a (B, 1, 1, S)
  padding mask.
- ``key_padding_mask``: only where PyTorch's (B, S), True = *ignore*, is mirrored
  (``from_key_padding_mask``).

Sources: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.3 (causal mask);
Beltagy et al. 2020 (Longformer) and Jiang et al. 2023 (Mistral) for sliding windows.
"""

from __future__ import annotations

import torch

from transformer_course import _validation

Tensor = torch.Tensor


def _offsets(q_len: int, k_len: int, device) -> Tensor:
    """(T, S) tensor of j - (i + k_len - q_len): how far key j lies after query i's own
    position when queries are aligned to the last ``q_len`` keys (bottom-right)."""
    i = torch.arange(q_len, device=device)[:, None]  # (T, 1)
    j = torch.arange(k_len, device=device)[None, :]  # (1, S)
    return j - (i + k_len - q_len)  # (T, S)


def causal_mask(q_len: int, k_len: int | None = None, *, device=None) -> Tensor:
    """Causal (look-ahead) mask: query i may attend to key j when j <= i + k_len - q_len.

    With ``k_len == q_len`` this is the lower triangle, diagonal included. When there
    are more keys than queries (decoding with a KV cache: the queries are the newest
    tokens) the queries are aligned to the *last* keys ("bottom-right"), so the newest
    query sees every key.

    Args:
        q_len: number of queries T (>= 1).
        k_len: number of keys S (>= 1); defaults to ``q_len``.
        device: where to build the mask.

    Returns:
        Bool tensor of shape (T, S), True = may attend.

    Raises:
        TypeError / ValueError: for a non-int or non-positive length.

    Source: Vaswani et al. 2017, section 3.2.3.
    """
    k_len = q_len if k_len is None else k_len
    _validation.positive_int("q_len", q_len)
    _validation.positive_int("k_len", k_len)
    return _offsets(q_len, k_len, device) <= 0


def sliding_window_mask(
    q_len: int, window: int, k_len: int | None = None, *, device=None
) -> Tensor:
    """Causal sliding-window mask: each query sees itself and the ``window - 1`` keys
    before it (aligned bottom-right, like ``causal_mask``).

    Args:
        q_len: number of queries T (>= 1).
        window: how many keys each query may see, itself included (>= 1).
        k_len: number of keys S (>= 1); defaults to ``q_len``.
        device: where to build the mask.

    Returns:
        Bool tensor (T, S), True = may attend. With ``window >= k_len`` it equals
        ``causal_mask(q_len, k_len)``.

    Raises:
        TypeError / ValueError: for a non-int or non-positive length or window.

    Source: Beltagy et al. 2020 (Longformer), section 3.1; Jiang et al. 2023 (Mistral 7B).
    """
    k_len = q_len if k_len is None else k_len
    _validation.positive_int("q_len", q_len)
    _validation.positive_int("k_len", k_len)
    _validation.positive_int("window", window)
    offset = _offsets(q_len, k_len, device)
    return (offset <= 0) & (offset > -window)


def padding_mask(
    tokens_or_lengths: Tensor, pad_id: int = 0, *, max_len: int | None = None
) -> Tensor:
    """Key padding mask of shape (B, 1, 1, S): True where the key is a real token.

    The mask has singleton head and query axes so it hides padded *keys* (columns) for
    every head and every query. Hiding padded queries instead, a (B, 1, T, 1) mask, is a
    common bug (pitfall P5): padded rows then attend to padding and real rows do not
    ignore it.

    Args:
        tokens_or_lengths: either token ids (B, S), integer, with ``pad_id`` at padded
            positions; or lengths (B,), integer, the number of real tokens in each row
            (padding at the end).
        pad_id: the padding token id, used with token ids.
        max_len: with lengths, the padded length S (default: the largest length).

    Returns:
        Bool tensor (B, 1, 1, S), True = may attend.

    Raises:
        TypeError: if the input is not an integer tensor.
        ValueError: if it is not 1-D or 2-D, or a length is negative or above ``max_len``.
    """
    x = tokens_or_lengths
    _validation.integer_tensor("tokens_or_lengths", x)
    if x.dim() == 2:
        keep = x != pad_id  # (B, S)
    elif x.dim() == 1:
        s = int(x.max()) if max_len is None else max_len
        if (x < 0).any() or (x > s).any():
            raise ValueError(
                f"tokens_or_lengths: lengths must lie in [0, {s}], got {x.tolist()}"
            )
        keep = torch.arange(s, device=x.device)[None, :] < x[:, None]  # (B, S)
    else:
        raise ValueError(
            "tokens_or_lengths: expected token ids (B, S) or lengths (B,), "
            f"got shape {tuple(x.shape)}"
        )
    return keep[:, None, None, :]  # (B, 1, 1, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Combine bool masks with a logical and (a key is visible only if every mask allows it).

    Args:
        *masks: bool tensors that broadcast against each other, e.g. a causal (T, S)
            mask and a padding (B, 1, 1, S) mask; ``None`` entries are skipped.

    Returns:
        The broadcast bool mask, or ``None`` if every entry was ``None``.

    Raises:
        TypeError: if a mask is not a bool tensor (float additive masks included).
        ValueError: if the masks do not broadcast; the message gives every shape.

    Combining with ``&`` cannot overflow, unlike adding two masks that each use
    ``torch.finfo(dtype).min`` (pitfall P7).
    """
    present = [m for m in masks if m is not None]
    for idx, m in enumerate(present):
        _validation.bool_tensor(f"masks[{idx}]", m)
    if not present:
        return None
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        shapes = ", ".join(str(tuple(m.shape)) for m in present)
        raise ValueError(f"masks: shapes {shapes} do not broadcast together") from None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """Convert PyTorch's ``key_padding_mask`` (B, S), True = *ignore*, to this library's
    convention: a (B, 1, 1, S) bool mask with True = may attend.

    Args:
        key_padding_mask: bool tensor (B, S) as taken by ``nn.MultiheadAttention``.

    Returns:
        Bool tensor (B, 1, 1, S).

    Raises:
        TypeError: if it is not a bool tensor.
        ValueError: if it is not 2-D.

    Pitfall P3: the two conventions are opposite; passing one where the other is
    expected lets every query see the future.
    """
    _validation.bool_tensor("key_padding_mask", key_padding_mask)
    if key_padding_mask.dim() != 2:
        raise ValueError(
            "key_padding_mask: expected shape (B, S), "
            f"got {tuple(key_padding_mask.shape)}"
        )
    return ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
