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


@torch.inference_mode(False)  # an ordinary tensor: see Returns
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
        Long tensor (T,) without ``keep``, (B, T) with it; an ordinary tensor also
        under ``torch.inference_mode`` (``decoding.generate``'s): a ``RotaryEmbedding``
        shared by every layer reuses the rows it looked up for the first layer only
        once the tensor's version counter proves it unchanged, and inference tensors
        have none.

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


def _rotary_inv_freq(d: int, base: float, freq_factors, device=None) -> Tensor:
    """theta_i = base^(-2i / d) / f_i (float64, (d/2,)): the rotary frequencies, each
    divided by its factor f_i when ``freq_factors`` (d/2 positive numbers) is given, as
    llama.cpp divides by a GGUF's ``rope_freqs`` (``ggml_rope_ext``'s freq_factors;
    Llama 3's and linear RoPE scaling are such factors). Raises ValueError naming
    ``freq_factors`` for a wrong length or a factor that is not finite and > 0."""
    inv = _inv_freq(d // 2, d, base, device)
    if freq_factors is None:
        return inv
    f = torch.as_tensor(freq_factors, dtype=torch.float64, device=device)
    if f.shape != (d // 2,) or not bool(torch.isfinite(f).all() and (f > 0).all()):
        raise ValueError(
            f"freq_factors: expected {d // 2} finite factors > 0 (one per pair of a "
            f"head of {d}), got {tuple(f.tolist()) if f.dim() == 1 else tuple(f.shape)}"
        )
    return inv / f


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
    x: Tensor,
    positions: Tensor,
    *,
    layout: str = "half",
    base: float = 10000.0,
    freq_factors=None,
) -> Tensor:
    """Rotary position embedding: rotate pair i of every vector by pos * theta_i,
    theta_i = base^(-2i / d) (divided by ``freq_factors[i]`` when given).

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
        freq_factors: optional d/2 factors > 0 dividing the frequencies (a GGUF's
            ``rope_freqs``; Llama 3's and linear RoPE scaling, ``interop``).

    Returns:
        Tensor of x's shape and dtype (the angles are computed in float32 or better).

    Raises:
        TypeError / ValueError: non-float x, odd d, an unknown layout, positions
        that do not match T, or ``freq_factors`` not d/2 positive numbers.

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
    work = _work_dtype(x)
    inv = _rotary_inv_freq(d, base, freq_factors, x.device).to(work)  # (d/2,)
    angles = positions.to(work)[..., None] * inv  # (T, d/2) or (B, T, d/2)
    return _rotate_at(x, torch.cos(angles), torch.sin(angles), layout)


def _work_dtype(x: Tensor) -> torch.dtype:
    """The dtype the rotation is computed in: float64 for float64, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rotate_at(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """``_rotate`` in the working dtype for cos/sin (T, d/2) or (B, T, d/2), cast back."""
    if cos.dim() == 3 and x.dim() == 4:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d/2): every head alike
    return _rotate(x.to(cos.dtype), cos, sin, layout).to(x.dtype)


def _rotate_complex(x: Tensor, cis: Tensor) -> Tensor:
    """The "interleaved" rotation with complex numbers: pair (x_2i, x_2i+1) is
    z_i = x_2i + i x_2i+1, and z_i e^{i pos theta_i} (``cis``, complex64 (T, d/2) or
    (B, T, d/2)) is the rotated pair, as in Meta's LLaMA code (``freqs_cis``). The
    same products and sums as ``_rotate`` in one kernel instead of six; equal to it up
    to float32 rounding (the vectorised complex product may fuse a multiply and an
    add), bit for bit at SmolLM2's head size.
    """
    if cis.dim() == 3 and x.dim() == 4:
        cis = cis[:, None]  # (B, 1, T, d/2): every head alike
    work = x.to(torch.float32)
    if work.stride(-1) != 1 or any(st % 2 for st in work.stride()[:-1]):
        work = work.contiguous()  # view_as_complex reads (real, imag) side by side
    z = torch.view_as_complex(work.unflatten(-1, (-1, 2)))  # (..., T, d/2)
    return torch.view_as_real(z * cis).flatten(-2).to(x.dtype)  # (..., T, d)


class RotaryEmbedding(nn.Module):
    """Rotary embedding for one head size, as a module (no parameters).

    Args:
        d_k: head size d (even).
        base: frequency base; layout: ``"half"`` or ``"interleaved"``.
        freq_factors: optional d/2 factors > 0 dividing the frequencies, as in
            ``apply_rotary`` (a tuple, kept as given).

    ``forward(q, k, positions_q=None, positions_k=None)`` rotates queries (..., T, d)
    and keys (..., S, d); positions default to ``0..T-1`` / ``0..S-1``, except that
    with fewer queries than keys and no query positions the queries are taken to be
    the *last* T positions (decoding with a KV cache). Returns ``(q_rot, k_rot)``,
    equal to ``apply_rotary`` of each.

    The angles pos * theta_i do not depend on the layer or the step, so the module
    keeps a table of their cos and sin for positions 0..n-1 (float32, computed as
    ``apply_rotary`` computes them, doubled in length when a larger position comes)
    and a forward only looks rows up; one table serves every layer that shares the
    module (``model._layers`` builds one per model). The "interleaved" layout rotates
    its pairs as complex numbers (``_rotate_complex``, equal up to float32 rounding).
    Float64 inputs and negative positions are rotated by ``apply_rotary`` itself.

    Source: Su et al. 2021, section 3.2; the cos/sin cache as in Hugging Face's
    ``LlamaRotaryEmbedding`` and GPT-NeoX.
    """

    def __init__(
        self,
        d_k: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        freq_factors=None,
    ):
        super().__init__()
        _validation.positive_int("d_k", d_k, 2)
        if d_k % 2:
            raise ValueError(f"d_k: expected an even head size, got {d_k}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        _rotary_inv_freq(d_k, base, freq_factors)  # fail now on bad factors
        self.d_k, self.base, self.layout = d_k, base, layout
        self.freq_factors = freq_factors
        self._cos: Tensor | None = None  # (n, d/2) float32, row p = cos(p * theta)
        self._sin: Tensor | None = None  # (n, d/2)
        self._last = None  # (positions, its version, their cos/sin rows or None)

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
        return self._rotate(q, positions_q), self._rotate(k, positions_k)

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """``apply_rotary(x, positions)`` with the cos/sin rows of the table."""
        rot = {"layout": self.layout, "base": self.base}
        rot["freq_factors"] = self.freq_factors  # apply_rotary's arguments
        if not isinstance(x, Tensor) or _work_dtype(x) != torch.float32:
            return apply_rotary(x, positions, **rot)  # float64, or the error
        _validation.positions(positions, x.shape[-2], allow_negative=True)
        if x.shape[-1] != self.d_k:
            raise ValueError(
                f"x: expected shape (..., T, d) with d = d_k = {self.d_k}, "
                f"got {tuple(x.shape)}"
            )
        rows = self._rows(positions, x.device)
        if rows is None:  # a negative position
            return apply_rotary(x, positions, **rot)
        if self.layout == "interleaved":
            return _rotate_complex(x, rows)
        return _rotate_at(x, *rows, self.layout)

    def _rows(self, positions: Tensor, device):
        """The table's rows at ``positions``: (cos, sin), each (T, d/2) or (B, T, d/2),
        for "half"; cos + i sin (complex64) for "interleaved"; None if a position < 0.

        A model passes one positions tensor to the queries and keys of all its layers
        in a forward, so the rows of the last positions are kept and reused while the
        same tensor (same object, not changed in place since) comes again."""
        version = None if positions.is_inference() else positions._version
        last = self._last
        if last is not None and last[0] is positions and last[1] == version:
            return last[2]
        low, high = (int(p) for p in torch.aminmax(positions))
        rows = None
        if low >= 0:
            cos, sin = self._table(high + 1, device)  # (n, d/2) each
            rows = cos[positions], sin[positions]
            if self.layout == "interleaved":
                rows = torch.complex(*rows)  # e^{i pos theta}
        if version is not None:  # inference tensors have no version to check
            self._last = (positions, version, rows)
        return rows

    def _table(self, n: int, device) -> tuple[Tensor, Tensor]:
        """The cos and sin tables, with at least n rows, on ``device``."""
        if self._cos is None or self._cos.shape[0] < n or self._cos.device != device:
            size = max(n, 2 * self._cos.shape[0] if self._cos is not None else 64)
            inv = _rotary_inv_freq(self.d_k, self.base, self.freq_factors, device)
            pos = torch.arange(size, device=device).to(torch.float32)
            angles = pos[:, None] * inv.to(torch.float32)  # (size, d/2)
            self._cos, self._sin = torch.cos(angles), torch.sin(angles)
        return self._cos, self._sin

    def extra_repr(self) -> str:
        scaled = "" if self.freq_factors is None else ", freq_factors=(...)"
        return f"d_k={self.d_k}, base={self.base}, layout={self.layout!r}{scaled}"
