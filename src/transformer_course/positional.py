"""Positional information for attention, which on its own is blind to order.

Derived in chapter 4 ("Positional encoding"). Shape letters:

    B batch, H heads, T query length, S key length, D d_model, d head size (d_k).

Positions are always *absolute indices passed in*, never recomputed from the length of
the chunk at hand: with a KV cache a new token sits at ``cache length + t``, and with
left padding at the number of real tokens before it (pitfall P16, see ``position_ids``).

Sources:
    Vaswani et al. 2017, "Attention Is All You Need", section 3.5 (sinusoidal encoding).
    Gehring et al. 2017, "Convolutional Sequence to Sequence Learning" (learned positions).
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    section 3.2, equations (13)-(16) (rotary embedding).
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_course import _validation

Tensor = torch.Tensor
LAYOUTS = ("half", "interleaved")


# ------------------------------------------------------------------ positions themselves


def position_ids(
    q_len: int, *, offset: int = 0, keep: Tensor | None = None, device=None
) -> Tensor:
    """Absolute positions of the ``q_len`` newest tokens.

    Args:
        q_len: number of new tokens T.
        offset: tokens already processed (the KV cache length); the new tokens sit at
            ``offset, ..., offset + T - 1`` (pitfall P16).
        keep: optional bool (B, S) or (B, 1, 1, S) padding mask over *all* tokens so far
            (S = offset + T), True = real token. Positions then count real tokens only,
            so a left-padded row starts at 0 at its first real token; padded slots get 0.
        device: where to build the result (default: ``keep``'s device).

    Returns:
        Long tensor (T,) without ``keep``, (B, T) with it.

    Raises:
        TypeError / ValueError: bad lengths, a non-bool ``keep``, or S != offset + T.
    """
    _validation.positive_int("q_len", q_len)
    _validation.positive_int("offset", offset, 0)
    if keep is None:
        return torch.arange(offset, offset + q_len, device=device)
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool:
        raise TypeError("keep: expected a bool tensor (True = real token)")
    if keep.dim() == 4:
        keep = keep[:, 0, 0, :]  # (B, S)
    if keep.dim() != 2 or keep.shape[-1] != offset + q_len:
        raise ValueError(
            f"keep: expected shape (B, S) with S = offset + q_len = {offset + q_len}, "
            f"got {tuple(keep.shape)}"
        )
    pos = (keep.long().cumsum(-1) - 1).clamp(min=0)  # (B, S)
    return pos[:, offset:]  # (B, T)


# --------------------------------------------------------------------- sinusoidal (2017)


def _inv_freq(n_pairs: int, d: int, base: float, device=None) -> Tensor:
    """omega_i = base^(-2i / d) for i = 0 .. n_pairs - 1 (Vaswani et al., section 3.5)."""
    two_i = torch.arange(0, 2 * n_pairs, 2, device=device, dtype=torch.float64)
    return base ** (-two_i / d)


def sinusoidal_encoding(
    max_len: int,
    d_model: int,
    *,
    base: float = 10000.0,
    device=None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The sinusoidal table PE[pos, 2i] = sin(pos w_i), PE[pos, 2i+1] = cos(pos w_i),
    with w_i = base^(-2i / d_model).

    An odd ``d_model`` works (pitfall P15): there are ceil(D/2) sine columns and
    floor(D/2) cosine columns, so the last column is an unpaired sine.

    Args:
        max_len: number of positions (rows), >= 1.
        d_model: encoding size D (columns), >= 1.
        base: the wavelength base (10000 in the paper).
        device, dtype: of the result (computed in float64, then cast).

    Returns:
        Tensor (max_len, d_model).

    Raises:
        TypeError / ValueError: for non-int or non-positive sizes.

    Source: Vaswani et al. 2017, section 3.5.
    """
    _validation.positive_int("max_len", max_len)
    _validation.positive_int("d_model", d_model)
    pos = torch.arange(max_len, device=device, dtype=torch.float64)[:, None]  # (L, 1)
    angles = pos * _inv_freq(
        (d_model + 1) // 2, d_model, base, device
    )  # (L, ceil(D/2))
    pe = torch.zeros(max_len, d_model, device=device, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(dtype)


def relative_shift_matrix(
    k: int, d_model: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The fixed linear map M_k with PE[pos + k] = PE[pos] @ M_k for every pos.

    M_k is block diagonal: one 2x2 rotation by k * w_i per (sin, cos) column pair. It
    depends on the offset k only, which is why Vaswani et al. expected the model to
    "easily learn to attend by relative positions".

    Args:
        k: the offset (any int, negative allowed).
        d_model: even encoding size D.

    Returns:
        Tensor (D, D).

    Raises:
        ValueError: for an odd ``d_model``: its last sine column has no cosine partner,
            so no such map exists for it.

    Source: Vaswani et al. 2017, section 3.5.
    """
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"k: expected an int, got {type(k).__name__}")
    _validation.positive_int("d_model", d_model, 2)
    if d_model % 2:
        raise ValueError(
            f"d_model: expected an even size (sin/cos pairs), got {d_model}; the unpaired "
            "last sine column of an odd table is not a linear function of the row"
        )
    phi = k * _inv_freq(d_model // 2, d_model, base)  # (D/2,)
    c, s = torch.cos(phi), torch.sin(phi)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    # row vector [sin a, cos a] @ [[c, -s], [s, c]] = [sin(a + phi), cos(a + phi)]
    m[0::2, 0::2] = torch.diag(c)
    m[0::2, 1::2] = torch.diag(-s)
    m[1::2, 0::2] = torch.diag(s)
    m[1::2, 1::2] = torch.diag(c)
    return m.to(dtype)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to token embeddings: x + PE[positions].

    Args:
        d_model: embedding size D.
        max_len: rows precomputed (a buffer, not a parameter; longer inputs raise).
        dropout: dropout on the sum (0.1 in the paper).

    ``forward(x, positions=None)``: x (B, T, D); positions (T,) or (B, T) absolute
    indices (default ``0..T-1``). Returns (B, T, D). Raises ValueError for a wrong last
    dimension or a position >= max_len.

    Source: Vaswani et al. 2017, section 3.5.
    """

    def __init__(self, d_model: int, max_len: int = 4096, *, dropout: float = 0.0):
        super().__init__()
        _validation.positive_int("d_model", d_model)
        _validation.positive_int("max_len", max_len)
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer(
            "pe", sinusoidal_encoding(max_len, d_model), persistent=False
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.dropout(x + _lookup(self.pe, x, positions, "max_len"))


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per absolute position: x + E[positions] (BERT, GPT-2).

    Positions never seen in training keep their random initial vectors, which is why
    learned positions do not extrapolate to longer inputs (chapter 4's experiment).

    Args:
        d_model: embedding size D.
        max_len: number of positions with a vector.
        dropout: dropout on the sum.

    The arguments come in the order of ``SinusoidalPositionalEncoding``'s (the
    positional classes all take ``(d_model, max_len)``); ``forward(x, positions=None)``
    as ``SinusoidalPositionalEncoding``. Raises TypeError / ValueError for a size that
    is not an int >= 1.

    Source: Gehring et al. 2017, section 3.1; Devlin et al. 2019 (BERT).
    """

    def __init__(self, d_model: int, max_len: int = 4096, *, dropout: float = 0.0):
        super().__init__()
        _validation.positive_int("d_model", d_model)
        _validation.positive_int("max_len", max_len)
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.dropout(x + _lookup(self.embedding.weight, x, positions, "max_len"))


def _lookup(table: Tensor, x: Tensor, positions: Tensor | None, what: str) -> Tensor:
    if x.dim() != 3 or x.shape[-1] != table.shape[1]:
        raise ValueError(
            f"x: expected shape (B, T, D) with D = {table.shape[1]}, got {tuple(x.shape)}"
        )
    t = x.shape[1]
    positions = torch.arange(t, device=x.device) if positions is None else positions
    _validation.positions(positions, t)
    if int(positions.max()) >= table.shape[0]:
        raise ValueError(
            f"positions: expected indices < {what} = {table.shape[0]}, "
            f"got {int(positions.max())}"
        )
    return table[positions].to(x.dtype)  # (T, D) or (B, T, D)


# --------------------------------------------------------------------------- rotary


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """Rotate each pair of x by the angles whose cos/sin are given, (..., T, d/2)."""
    half = x.shape[-1] // 2
    if layout == "half":  # pairs (x_i, x_{i + d/2}), GPT-NeoX / LLaMA
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # pairs (x_2i, x_2i+1), RoFormer / GPT-J
    out = torch.stack(
        (x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1
    )  # (..., d/2, 2)
    return out.flatten(-2)  # (..., d)


def apply_rotary(
    x: Tensor, positions: Tensor, *, layout: str = "half", base: float = 10000.0
) -> Tensor:
    """Rotary position embedding: rotate pair i of every vector by pos * theta_i,
    theta_i = base^(-2i / d).

    Applied to queries and keys (not values), it makes q_m . k_n depend on the
    positions only through m - n, and it preserves every vector's norm.

    Args:
        x: (..., T, d) with d even, e.g. (T, d), (B, T, d) or (B, H, T, d).
        positions: absolute integer positions (T,), or (B, T) for a batch (a head axis
            of x is broadcast over); a negative position rotates backwards. With a
            KV cache pass ``position_ids(T, offset=cache_len)``, never ``arange(T)``
            (pitfall P16).
        layout: which coordinates form a pair: ``"half"`` (x_i with x_{i+d/2}, as in
            GPT-NeoX and Hugging Face LLaMA) or ``"interleaved"`` (x_2i with x_2i+1, as
            in the RoFormer paper and GPT-J). The two are the same rotation up to a
            fixed permutation of the coordinates; weights trained with one layout need
            that layout.
        base: the frequency base (10000 in the paper).

    Returns:
        Tensor of x's shape and dtype (the angles are computed in float32 or better).

    Raises:
        TypeError / ValueError: non-float x, odd d, an unknown layout, or positions
        that do not match T.

    Source: Su et al. 2021, section 3.2, equations (13)-(16).
    """
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        raise TypeError("x: expected a floating-point torch.Tensor")
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(
            f"x: expected shape (..., T, d) with an even d, got {tuple(x.shape)}"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    _validation.positions(positions, x.shape[-2], allow_negative=True)
    d = x.shape[-1]
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = _inv_freq(d // 2, d, base, x.device).to(work)  # (d/2,)
    angles = positions.to(work)[..., None] * inv  # (T, d/2) or (B, T, d/2)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]  # (B, 1, T, d/2): same positions for every head
    cos, sin = torch.cos(angles), torch.sin(angles)
    return _rotate(x.to(work), cos, sin, layout).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary embedding for one head size, as a module (no parameters).

    Args:
        d_k: head size d (even).
        base: frequency base; layout: ``"half"`` or ``"interleaved"``.

    ``forward(q, k, positions_q=None, positions_k=None)`` rotates queries (..., T, d)
    and keys (..., S, d); positions default to ``0..T-1`` / ``0..S-1``, except that
    with fewer queries than keys and no query positions the queries are taken to be
    the *last* T positions (decoding with a KV cache). Returns ``(q_rot, k_rot)``.

    Source: Su et al. 2021, section 3.2.
    """

    def __init__(self, d_k: int, *, base: float = 10000.0, layout: str = "half"):
        super().__init__()
        _validation.positive_int("d_k", d_k, 2)
        if d_k % 2:
            raise ValueError(f"d_k: expected an even head size, got {d_k}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        self.d_k, self.base, self.layout = d_k, base, layout

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        positions_q: Tensor | None = None,
        positions_k: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        t, s = q.shape[-2], k.shape[-2]
        if positions_k is None:
            positions_k = torch.arange(s, device=k.device)
        if positions_q is None:
            positions_q = torch.arange(
                max(s - t, 0), max(s - t, 0) + t, device=q.device
            )
        rot = {"layout": self.layout, "base": self.base}
        return apply_rotary(q, positions_q, **rot), apply_rotary(k, positions_k, **rot)

    def extra_repr(self) -> str:
        return f"d_k={self.d_k}, base={self.base}, layout={self.layout!r}"
