"""The full Transformer (encoder-decoder) and a GPT-style decoder-only language model.

Derived in chapter 6 ("The full Transformer"); ``DecoderOnlyLM`` is used in chapter 7.
Shape letters: B batch, S source length, T target length, D d_model, V vocabulary.

    Transformer: Encoder (N x [self-attention, feed-forward]) and Decoder
    (N x [masked self-attention, cross-attention, feed-forward]), each sub-layer
    wrapped in a residual connection and layer normalisation, either after the
    residual sum (post-LN, the 2017 paper) or before the sub-layer (pre-LN).

Masks are bool with True = may attend. Token id ``cfg.pad_id`` is padding.

Sources:
    Vaswani et al. 2017, "Attention Is All You Need", sections 3.1-3.5 (architecture,
    equation (2) for the feed-forward, 3.4 for the sqrt(d_model) embedding scale and
    weight tying); Xiong et al. 2020, "On Layer Normalization in the Transformer
    Architecture" (pre-LN); Press and Wolf 2017 (tied embeddings); Radford et al. 2019
    (GPT-2, decoder-only with pre-LN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.attention import MultiHeadAttention
from transformer_course.masks import causal_mask, combine_masks, padding_mask
from transformer_course.positional import SinusoidalPositionalEncoding

Tensor = torch.Tensor


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and switches of a Transformer (defaults: the chapter 6 translator)."""

    src_vocab_size: int = 64  # source (encoder) vocabulary V_src
    tgt_vocab_size: int = 64  # target (decoder) vocabulary V; the only one of the LM
    d_model: int = 128  # width D of every token vector (512 in the paper)
    n_heads: int = 4  # attention heads H; d_k = d_model / n_heads
    d_ff: int = 512  # hidden width of the feed-forward (2048 in the paper)
    n_layers: int = 2  # encoder layers, and decoder layers unless n_decoder_layers
    n_decoder_layers: int | None = None  # decoder depth if different from the encoder
    dropout: float = 0.1  # on sub-layer outputs, embeddings and attention weights
    norm_first: bool = True  # pre-LN (True) or the paper's post-LN (False)
    max_len: int = 64  # longest sequence (positions) the model accepts
    tie_embeddings: bool = False  # share decoder input embedding and output weights
    pad_id: int = 0  # padding token id, masked out as a key
    activation: str = "relu"  # "relu" (the paper) or "gelu" (GPT-2)
    backend: str = "naive"  # attention backend; "sdpa" is faster, gives no weights
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (PyTorch's default)

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model: expected a multiple of n_heads = {self.n_heads}, "
                f"got {self.d_model}"
            )
        if self.activation not in ("relu", "gelu"):
            raise ValueError(
                f"activation: expected 'relu' or 'gelu', got {self.activation!r}"
            )

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers


def check_tokens(name: str, ids, vocab_size: int, max_len: int, past: int = 0) -> None:
    """Validate a (B, L) batch of token ids.

    Raises:
        TypeError: not an integer tensor.
        ValueError: not 2-D, empty (L = 0), longer than ``max_len`` (counting ``past``
            tokens already in a KV cache), or an id outside [0, vocab_size) (an
            unknown token); the message names ``name``.
    """
    if (
        not isinstance(ids, Tensor)
        or ids.dtype.is_floating_point
        or ids.dtype == torch.bool
    ):
        what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name}: expected an integer tensor of token ids, got {what}")
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"{name}: expected token ids of shape (B, L) with L >= 1, got {tuple(ids.shape)}"
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


# ---------------------------------------------------------------------------- layers


