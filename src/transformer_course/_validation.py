"""Input checks shared by the library (private).

Each function checks one argument (or one group that must agree) and raises a
``TypeError`` or ``ValueError`` whose message names the argument, what was expected and
what was received. Call sites use one line per argument, so the math comes first when a
module is read top to bottom::

    _validation.qkv(q, k, v)
    _validation.positive_int("block_q", block_q)

The pitfall ids in messages (P4, ...) are listed on the book's pitfall index page.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def positive_int(name: str, value, minimum: int = 1) -> None:
    """An int (not a bool) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")


def multiple(name: str, value: int, of_name: str, of: int) -> None:
    """``value`` a multiple of ``of`` (e.g. d_model of n_heads)."""
    if value % of:
        raise ValueError(
            f"{name}: expected a multiple of {of_name} = {of}, got {value}"
        )


def divisor(name: str, value: int, of_name: str, of: int) -> None:
    """``value`` a divisor of ``of`` (e.g. n_kv_heads of n_heads)."""
    if of % value:
        raise ValueError(f"{name}: expected a divisor of {of_name} = {of}, got {value}")


def one_of(name: str, value, choices) -> None:
    """``value`` one of ``choices`` (names of backends, layouts, ...)."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {sorted(choices)}, got {value!r}")


def non_negative(name: str, value) -> None:
    """A real number >= 0 (a temperature, a length-penalty exponent); NaN fails."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value}")


def nucleus_mass(name: str, value) -> None:
    """A top-p probability mass in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not 0 < value <= 1:
        raise ValueError(f"{name}: expected a probability in (0, 1], got {value}")


def probability(name: str, value: float) -> None:
    """A dropout probability in [0, 1)."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value}")


def float_tensor(name: str, x, min_dim: int = 2) -> None:
    """A floating-point tensor with at least ``min_dim`` dimensions."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(
            f"{name}: expected a floating-point tensor, got dtype {x.dtype}"
        )
    if x.dim() < min_dim:
        raise ValueError(
            f"{name}: expected at least {min_dim} dimensions (..., length, features), "
            f"got shape {tuple(x.shape)}"
        )


def integer_tensor(name: str, x) -> None:
    """An integer tensor (ids, lengths, positions): not float, bool or complex."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise TypeError(f"{name}: expected an integer tensor, got dtype {x.dtype}")


def bool_tensor(name: str, mask) -> None:
    """A bool mask of any shape, True = may attend. Float additive masks are rejected
    (pitfall P4): mixed with bool ones they get silently dropped."""
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"{name}: expected a bool torch.Tensor, got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name}: expected a bool mask (True = may attend), got dtype {mask.dtype}. "
            "Float additive masks (0 / -inf) are rejected so they cannot be silently "
            "mixed with bool ones (pitfall P4); convert with `mask = float_mask == 0`, "
            "or pass a float score offset (ALiBi, relative positions) as `bias`."
        )


