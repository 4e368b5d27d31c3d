"""The full Transformer (encoder-decoder) and a GPT-style decoder-only language model.

Derived in chapter 6 ("The full Transformer"); ``DecoderOnlyLM`` is used in chapters 4
and 7, and in chapter 10 with the config of a Llama-family model (RMSNorm, SwiGLU,
RoPE, grouped-query attention, no biases, tied unscaled embeddings: ``pretrained``'s
SmolLM2-135M-Instruct is one). Shape letters: B batch, S source length (or all tokens
so far), T target length (or new tokens), D d_model, H heads, V vocabulary.

    Transformer: Encoder (N x [self-attention, feed-forward]) and Decoder
    (N x [masked self-attention, cross-attention, feed-forward]), each a stack of
    ``layers.TransformerLayer``, pre-LN or post-LN.

Positions (``TransformerConfig.positional``): "sinusoidal" (the paper) or "learned"
vectors added to the token embeddings, "rope" (queries and keys rotated inside every
self-attention), "alibi" (a bias on every self-attention's scores) or "none" (no
positions; chapter 4's baseline). Positions come from ``positional.position_ids``:
offset by a KV cache, and counted over real tokens only when an ``attention_mask``
marks left padding.

Masks are bool with True = may attend. Token id ``cfg.pad_id`` is padding.

Sources:
    Vaswani et al. 2017, "Attention Is All You Need", sections 3.1-3.5 (3.4 for the
    sqrt(d_model) embedding scale and weight tying); Xiong et al. 2020 (pre-LN);
    Press and Wolf 2017 (tied embeddings); Radford et al. 2019 (GPT-2); Su et al. 2021
    (RoPE); Press et al. 2022 (ALiBi); Touvron et al. 2023 (LLaMA); Ainslie et al.
    2023 (GQA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.alibi import alibi_bias
from transformer_course.attention import MultiHeadAttention
from transformer_course.layers import FEED_FORWARDS, NORMS, TransformerLayer, make_norm
from transformer_course.masks import causal_mask, combine_masks, padding_mask
from transformer_course.positional import (
    LAYOUTS,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    position_ids,
)

Tensor = torch.Tensor
POSITIONAL = ("sinusoidal", "learned", "rope", "alibi", "none")


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and switches of a Transformer (defaults: the chapter 6 translator).

    The fields after ``positional`` make a modern decoder (chapter 10); their defaults
    keep the 2017 model. Hugging Face's ``LlamaConfig`` names in brackets.

    Raises:
        ValueError: d_model not a multiple of n_heads (without ``head_dim``),
            n_kv_heads not a divisor of n_heads, an unknown activation, norm,
            positional or rope_layout, ``rope_freq_factors`` not d_k/2 numbers > 0.

    ``rope_freq_factors`` divide RoPE's frequencies, one factor a pair (llama.cpp's
    ``rope_freqs``; Hugging Face's ``rope_parameters`` of type "llama3" or "linear"
    become such factors in ``checkpoint_keys.llama_config_from_hf``); a tuple.
    """

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
    activation: str = "relu"  # "relu" (the paper), "gelu" (GPT-2), "swiglu" (LLaMA)
    backend: str = "naive"  # attention backend; "sdpa" is faster, gives no weights
    layer_norm_eps: float = 1e-5  # the norms' epsilon [rms_norm_eps]
    positional: str = "sinusoidal"  # or "learned", "rope", "alibi", "none" (chapter 4)
    n_kv_heads: int | None = None  # key/value heads, GQA [num_key_value_heads]
    head_dim: int | None = None  # d_k, default d_model / n_heads [head_dim]
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    bias: bool = True  # biases in attention (and feed-forward) [attention_bias]
    ff_bias: bool | None = None  # the feed-forward's, None: as bias [mlp_bias]
    rope_base: float = 10000.0  # RoPE's frequency base [rope_theta]
    rope_freq_factors: tuple[float, ...] | None = None  # theta_i / f_i, d_k/2 of them
    rope_layout: str = "half"  # RoPE's pairs: "half" (HF) or "interleaved" (GGUF)
    scale_embeddings: bool = True  # token embeddings times sqrt(d_model) (3.4)

    def __post_init__(self):
        if self.head_dim is None:
            _validation.multiple("d_model", self.d_model, "n_heads", self.n_heads)
        if self.n_kv_heads is not None:
            _validation.divisor("n_kv_heads", self.n_kv_heads, "n_heads", self.n_heads)
        _validation.one_of("activation", self.activation, FEED_FORWARDS)
        _validation.one_of("norm", self.norm, NORMS)
        _validation.one_of("positional", self.positional, POSITIONAL)
        _validation.one_of("rope_layout", self.rope_layout, LAYOUTS)
        if self.rope_freq_factors is not None:
            factors = tuple(float(f) for f in self.rope_freq_factors)
            object.__setattr__(self, "rope_freq_factors", factors)  # hashable
            good = all(math.isfinite(f) and f > 0 for f in factors)
            if len(factors) != self.d_k // 2 or not good:
                raise ValueError(
                    f"rope_freq_factors: expected d_k / 2 = {self.d_k // 2} finite "
                    f"factors > 0, got {factors}"
                )

    @property
    def d_k(self) -> int:
        """Size of one attention head."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers


class InputEmbedding(nn.Module):
    """The model's input: token embedding times sqrt(d_model) (unless
    ``cfg.scale_embeddings`` is False, as in GPT-2 and LLaMA), plus a position vector
    for "sinusoidal" and "learned" positions (nothing for "rope" and "alibi"), then
    dropout.

    ``forward(ids, positions)``: ids (B, L), positions (L,) or (B, L) -> (B, L, D).
    Source: Vaswani et al. 2017, sections 3.4, 3.5.
    """

    def __init__(self, vocab_size: int, cfg: TransformerConfig):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, cfg.d_model)
        nn.init.normal_(self.tokens.weight, std=cfg.d_model**-0.5)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.dropout = nn.Dropout(cfg.dropout)
        self.positions = None
        if cfg.positional == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len)
        elif cfg.positional == "learned":
            self.positions = LearnedPositionalEmbedding(cfg.d_model, cfg.max_len)

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        x = self.tokens(ids)  # (B, L, D)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positions is not None:
            x = self.positions(x, positions)  # (B, L, D)
        return self.dropout(x)


def _layers(cfg: TransformerConfig, n: int, *, cross_attention: bool) -> nn.ModuleList:
    rotary = None
    if cfg.positional == "rope":
        rotary = RotaryEmbedding(
            cfg.d_k,
            base=cfg.rope_base,
            layout=cfg.rope_layout,
            freq_factors=cfg.rope_freq_factors,
        )
    return nn.ModuleList(
        TransformerLayer(
            cfg.d_model,
            cfg.n_heads,
            cfg.d_ff,
            cfg.dropout,
            cross_attention=cross_attention,
            norm_first=cfg.norm_first,
            activation=cfg.activation,
            backend=cfg.backend,
            eps=cfg.layer_norm_eps,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            norm=cfg.norm,
            bias=cfg.bias,
            ff_bias=cfg.ff_bias,
            rotary=rotary,
        )
        for _ in range(n)
    )


def _final_norm(cfg: TransformerConfig) -> nn.Module:
    """Pre-norm stacks end with a norm (their residual stream is never normalised);
    post-norm layers already end in one."""
    if cfg.norm_first:
        return make_norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps)
    return nn.Identity()


def _past_length(caches, n_layers: int) -> int:
    if caches is None:
        return 0
    if len(caches) != n_layers:
        raise ValueError(
            f"caches: expected one cache per layer ({n_layers}), got {len(caches)}"
        )
    return caches[0].length


def _alibi(cfg: TransformerConfig, q_len: int, key_positions: Tensor) -> Tensor | None:
    """ALiBi's bias (H, T, S) or (B, H, T, S) for the last T of the S keys, or None."""
    if cfg.positional != "alibi":
        return None
    return alibi_bias(
        cfg.n_heads, q_len, key_positions.shape[-1], positions=key_positions
    )