class FeedForward(nn.Module):
    """Position-wise feed-forward network FFN(x) = W_2 act(W_1 x + b_1) + b_2.

    Shapes: (..., D) -> (..., D), hidden width ``d_ff``.
    Source: Vaswani et al. 2017, section 3.3, equation (2).
    """

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.0, activation="relu"
    ):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class _Layer(nn.Module):
    """Shared pieces of the encoder and decoder layers: residual + LayerNorm wiring."""

    norm_first: bool

    def _sublayer(self, x: Tensor, norm: nn.LayerNorm, fn) -> Tensor:
        """Post-LN: norm(x + drop(f(x))); pre-LN: x + drop(f(norm(x)))."""
        if self.norm_first:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))

    @staticmethod
    def _copy(ours: nn.Module, theirs: nn.Module) -> None:
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)

    @torch.no_grad()
    def _load_ff_norms(self, layer: nn.Module, n_norms: int) -> None:
        self._copy(self.ff.linear1, layer.linear1)
        self._copy(self.ff.linear2, layer.linear2)
        for i in range(1, n_norms + 1):
            self._copy(getattr(self, f"norm{i}"), getattr(layer, f"norm{i}"))


class EncoderLayer(_Layer):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm.

    Args: d_model, n_heads, d_ff, dropout, norm_first, activation, backend, eps as in
    ``TransformerConfig``.

    ``forward(x, mask=None, *, cache=None)``: x (B, S, D); mask bool broadcastable to
    (B, H, S, S), True = may attend (a padding (B, 1, 1, S) mask, or a causal mask in
    the decoder-only LM); ``cache`` a ``KVCache`` (decoder-only use). Returns (B, S, D).
    The last attention weights (B, H, S, S) are kept in ``self.attn_weights``.

    Equals ``torch.nn.TransformerEncoderLayer(batch_first=True)`` with the same weights
    (``load_from_torch``), for both ``norm_first`` settings.
    Source: Vaswani et al. 2017, section 3.1.
    """

    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.0,
        *,
        norm_first=True,
        activation="relu",
        backend="naive",
        eps=1e-5,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, backend=backend
        )
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.attn_weights: Tensor | None = None

    def _attend(self, x, mask, cache):
        out, self.attn_weights = self.self_attn(x, x, x, mask, cache=cache)
        return out

    def forward(self, x: Tensor, mask: Tensor | None = None, *, cache=None) -> Tensor:
        x = self._sublayer(x, self.norm1, lambda h: self._attend(h, mask, cache))
        return self._sublayer(x, self.norm2, self.ff)

    @torch.no_grad()
    def load_from_torch(self, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """Copy the weights of a ``torch.nn.TransformerEncoderLayer``; returns self."""
        self.self_attn.load_from_torch_mha(layer.self_attn)
        self._load_ff_norms(layer, 2)
        return self


class DecoderLayer(_Layer):
    """Masked self-attention, cross-attention to the encoder output, feed-forward.

    ``forward(x, memory, tgt_mask=None, memory_mask=None, *, cache=None)``:
    x (B, T, D), memory (B, S, D); ``tgt_mask`` broadcastable to (B, H, T, T_past + T)
    (causal, and padding); ``memory_mask`` to (B, H, T, S) (source padding); ``cache``
    a ``KVCache`` for the self-attention. Returns (B, T, D). The last weights are kept
    in ``self.self_attn_weights`` (B, H, T, T) and ``self.cross_attn_weights``
    (B, H, T, S).

    Equals ``torch.nn.TransformerDecoderLayer(batch_first=True)`` with the same weights
    (``load_from_torch``), for both ``norm_first`` settings.
    Source: Vaswani et al. 2017, section 3.1 and 3.2.3.
    """

    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout=0.0,
        *,
        norm_first=True,
        activation="relu",
        backend="naive",
        eps=1e-5,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, backend=backend
        )
        self.cross_attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, backend=backend
        )
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.norm3 = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.self_attn_weights: Tensor | None = None
        self.cross_attn_weights: Tensor | None = None

    def _self(self, x, mask, cache):
        out, self.self_attn_weights = self.self_attn(x, x, x, mask, cache=cache)
        return out

    def _cross(self, x, memory, mask):
        out, self.cross_attn_weights = self.cross_attn(x, memory, memory, mask)
        return out

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, *, cache=None):
        x = self._sublayer(x, self.norm1, lambda h: self._self(h, tgt_mask, cache))
        x = self._sublayer(x, self.norm2, lambda h: self._cross(h, memory, memory_mask))
        return self._sublayer(x, self.norm3, self.ff)

    @torch.no_grad()
    def load_from_torch(self, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """Copy the weights of a ``torch.nn.TransformerDecoderLayer``; returns self."""
        self.self_attn.load_from_torch_mha(layer.self_attn)
        self.cross_attn.load_from_torch_mha(layer.multihead_attn)
        self._load_ff_norms(layer, 3)
        return self


# ------------------------------------------------------------------ encoder / decoder


class Embedding(nn.Module):
    """Token embedding times sqrt(d_model) plus sinusoidal positions, then dropout.

    ``forward(ids, offset=0)``: ids (B, L) -> (B, L, D); positions start at ``offset``
    (the KV cache length when decoding). Source: Vaswani et al. 2017, sections 3.4, 3.5.
    """

    def __init__(self, vocab_size: int, cfg: TransformerConfig):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, cfg.d_model)
        nn.init.normal_(self.tokens.weight, std=cfg.d_model**-0.5)
        self.positions = SinusoidalPositionalEncoding(
            cfg.d_model, cfg.max_len, dropout=cfg.dropout
        )
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        pos = torch.arange(offset, offset + ids.shape[1], device=ids.device)  # (L,)
        return self.positions(self.tokens(ids) * self.scale, pos)  # (B, L, D)


def _final_norm(cfg: TransformerConfig) -> nn.Module:
    """Pre-LN stacks end with a LayerNorm (their residual stream is never normalised);
    post-LN layers already end in one."""
    return (
        nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        if cfg.norm_first
        else nn.Identity()
    )


def _layer_kwargs(cfg: TransformerConfig) -> dict:
    return {
        "norm_first": cfg.norm_first,
        "activation": cfg.activation,
        "backend": cfg.backend,
        "eps": cfg.layer_norm_eps,
    }


class Encoder(nn.Module):
    """Embedding, ``cfg.n_layers`` encoder layers, and a final LayerNorm when pre-LN.

    ``forward(src)``: src ids (B, S) -> ``(memory (B, S, D), src_mask (B, 1, 1, S))``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.src_vocab_size, cfg)
        self.layers = nn.ModuleList(
            EncoderLayer(
                cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, **_layer_kwargs(cfg)
            )
            for _ in range(cfg.n_layers)
        )
        self.norm = _final_norm(cfg)

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor]:
        check_tokens("src", src, self.cfg.src_vocab_size, self.cfg.max_len)
        src_mask = padding_mask(src, self.cfg.pad_id)  # (B, 1, 1, S)
        x = self.embed(src)  # (B, S, D)
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x), src_mask


