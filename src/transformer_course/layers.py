"""One Transformer layer, used by every model in the library.

A layer is self-attention, optionally cross-attention to an encoder's output, and a
position-wise feed-forward network, each sub-layer wrapped in a residual connection
and a LayerNorm: after the residual sum (post-LN, the 2017 paper and BERT) or before
the sub-layer (pre-LN, GPT-2 and most models since). The encoder, the decoder, the
decoder-only LM (``model.py``), the real MiniLM encoder and the real SmolLM2 decoder
(``pretrained.py``) are all stacks of this one class; ``interop.py`` copies PyTorch's,
Hugging Face's and GGUF weights into it. Chapter 10's modern parts sit beside the
2017 ones: ``RMSNorm`` next to LayerNorm, ``SwiGLU`` next to ``FeedForward``.

Derived in chapter 6 ("The full Transformer") and chapter 10 ("A modern LLM"). Shape
letters: B batch, T length of ``x``, S length of ``memory``, D d_model, H heads.
Masks are bool, True = may attend.

Sources:
    Vaswani et al. 2017, "Attention Is All You Need", sections 3.1 (layers, residual
    connections, LayerNorm) and 3.3 (feed-forward, equation (2)).
    Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"
    (pre-LN); Radford et al. 2019 (GPT-2, pre-LN with GELU); Zhang and Sennrich 2019,
    "Root Mean Square Layer Normalization" (RMSNorm); Shazeer 2020, "GLU Variants
    Improve Transformer" (SwiGLU); Touvron et al. 2023 (LLaMA: both, pre-norm).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course import _validation
from transformer_course.attention import KVCacheLike, MultiHeadAttention
from transformer_course.positional import RotaryEmbedding

Tensor = torch.Tensor
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # the paper's ReLU; GELU (BERT, GPT-2)
FEED_FORWARDS = (*ACTIVATIONS, "swiglu")  # a FeedForward activation, or SwiGLU
NORMS = ("layer", "rms")  # LayerNorm (2017) or RMSNorm (LLaMA)


def apply_dropout(module: nn.Dropout, x: Tensor) -> Tensor:
    """``module(x)``, without the call where it is the identity (eval mode, or p = 0):
    a model runs several per layer, and at one token a step their calls cost time."""
    return module(x) if module.training and module.p > 0 else x


class RMSNorm(nn.Module):
    """Root mean square normalization: y = x / sqrt(mean(x^2) + eps) * g.

    Unlike LayerNorm it neither subtracts the mean nor adds a bias: one statistic
    instead of two, and a learned gain g (``weight``, D) only. Computed in float32 and
    cast back, as LLaMA does, so half-precision inputs do not overflow in x^2. In
    float32 the same steps run as one call of PyTorch's ``F.rms_norm`` (on the CPU bit
    for bit the same result, without a Python call per step).

    Args: d_model D, eps (1e-5 in SmolLM2, 1e-6 in LLaMA). Shapes: (..., D) -> (..., D).
    Raises ValueError if the last dimension of the input is not D.

    Source: Zhang and Sennrich 2019, "Root Mean Square Layer Normalization",
    equation (4); Touvron et al. 2023, section 2.2.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        _validation.positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.ones(d_model))  # the gain g
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"x: expected (..., {self.weight.shape[0]}), got {tuple(x.shape)}"
            )
        if x.dtype == self.weight.dtype == torch.float32:  # the steps below, fused
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., D)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class SwiGLU(nn.Module):
    """Gated feed-forward network FFN(x) = W_down (SiLU(W_gate x) * (W_up x)).

    Two input projections instead of one: the SiLU (Swish) of one gates the other
    elementwise. Three matrices of d_model x d_ff, so a SwiGLU of width 2/3 d_ff has the
    parameters of a ReLU ``FeedForward`` of width d_ff (LLaMA's rule).

    Args: d_model D, hidden width d_ff, dropout on the hidden layer, bias (False in
    LLaMA). Names ``gate_proj``, ``up_proj``, ``down_proj`` as in Hugging Face's Llama.
    Shapes: (..., D) -> (..., D).

    Source: Shazeer 2020, "GLU Variants Improve Transformer", equation (6) (FFN_SwiGLU
    with W = W_gate, V = W_up, W_2 = W_down).
    """

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False
    ):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)  # W
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)  # V
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)  # W_2
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (..., d_ff)
        return self.down_proj(apply_dropout(self.dropout, hidden))


def make_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """``nn.LayerNorm`` ("layer") or ``RMSNorm`` ("rms") of width d_model.
    Raises ValueError for another kind."""
    _validation.one_of("norm", kind, NORMS)
    return nn.LayerNorm(d_model, eps=eps) if kind == "layer" else RMSNorm(d_model, eps)


