"""Multi-head latent attention (MLA), small: the KV cache holds one latent per token.

Derived in chapter 10 ("A modern LLM"). Grouped-query attention shrinks the cache by
sharing key/value heads; DeepSeek-V2's MLA instead compresses every token into one
latent vector c = W^DKV x of size d_latent and rebuilds all H heads' keys and values
from it, k_h = W^UK_h c and v_h = W^UV_h c. Only c is cached: d_latent numbers per
token and layer instead of 2 H d_k.

The "absorbed" form never rebuilds the keys and values. Since
q_h . k_h = q_h . (W^UK_h c) = ((W^UK_h)^T q_h) . c, each query is moved into the
latent space once, scores are taken against the cached latents directly, and W^UV_h is
folded into the output projection: out = sum_h W^O_h W^UV_h (sum_s a_hs c_s). Both forms
compute the same function (``tests/lib/test_mla.py``).

Simplified against the paper: no low-rank query compression and no decoupled RoPE
keys (DeepSeek-V2 adds a small rotary part per head beside the latent, because a
rotation between q and W^UK would block the absorption). Shape letters: B batch,
T new tokens, S all tokens so far, H heads, d_k head size, D d_model, C d_latent.

Source: DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient
Mixture-of-Experts Language Model", section 2.1.2, equations (9)-(11) and the
absorption remark after (19).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.attention import masked_softmax
from transformer_course.masks import causal_mask

Tensor = torch.Tensor


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention whose keys and values come from a cached latent.

    Args:
        d_model: width D. n_heads: H, dividing D (d_k = D / H unless ``head_dim``).
        d_latent: C, size of the cached latent c = W^DKV x.

    ``forward(x, latent_cache=None, absorbed=False)``: x (B, T, D) float; with
    ``latent_cache`` (a list, appended to) the T tokens follow the cached ones.
    ``absorbed`` uses the absorbed matrices (same result). Returns (B, T, D).

    Raises:
        ValueError: sizes that are not positive or do not divide, x not (B, T, D).
    Source: DeepSeek-AI 2024 (DeepSeek-V2), section 2.1.2.
    """

    def __init__(
        self, d_model: int, n_heads: int, *, d_latent: int, head_dim: int | None = None
    ):
        super().__init__()
        _validation.positive_int("d_latent", d_latent)
        if head_dim is None:
            _validation.multiple("d_model", d_model, "n_heads", n_heads)
            head_dim = d_model // n_heads
        self.n_heads, self.d_k, self.d_latent = n_heads, head_dim, d_latent
        self.d_model = d_model
        d_heads = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, d_heads, bias=False)  # W^Q
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)  # W^DKV
        self.k_up = nn.Linear(d_latent, d_heads, bias=False)  # W^UK of all heads
        self.v_up = nn.Linear(d_latent, d_heads, bias=False)  # W^UV of all heads
        self.out_proj = nn.Linear(d_heads, d_model, bias=False)  # W^O

    def forward(
        self, x: Tensor, latent_cache: list | None = None, absorbed: bool = False
    ) -> Tensor:
        _validation.sequence("x", x, self.d_model)
        B, T, _ = x.shape
        H, d_k = self.n_heads, self.d_k
        c = self.kv_down(x)  # (B, T, C): all that is cached
        if latent_cache is not None:
            latent_cache.append(c)
            c = torch.cat(latent_cache, dim=1)  # (B, S, C)
        S = c.shape[1]
        mask = causal_mask(T, S, device=x.device)  # (T, S), the new queries are last
        q = self.q_proj(x).view(B, T, H, d_k).transpose(1, 2)  # (B, H, T, d_k)
        if not absorbed:  # rebuild every head's keys and values from the latents
            k = self.k_up(c).view(B, S, H, d_k).transpose(1, 2)  # (B, H, S, d_k)
            v = self.v_up(c).view(B, S, H, d_k).transpose(1, 2)  # (B, H, S, d_k)
            a = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), mask)
            heads = (a @ v).transpose(1, 2).reshape(B, T, H * d_k)  # (B, T, H d_k)
            return self.out_proj(heads)
        w_uk = self.k_up.weight.view(H, d_k, self.d_latent)  # (H, d_k, C)
        q_latent = q @ w_uk  # (B, H, T, C): (W^UK_h)^T q_h for every head
        scores = (
            q_latent @ c[:, None].transpose(-2, -1) / math.sqrt(d_k)
        )  # (B, H, T, S)
        context = masked_softmax(scores, mask) @ c[:, None]  # (B, H, T, C)
        return torch.einsum("bhtc,dhc->btd", context, self.absorbed_output())

    def absorbed_output(self) -> Tensor:
        """W^O_h W^UV_h for every head: (D, H, C), the output side of the absorption."""
        H, d_k = self.n_heads, self.d_k
        w_o = self.out_proj.weight.view(self.d_model, H, d_k)  # (D, H, d_k)
        w_uv = self.v_up.weight.view(H, d_k, self.d_latent)  # (H, d_k, C)
        return torch.einsum("dhk,hkc->dhc", w_o, w_uv)  # (D, H, C)

    def cache_numbers_per_token(self) -> int:
        """Numbers one layer caches per token: C, against 2 H d_k for keys and values."""
        return self.d_latent