class Decoder(nn.Module):
    """Embedding, decoder layers, final LayerNorm when pre-LN, and the output
    projection to vocabulary logits (tied to the embedding if ``tie_embeddings``).

    ``forward(tgt, memory, src_mask, *, caches=None)``: tgt ids (B, T), memory (B, S, D),
    src_mask (B, 1, 1, S); ``caches`` one ``KVCache`` per layer: then ``tgt`` holds only
    the new tokens, placed after the cached ones. Returns logits (B, T, V).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.tgt_vocab_size, cfg)
        self.layers = nn.ModuleList(
            DecoderLayer(
                cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, **_layer_kwargs(cfg)
            )
            for _ in range(cfg.decoder_layers)
        )
        self.norm = _final_norm(cfg)
        self.out = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.tokens.weight

    def forward(self, tgt, memory, src_mask, *, caches=None) -> Tensor:
        past = _past_length(caches, len(self.layers))
        check_tokens("tgt", tgt, self.cfg.tgt_vocab_size, self.cfg.max_len, past)
        T = tgt.shape[1]
        tgt_mask = causal_mask(T, past + T, device=tgt.device)  # (T, past + T)
        if past == 0:  # hide padded target keys too (teacher forcing on a batch)
            tgt_mask = combine_masks(tgt_mask, padding_mask(tgt, self.cfg.pad_id))
        x = self.embed(tgt, past)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                memory,
                tgt_mask,
                src_mask,
                cache=None if caches is None else caches[i],
            )
        return self.out(self.norm(x))  # (B, T, V)


def _past_length(caches, n_layers: int) -> int:
    if caches is None:
        return 0
    if len(caches) != n_layers:
        raise ValueError(
            f"caches: expected one cache per layer ({n_layers}), got {len(caches)}"
        )
    return caches[0].length


class Transformer(nn.Module):
    """The encoder-decoder Transformer of Vaswani et al. 2017 (section 3, figure 1).

    - ``encode(src)``: src ids (B, S) -> ``(memory (B, S, D), src_mask (B, 1, 1, S))``.
    - ``decode(tgt, memory, src_mask, *, caches=None)`` -> logits (B, T, V).
    - ``forward(src, tgt)``: teacher forcing, ``decode(tgt, *encode(src))``.

    Raises:
        TypeError: ids that are not an integer tensor.
        ValueError: ids not (B, L), an empty sequence, one longer than ``cfg.max_len``,
            or an id outside the vocabulary (an unknown token).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        for name, p in self.named_parameters():  # Xavier for matrices, as PyTorch's
            if p.dim() > 1 and "embed" not in name:  # nn.Transformer does
                nn.init.xavier_uniform_(p)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.encoder(src)

    def decode(self, tgt, memory, src_mask, *, caches=None) -> Tensor:
        return self.decoder(tgt, memory, src_mask, caches=caches)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        memory, src_mask = self.encode(src)
        return self.decode(tgt, memory, src_mask)