class Encoder(nn.Module):
    """Embedding, ``cfg.n_layers`` layers, and a final LayerNorm when pre-LN.

    ``forward(src)``: src ids (B, S) -> ``(memory (B, S, D), src_mask (B, 1, 1, S))``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = InputEmbedding(cfg.src_vocab_size, cfg)
        self.layers = _layers(cfg, cfg.n_layers, cross_attention=False)
        self.norm = _final_norm(cfg)

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor]:
        _validation.token_ids("src", src, self.cfg.src_vocab_size, self.cfg.max_len)
        src_mask = padding_mask(src, self.cfg.pad_id)  # (B, 1, 1, S)
        positions = position_ids(src.shape[1], device=src.device)  # (S,)
        bias = _alibi(self.cfg, src.shape[1], positions)  # (H, S, S) or None
        x = self.embed(src, positions)  # (B, S, D)
        for layer in self.layers:
            x = layer(x, src_mask, bias=bias, positions=positions)
        return self.norm(x), src_mask


class Decoder(nn.Module):
    """Embedding, layers with cross-attention, final LayerNorm when pre-LN, and the
    output projection to vocabulary logits (tied to the embedding if
    ``tie_embeddings``).

    ``forward(tgt, memory, src_mask, *, caches=None)``: tgt ids (B, T), memory
    (B, S, D), src_mask (B, 1, 1, S); ``caches`` one ``KVCache`` per layer: then
    ``tgt`` holds only the new tokens, placed after the cached ones. Returns logits
    (B, T, V).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = InputEmbedding(cfg.tgt_vocab_size, cfg)
        self.layers = _layers(cfg, cfg.decoder_layers, cross_attention=True)
        self.norm = _final_norm(cfg)
        self.out = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.tokens.weight

    def forward(self, tgt, memory, src_mask, *, caches=None) -> Tensor:
        past = _past_length(caches, len(self.layers))
        cfg = self.cfg
        _validation.token_ids("tgt", tgt, cfg.tgt_vocab_size, cfg.max_len, past)
        T = tgt.shape[1]
        tgt_mask = causal_mask(T, past + T, device=tgt.device)  # (T, past + T)
        if past == 0:  # hide padded target keys too (teacher forcing on a batch)
            tgt_mask = combine_masks(tgt_mask, padding_mask(tgt, cfg.pad_id))
        positions = position_ids(T, offset=past, device=tgt.device)  # (T,)
        bias = _alibi(cfg, T, position_ids(past + T, device=tgt.device))
        x = self.embed(tgt, positions)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                tgt_mask,
                memory=memory,
                memory_mask=src_mask,
                bias=bias,
                positions=positions,
                cache=None if caches is None else caches[i],
            )
        return self.out(self.norm(x))  # (B, T, V)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of Vaswani et al. 2017 (section 3, figure 1);
    ``make_model(cfg)`` builds and initialises one.

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

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.encoder(src)

    def decode(self, tgt, memory, src_mask, *, caches=None) -> Tensor:
        return self.decoder(tgt, memory, src_mask, caches=caches)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        memory, src_mask = self.encode(src)
        return self.decode(tgt, memory, src_mask)