class FeedForward(nn.Module):
    """Position-wise feed-forward network FFN(x) = W_2 act(W_1 x + b_1) + b_2.

    Args: d_model D, hidden width d_ff, dropout on the hidden layer, activation
    ("relu" or "gelu", the exact erf form). Shapes: (..., D) -> (..., D).

    Source: Vaswani et al. 2017, section 3.3, equation (2).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        _validation.one_of("activation", activation, ACTIVATIONS)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # W_1, b_1
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # W_2, b_2
        self.dropout = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.linear1(x))  # (..., d_ff)
        return self.linear2(apply_dropout(self.dropout, hidden))


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; residuals and norms.

    Args:
        d_model, n_heads, d_ff: sizes D, H and the feed-forward width.
        dropout: on each sub-layer's output and on the attention weights.
        cross_attention: add a sub-layer attending to ``memory`` (a decoder layer).
        norm_first: pre-norm (True) or post-norm (False).
        activation: "relu" or "gelu" (a ``FeedForward``) or "swiglu" (a ``SwiGLU``).
        backend: an ``ATTENTION_BACKENDS`` name. eps: the norms' epsilon.
        n_kv_heads, head_dim: grouped-query self-attention, d_k (``TransformerConfig``
            passes them, as Hugging Face's ``num_key_value_heads``).
        norm: "layer" (LayerNorm) or "rms" (``RMSNorm``).
        bias: whether the attention and feed-forward projections have biases.
        ff_bias: the feed-forward's biases when they differ from the attention's
            (Hugging Face Llama's ``mlp_bias``); None: as ``bias``.
        rotary: a ``RotaryEmbedding`` for the self-attention (``positional="rope"``).

    ``forward(x, mask=None, *, memory=None, memory_mask=None, bias=None, cache=None,
    positions=None, head_mask=None)``: x (B, T, D); ``mask`` bool broadcastable to
    (B, H, T, S_past + T) for the self-attention (causal, padding); ``bias`` float
    offsets of the self-attention scores (ALiBi); ``cache`` a KV cache and
    ``positions`` (T,) or (B, T) for rotary; ``head_mask`` gates (H,) or (B, H) of the
    self-attention heads; ``memory`` (B, S, D) and ``memory_mask`` broadcastable to
    (B, H, T, S) for the cross-attention. Returns (B, T, D). The last weights are kept
    in ``self_attn_weights`` (B, H, T, S_past + T) and ``cross_attn_weights``
    (B, H, T, S).

    Raises:
        ValueError: ``memory`` missing for a cross-attention layer, or given to a
            layer without one; as ``MultiHeadAttention`` for bad shapes.

    Equals ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
    (``batch_first=True``) with the same weights (``interop.load_torch_layer``), for
    both ``norm_first`` settings. Source: Vaswani et al. 2017, section 3.1.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        *,
        cross_attention: bool = False,
        norm_first: bool = True,
        activation: str = "relu",
        backend: str = "naive",
        eps: float = 1e-5,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        norm: str = "layer",
        bias: bool = True,
        ff_bias: bool | None = None,
        rotary: RotaryEmbedding | None = None,
    ):
        super().__init__()
        _validation.one_of("activation", activation, FEED_FORWARDS)
        self.norm_first = norm_first
        attention = partial(
            MultiHeadAttention,
            d_model,
            n_heads,
            head_dim=head_dim,
            dropout=dropout,
            bias=bias,
            backend=backend,
        )
        self.self_attn = attention(n_kv_heads=n_kv_heads, rotary=rotary)
        self.self_attn_norm = make_norm(norm, d_model, eps)
        self.cross_attn = self.cross_attn_norm = None
        if cross_attention:
            self.cross_attn = attention()
            self.cross_attn_norm = make_norm(norm, d_model, eps)
        ff_bias = bias if ff_bias is None else ff_bias
        if activation == "swiglu":
            self.ff = SwiGLU(d_model, d_ff, dropout, ff_bias)
        else:
            self.ff = FeedForward(d_model, d_ff, dropout, activation, ff_bias)
        self.ff_norm = make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout)  # on each sub-layer's output
        self.self_attn_weights: Tensor | None = None
        self.cross_attn_weights: Tensor | None = None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        bias: Tensor | None = None,
        cache: KVCacheLike | None = None,
        positions: Tensor | None = None,
        head_mask: Tensor | None = None,
    ) -> Tensor:
        if (memory is None) != (self.cross_attn is None):
            raise ValueError(
                "memory: expected (B, S, D) exactly when the layer has cross-attention "
                f"(cross_attention={self.cross_attn is not None}), got "
                f"{None if memory is None else tuple(memory.shape)}"
            )
        attend_self = partial(  # the self-attention with this call's arguments
            self._self_attend,
            mask=mask,
            bias=bias,
            cache=cache,
            positions=positions,
            head_mask=head_mask,
        )
        drop = partial(apply_dropout, self.dropout)  # on each sub-layer's output
        ln_self, ln_ff = self.self_attn_norm, self.ff_norm
        ln_cross = self.cross_attn_norm
        if self.norm_first:  # pre-norm: x + f(LN(x))
            x = x + drop(attend_self(ln_self(x)))
            if self.cross_attn is not None:
                x = x + drop(self._cross_attend(ln_cross(x), memory, memory_mask))
            x = x + drop(self.ff(ln_ff(x)))
        else:  # post-norm: LN(x + f(x))
            x = ln_self(x + drop(attend_self(x)))
            if self.cross_attn is not None:
                x = ln_cross(x + drop(self._cross_attend(x, memory, memory_mask)))
            x = ln_ff(x + drop(self.ff(x)))
        return x  # (B, T, D)

    def _self_attend(self, h: Tensor, mask: Tensor | None, **kw) -> Tensor:
        out, weights = self.self_attn(h, h, h, mask, **kw)  # (B, T, D)
        if weights is not None or self.self_attn_weights is not None:
            self.self_attn_weights = weights  # (nn.Module's setattr is slow: if new)
        return out

    def _cross_attend(self, h: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        out, self.cross_attn_weights = self.cross_attn(h, memory, memory, mask)
        return out  # (B, T, D)