def make_model(cfg: TransformerConfig) -> Transformer:
    """Build an encoder-decoder ``Transformer`` from a config (annotated-transformer's
    ``make_model``)."""
    return Transformer(cfg)


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: token + sinusoidal position embedding, a stack of
    causal self-attention layers (``EncoderLayer`` with a causal mask), final LayerNorm
    (pre-LN) and the output projection (tied to the embedding if ``tie_embeddings``).

    Reads ``cfg.tgt_vocab_size`` (the vocabulary V), ``n_layers``, ``d_model``, ...

    ``forward(ids, *, caches=None)``: ids (B, T) -> logits (B, T, V); position t predicts
    token t + 1. With ``caches`` (one ``KVCache`` per layer) ``ids`` holds only the new
    tokens, placed after the cached ones.

    Raises: as ``Transformer``. Source: Radford et al. 2018/2019 (GPT, GPT-2).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.tgt_vocab_size, cfg)
        self.layers = nn.ModuleList(
            EncoderLayer(
                cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, **_layer_kwargs(cfg)
            )
            for _ in range(cfg.n_layers)
        )
        self.norm = _final_norm(cfg)
        self.out = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.tokens.weight

    def forward(self, ids: Tensor, *, caches=None) -> Tensor:
        past = _past_length(caches, len(self.layers))
        check_tokens("ids", ids, self.cfg.tgt_vocab_size, self.cfg.max_len, past)
        T = ids.shape[1]
        mask = causal_mask(T, past + T, device=ids.device)  # (T, past + T)
        x = self.embed(ids, past)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, cache=None if caches is None else caches[i])
        return self.out(self.norm(x))  # (B, T, V)


def set_attention_backend(model: nn.Module, backend: str) -> nn.Module:
    """Switch every ``MultiHeadAttention`` in ``model`` to ``backend`` ("naive" keeps
    the weights for plots, "sdpa" is PyTorch's fused kernel); returns the model."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.backend = backend
            module._backend_fn()  # fail now on an unknown name
    return model