def output_projection(out: nn.Linear, x: Tensor) -> Tensor:
    """``out(x)``, the logits (..., V) of x (..., D), with the weight W (V, D) as the
    left operand when x has 2 to 16 rows on the CPU: (W x^T)^T is the same product,
    but there MKL reads W once at GEMM speed, where x W^T for a few rows runs slower
    than for one (measured on SmolLM2's 49152 x 576 head, one thread: 2 rows 21 ms
    -> 5.5 ms, 5 rows 18 -> 10 ms, 1 row 9.7 ms either way). Speculative decoding's
    verifying passes and batched decoding steps have that many rows. Equal up to float
    rounding (another summation order). Any other ``out`` module, device or row count,
    and a head with hooks (a trace of the model), is called as it is.
    """
    rows = x.reshape(-1, x.shape[-1])  # (N, D)
    few = 1 < len(rows) <= 16 and x.device.type == "cpu"
    hooked = out._forward_hooks or out._forward_pre_hooks
    if not few or hooked or type(out) is not nn.Linear:
        return out(x)
    y = torch.mm(out.weight, rows.T).T  # (N, V), computed as (V, N)
    if out.bias is not None:
        y = y + out.bias
    return y.contiguous().reshape(*x.shape[:-1], -1)  # (..., V)


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: token embedding (+ positions), a stack of causal
    self-attention ``TransformerLayer``s, final norm (pre-norm) and the output
    projection (tied to the embedding if ``tie_embeddings``). Reads
    ``cfg.tgt_vocab_size`` (the vocabulary V), ``n_layers``, ``d_model``, ...,
    ``positional``. With ``norm="rms"``, ``activation="swiglu"``, ``positional="rope"``,
    ``n_kv_heads``, ``bias=False``, ``scale_embeddings=False`` and tied embeddings it
    is a Llama-family model, equal to Hugging Face's ``LlamaForCausalLM`` with the same
    weights (``interop.load_hf_llama``).

    ``forward(ids, *, attention_mask=None, caches=None, logits_to_keep=None)``: ids
    (B, T) -> logits (B, T, V); position t predicts token t + 1. ``logits_to_keep=n``
    (Hugging Face's name) projects only the last n positions, (B, n, V): generation
    needs the last one only, and the projection to a 49k vocabulary is the largest
    matrix of a small LLM (``output_projection``). With ``caches`` (one ``KVCache`` per
    layer, ``decoding.new_caches``) ``ids`` holds only the new tokens, placed after the
    S_past cached ones. ``attention_mask`` bool (B, S_past + T) over all tokens so far,
    True = real token: padded keys are hidden and positions count real tokens only, so
    a left-padded row gives the logits of its prompt alone (padded rows' logits are
    meaningless), with every ``positional`` kind.

    Raises: as ``Transformer``, plus an ``attention_mask`` that is not bool
    (B, S_past + T), a ``logits_to_keep`` that is not an int >= 1. Source: Radford et
    al. 2018/2019 (GPT, GPT-2); Touvron et al. 2023 (LLaMA).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = InputEmbedding(cfg.tgt_vocab_size, cfg)
        self.layers = _layers(cfg, cfg.n_layers, cross_attention=False)
        self.norm = _final_norm(cfg)
        self.out = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.tokens.weight

    def forward(
        self, ids: Tensor, *, attention_mask=None, caches=None, logits_to_keep=None
    ) -> Tensor:
        past = _past_length(caches, len(self.layers))
        cfg = self.cfg
        _validation.token_ids("ids", ids, cfg.tgt_vocab_size, cfg.max_len, past)
        if logits_to_keep is not None:
            _validation.positive_int("logits_to_keep", logits_to_keep)
        B, T = ids.shape
        mask = None  # one new token (T = 1) may see every key: causal_mask is all True
        if T > 1:
            mask = causal_mask(T, past + T, device=ids.device)  # (T, S)
        if attention_mask is not None:
            _validation.keep_mask("attention_mask", attention_mask, (B, past + T))
            mask = combine_masks(mask, attention_mask[:, None, None, :])  # (B, 1, T, S)
        key_pos = position_ids(past + T, keep=attention_mask, device=ids.device)
        positions = key_pos[..., past:]  # (T,) or (B, T): the new tokens'
        bias = _alibi(cfg, T, key_pos)  # (H, T, S), (B, H, T, S) or None
        x = self.embed(ids, positions)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            x = layer(x, mask, bias=bias, positions=positions, cache=cache)
        if logits_to_keep is not None:
            x = x[:, -logits_to_keep:]  # (B, n, D): the last n positions only
        return output_projection(self.out, self.norm(x))  # (B, T, V) or (B, n, V)


def make_model(cfg: TransformerConfig) -> Transformer:
    """The factory of the encoder-decoder ``Transformer``: build it from ``cfg`` and
    initialise every matrix except the embeddings with Xavier (Glorot) uniform, as
    annotated-transformer's ``make_model`` and PyTorch's ``nn.Transformer`` do;
    ``Transformer(cfg)`` alone keeps the modules' default initialisation.

    Source: Glorot and Bengio 2010; Rush 2018, "The Annotated Transformer".
    """
    model = Transformer(cfg)
    for name, p in model.named_parameters():
        if p.dim() > 1 and "embed" not in name:
            nn.init.xavier_uniform_(p)
    return model


def set_attention_backend(model: nn.Module, backend: str) -> nn.Module:
    """Switch every ``MultiHeadAttention`` in ``model`` to ``backend`` ("naive" keeps
    the weights for plots, "sdpa" is PyTorch's fused kernel); returns the model."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.backend = backend
            module._backend_fn()  # fail now on an unknown name
    return model
