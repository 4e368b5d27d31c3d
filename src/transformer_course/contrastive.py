"""CLIP-style contrastive image-text training: the symmetric InfoNCE loss.

Derived in chapter 8 ("Attention beyond text"). Shape letters: B batch (B matching
image-text pairs), E the shared embedding width, L text length, D d_model.

A batch holds B images and their B captions. Both are mapped into one space and
L2-normalised; the B x B matrix of cosine similarities, times a learned scale
1 / temperature, is read as logits twice: each image must pick its own caption among
the B (cross-entropy along a row) and each caption its own image (along a column).

Sources: Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision" (CLIP), section 2.3 and figure 3 (the loss, in numpy-like
pseudocode), section 2.5 (temperature initialised to 0.07, logit scale clipped at
100, here after the optimiser step as in open_clip); van den Oord et al. 2018
(InfoNCE); Sohn 2016 (the N-pair loss).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.model import Encoder, TransformerConfig
from transformer_course.vision import ImageEncoder

Tensor = torch.Tensor

INIT_TEMPERATURE = 0.07  # CLIP, section 2.5
MAX_LOGIT_SCALE = 100.0  # CLIP clips the scale 1 / temperature at 100


def contrastive_loss(
    image_emb: Tensor,
    text_emb: Tensor,
    logit_scale: Tensor | float,
    *,
    symmetric: bool = True,
) -> Tensor:
    """Symmetric InfoNCE: pair i of the batch is the positive, the other B - 1 the
    negatives, for images and for texts.

        logits = s * normalize(I) @ normalize(T)^T              (B, B)
        loss   = (CE(logits, arange(B)) + CE(logits^T, arange(B))) / 2

    with s = 1 / temperature. ``symmetric=False`` keeps only the image-to-text term.

    Args:
        image_emb, text_emb: (B, E) float; normalised here (their norm is ignored).
        logit_scale: the scale s > 0 (a scalar tensor or float), e.g.
            ``LogitScale()()``, which is exp of a learned log-scale (kept at most 100
            by ``LogitScale.clamp_()`` after each optimiser step).

    Returns:
        The scalar loss (mean over the batch; float32 for float16/bfloat16 inputs, so
        a zero embedding gives no NaN); log(B) for random embeddings.

    Raises:
        ValueError: if the embeddings are not both (B, E) with the same B and E, or
            B < 1, or the scale is not positive.
    Source: Radford et al. 2021, figure 3; van den Oord et al. 2018, equation (4).
    """
    if image_emb.dim() != 2 or image_emb.shape != text_emb.shape or not len(image_emb):
        raise ValueError(
            f"image_emb, text_emb: expected the same shape (B, E) with B >= 1, got "
            f"{tuple(image_emb.shape)} and {tuple(text_emb.shape)}"
        )
    # float32 for half inputs: normalize's eps (1e-12) is 0 in float16 (a zero row: NaN)
    image_emb, text_emb = (
        x.to(torch.promote_types(x.dtype, torch.float32)) for x in (image_emb, text_emb)
    )
    scale = torch.as_tensor(logit_scale, dtype=image_emb.dtype, device=image_emb.device)
    if scale.numel() != 1 or not bool(scale > 0):
        raise ValueError(
            f"logit_scale: expected one positive number, got {logit_scale}"
        )
    logits = scale * F.normalize(image_emb, dim=-1) @ F.normalize(text_emb, dim=-1).T
    labels = torch.arange(len(logits), device=logits.device)  # (B,): pair i is i
    image_to_text = F.cross_entropy(logits, labels)  # each image picks a caption
    if not symmetric:
        return image_to_text
    return (image_to_text + F.cross_entropy(logits.T, labels)) / 2


class LogitScale(nn.Module):
    """The learned scale s = exp(t) = 1 / temperature, as CLIP parameterises it:
    t starts at log(1 / 0.07). ``learned=False`` keeps it fixed (a buffer).
    ``forward()`` -> the scalar s.

    s is capped at 100 the way open_clip does it: the training loop calls
    ``clamp_()`` after each optimiser step, which clips the parameter t to
    [0, log 100] in place. Clamping exp(t) in the forward pass instead (CLIP's first
    code, openai/CLIP issue #46, open_clip issue #104) gives t a gradient of exactly 0
    once it passes log 100: the scale can then never come back down.
    """

    def __init__(self, init_temperature: float = INIT_TEMPERATURE, *, learned=True):
        super().__init__()
        if init_temperature <= 0:
            raise ValueError(f"init_temperature: expected > 0, got {init_temperature}")
        t = torch.tensor(math.log(1 / init_temperature))
        if learned:
            self.log_scale = nn.Parameter(t)
        else:
            self.register_buffer("log_scale", t, persistent=False)

    def forward(self) -> Tensor:
        return self.log_scale.exp()

    @torch.no_grad()
    def clamp_(self) -> LogitScale:
        """Clip t to [0, log MAX_LOGIT_SCALE] in place (s in [1, 100]); call it after
        every ``optimizer.step()``. Returns self. Source: open_clip's training loop
        (``unwrap_model(model).logit_scale.clamp_(0, math.log(100))``)."""
        self.log_scale.clamp_(0.0, math.log(MAX_LOGIT_SCALE))
        return self


class DualEncoder(nn.Module):
    """CLIP in miniature: a pooled image encoder and a pooled text encoder, each with a
    linear projection to a shared space of width ``embed_dim``, L2-normalised.

    - ``encode_image(images)``: (B, H, W) -> (B, E), unit norm.
    - ``encode_text(ids)``: (B, L) right-padded ids -> (B, E), unit norm (mean over
      the real tokens of the library's ``Encoder`` output).
    - ``forward(images, ids)`` -> ``(image_emb, text_emb, logit_scale)``.

    Source: Radford et al. 2021, section 2.4 (linear projections, no non-linearity).
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        image_size: tuple[int, int],
        patch_size: int,
        embed_dim: int = 64,
        *,
        learned_temperature=True,
        temperature: float = INIT_TEMPERATURE,
    ):
        super().__init__()
        self.cfg = cfg
        self.image_encoder = ImageEncoder(cfg, image_size, patch_size, pool=True)
        self.text_encoder = Encoder(cfg)
        self.image_proj = nn.Linear(cfg.d_model, embed_dim, bias=False)
        self.text_proj = nn.Linear(cfg.d_model, embed_dim, bias=False)
        self.logit_scale = LogitScale(temperature, learned=learned_temperature)

    def encode_image(self, images: Tensor) -> Tensor:
        pooled = self.image_encoder(images)[:, 0]  # (B, D)
        return F.normalize(self.image_proj(pooled), dim=-1)  # (B, E)

    def encode_text(self, ids: Tensor) -> Tensor:
        memory, _ = self.text_encoder(ids)  # (B, L, D)
        real = (ids != self.cfg.pad_id).unsqueeze(-1).to(memory.dtype)  # (B, L, 1)
        pooled = (memory * real).sum(1) / real.sum(1).clamp(min=1)  # (B, D)
        return F.normalize(self.text_proj(pooled), dim=-1)  # (B, E)

    def forward(self, images: Tensor, ids: Tensor):
        return self.encode_image(images), self.encode_text(ids), self.logit_scale()


def recall_at_k(similarity: Tensor, target: Tensor, k: int = 1) -> float:
    """Share of rows whose ``target`` column is among the k largest.

    Shapes: similarity (B, C) (queries x candidates), target (B,) int64 -> a float.
    """
    if similarity.dim() != 2 or target.shape != similarity.shape[:1]:
        raise ValueError(
            f"similarity, target: expected (B, C) and (B,), got "
            f"{tuple(similarity.shape)} and {tuple(target.shape)}"
        )
    top = similarity.topk(min(k, similarity.shape[1]), dim=-1).indices  # (B, k)
    return (top == target[:, None]).any(-1).float().mean().item()