def qkv(q: Tensor, k: Tensor, v: Tensor, *, grouped: bool = False) -> None:
    """Queries (..., T, d_k), keys (..., S, d_k) and values (..., S, d_v) that agree:
    one float dtype, one d_k, one S, the same leading (batch, head) dimensions. With
    ``grouped``, q (B, H, T, d_k) may come with k and v of H_kv heads (B, H_kv, S, d),
    H_kv a divisor of H (grouped-query attention)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        float_tensor(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected d_k = {q.shape[-1]} to match q (..., T, d_k) = "
            f"{tuple(q.shape)}, got k shape {tuple(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: expected S = {k.shape[-2]} keys to match k (..., S, d_k) = "
            f"{tuple(k.shape)}, got v shape {tuple(v.shape)}"
        )
    if k.shape[:-2] == v.shape[:-2] and (
        q.shape[:-2] == k.shape[:-2] or (grouped and _grouped_heads(q, k))
    ):
        return
    groups = " (or H_kv key/value heads dividing H)" if grouped else ""
    raise ValueError(
        f"q, k, v: expected the same leading (batch, head) dimensions{groups}, got "
        f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    )


def _grouped_heads(q: Tensor, k: Tensor) -> bool:
    """q (B, H, T, d) and k (B, H_kv, S, d) with H_kv a divisor of H."""
    return (
        q.dim() == k.dim() == 4
        and q.shape[0] == k.shape[0]
        and k.shape[-3] > 0
        and q.shape[-3] % k.shape[-3] == 0
    )


def _broadcasts_to_scores(name: str, x: Tensor, scores_shape, examples: str) -> None:
    """``x`` broadcasts to the scores (..., T, S) without growing them: each of its
    sizes, aligned from the right, is 1 or the scores' size (plain Python on the
    shapes, as it runs in every attention call)."""
    n = x.dim()
    ok = n <= len(scores_shape) and all(
        a in (1, b)
        for a, b in zip(x.shape, tuple(scores_shape)[len(scores_shape) - n :])
    )
    if not ok:
        raise ValueError(
            f"{name}: expected a shape that broadcasts to the scores (..., T, S) = "
            f"{tuple(scores_shape)}, e.g. {examples}; got {tuple(x.shape)}"
        )


def bool_mask(mask, scores_shape: tuple[int, ...]) -> None:
    """A bool mask (True = may attend) that broadcasts to the scores (..., T, S).
    Float additive masks are rejected (pitfall P4): they go through ``bias``.
    ``None`` (no mask) passes."""
    if mask is None:
        return
    bool_tensor("mask", mask)
    _broadcasts_to_scores(
        "mask", mask, scores_shape, "(T, S), (B, 1, 1, S), (B, H, T, S)"
    )


def score_bias(bias, scores_shape: tuple[int, ...]) -> None:
    """A floating-point additive bias that broadcasts to the scores (..., T, S);
    ``None`` passes."""
    if bias is None:
        return
    if not isinstance(bias, Tensor) or not bias.dtype.is_floating_point:
        got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
        raise TypeError(
            f"bias: expected a floating-point tensor added to the scores, got {got}; "
            "bool masks go through `mask`"
        )
    _broadcasts_to_scores("bias", bias, scores_shape, "(H, T, S) or (B, H, T, S)")


def head_gates(head_mask, batch: int, n_heads: int) -> None:
    """Float gates of shape (H,) or (B, H), one per head; ``None`` passes."""
    if head_mask is None:
        return
    if not isinstance(head_mask, Tensor) or not head_mask.dtype.is_floating_point:
        got = head_mask.dtype if isinstance(head_mask, Tensor) else type(head_mask)
        raise TypeError(f"head_mask: expected a floating-point tensor, got {got}")
    if tuple(head_mask.shape) not in ((n_heads,), (batch, n_heads)):
        raise ValueError(
            f"head_mask: expected shape (H,) = ({n_heads},) or (B, H) = "
            f"({batch}, {n_heads}), got {tuple(head_mask.shape)}"
        )


def sequence(name: str, x, d_model: int) -> None:
    """A (B, length, d_model) float tensor."""
    float_tensor(name, x, min_dim=3)
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name}: expected shape (B, length, d_model) with d_model = {d_model}, "
            f"got {tuple(x.shape)}"
        )


def query_key_value(query, key, value, d_model: int) -> None:
    """query (B, T, D), key and value (B, S, D) for multi-head attention (one tensor
    passed three times, as in self-attention, is checked once)."""
    sequence("query", query, d_model)
    if key is not query:
        sequence("key", key, d_model)
    if value is not key:
        sequence("value", value, d_model)
    if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
        raise ValueError(
            "query, key, value: expected (B, T, D), (B, S, D), (B, S, D), got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )


def token_ids(name: str, ids, vocab_size: int, max_len: int, past: int = 0) -> None:
    """A (B, L) integer tensor of ids in [0, vocab_size), L >= 1, and at most
    ``max_len`` tokens counting ``past`` tokens already in a KV cache."""
    if (
        not isinstance(ids, Tensor)
        or ids.dtype.is_floating_point
        or ids.dtype == torch.bool
    ):
        what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name}: expected an integer tensor of token ids, got {what}")
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"{name}: expected token ids of shape (B, L) with L >= 1, "
            f"got {tuple(ids.shape)}"
        )
    if past + ids.shape[1] > max_len:
        cached = f" after {past} cached tokens" if past else ""
        raise ValueError(
            f"{name}: expected at most max_len = {max_len} tokens{cached}, got shape "
            f"{tuple(ids.shape)}"
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0].item()
        raise ValueError(
            f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})"
        )


def keep_mask(name: str, keep, shape: tuple[int, int]) -> None:
    """A bool (B, S) mask over tokens, True = real token."""
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool:
        got = keep.dtype if isinstance(keep, Tensor) else type(keep).__name__
        raise TypeError(
            f"{name}: expected a bool tensor (True = real token), got {got}"
        )
    if tuple(keep.shape) != tuple(shape):
        raise ValueError(
            f"{name}: expected shape (B, S) = {tuple(shape)} (every token so far), "
            f"got {tuple(keep.shape)}"
        )


def positions(pos, n: int, *, allow_negative: bool = False) -> None:
    """Integer positions (T,) or (B, T) with T = ``n``."""
    if not isinstance(pos, Tensor):
        raise TypeError(
            f"positions: expected an integer torch.Tensor, got {type(pos).__name__}"
        )
    if pos.dtype.is_floating_point or pos.dtype == torch.bool:
        raise TypeError(f"positions: expected integer indices, got dtype {pos.dtype}")
    if pos.dim() not in (1, 2) or pos.shape[-1] != n:
        raise ValueError(
            f"positions: expected shape (T,) or (B, T) with T = {n}, "
            f"got {tuple(pos.shape)}"
        )
    if not allow_negative and (pos < 0).any():
        raise ValueError("positions: expected indices >= 0, got a negative one")


def token_id_set(name: str, value) -> None:
    """A token id >= 0 or a non-empty collection of them (stop tokens)."""
    ids = [value] if isinstance(value, int) else value
    if isinstance(value, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(
            f"{name}: expected an int or a collection of ints, got {type(value).__name__}"
        )
    ids = list(ids)
    if not ids:
        raise ValueError(f"{name}: expected at least one token id, got {value!r}")
    for i in ids:
        positive_int(name, i, 0)


def left_padded(name: str, keep: Tensor) -> None:
    """A bool (B, T) token mask whose every row ends with a real token (True): prompts
    padded on the left, so the next token follows the last real one."""
    ends_in_pad = ~keep[:, -1]  # (B,)
    if ends_in_pad.any():
        rows = ends_in_pad.nonzero()[:, 0].tolist()
        raise ValueError(
            f"{name}: expected left padding (every row's last position True), got "
            f"rows {rows} ending in padding (right-padded prompts would continue "
            "from the pad); pad prompts on the left"
        )
