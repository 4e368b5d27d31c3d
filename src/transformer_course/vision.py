"""Images as sequences of patches, a ViT-style image encoder, and an image captioner.

Derived in chapter 8 ("Attention beyond text"). Shape letters: B batch, H and W image
height and width in pixels, p patch size, N = (H / p) * (W / p) patches, D d_model,
T caption length, V vocabulary.

    patchify: (B, H, W) -> (B, N, p * p), patches in row-major order (left to right,
    then top to bottom), each patch's pixels row-major too.
    ImageEncoder: patch embedding (a linear map of each patch) + learned 1-D positions,
    then the encoder layers of the library's ``Encoder`` (Dosovitskiy et al. 2021).
    Captioner: that encoder and the chapter 6 ``Decoder``: the caption's words attend
    to the image patches through cross-attention (Xu et al. 2015, "Show, Attend and
    Tell"), and ``decoding.greedy_decode`` / ``beam_search`` run on it unchanged.

Sources: Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", section 3.1,
equation (1); Xu et al. 2015, sections 3-4.
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_course.attention import MultiHeadAttention
from transformer_course.model import Decoder, Encoder, TransformerConfig
from transformer_course.training import evaluating

Tensor = torch.Tensor


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into non-overlapping square patches, flattened.

    Patch n = r * (W / p) + c holds the pixels of rows r*p .. r*p + p - 1 and columns
    c*p .. c*p + p - 1 (row-major order of patches; row-major pixels inside a patch).
    A plain ``images.reshape(B, -1, p * p)`` is *not* this: it cuts each pixel row
    into strips of p * p pixels that are not squares (the chapter's find-the-bug).

    Shapes: images (B, H, W) -> (B, N, p * p) with N = (H / p) * (W / p).

    Raises:
        TypeError: if ``images`` is not a floating-point tensor.
        ValueError: if it is not 3-D, or H or W is not a multiple of ``patch_size``.
    Source: Dosovitskiy et al. 2021, section 3.1 (x_p in R^{N x (P^2 C)}, here C = 1).
    """
    if not isinstance(images, Tensor) or not images.dtype.is_floating_point:
        what = images.dtype if isinstance(images, Tensor) else type(images).__name__
        raise TypeError(f"images: expected a floating-point tensor, got {what}")
    if images.dim() != 3:
        raise ValueError(f"images: expected shape (B, H, W), got {tuple(images.shape)}")
    B, H, W = images.shape
    p = patch_size
    if p < 1 or H % p or W % p:
        raise ValueError(
            f"patch_size: expected a divisor of H = {H} and W = {W}, got {patch_size}"
        )
    x = images.reshape(B, H // p, p, W // p, p)  # (B, rows, p, cols, p)
    x = x.permute(0, 1, 3, 2, 4)  # (B, rows, cols, p, p)
    return x.reshape(B, (H // p) * (W // p), p * p)  # (B, N, p * p)


class PatchEmbedding(nn.Module):
    """Each flattened patch mapped linearly to d_model, plus a learned position per patch.

    ``forward(images)``: (B, H, W) -> (B, N, D). Learned 1-D positions, as ViT uses
    (its appendix D.4 found 2-D-aware positions no better).
    Source: Dosovitskiy et al. 2021, equation (1) (without the class token).
    """

    def __init__(self, image_size: tuple[int, int], patch_size: int, d_model: int):
        super().__init__()
        H, W = image_size
        if H % patch_size or W % patch_size:
            raise ValueError(
                f"patch_size: expected a divisor of {image_size}, got {patch_size}"
            )
        self.image_size, self.patch_size = (H, W), patch_size
        self.grid = (H // patch_size, W // patch_size)  # (rows, cols) of patches
        self.proj = nn.Linear(patch_size * patch_size, d_model)
        self.positions = nn.Parameter(
            torch.randn(self.grid[0] * self.grid[1], d_model) * 0.02
        )  # (N, D)

    def forward(self, images: Tensor) -> Tensor:
        if images.dim() != 3 or tuple(images.shape[1:]) != self.image_size:
            raise ValueError(
                f"images: expected shape (B, {self.image_size[0]}, "
                f"{self.image_size[1]}), got {tuple(images.shape)}"
            )
        return (
            self.proj(patchify(images, self.patch_size)) + self.positions
        )  # (B, N, D)


class ImageEncoder(nn.Module):
    """A ViT-style encoder: patch embedding, ``cfg.n_layers`` encoder layers, final norm.

    The layers are those of the library's ``Encoder(cfg)`` (its token embedding is not
    used: patches replace tokens). ``pool=True`` averages the patch vectors into one
    vector, the single image feature a CNN captioner or CLIP reads.

    ``forward(images)``: (B, H, W) -> (B, N, D), or (B, 1, D) when pooled.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        image_size: tuple[int, int],
        patch_size: int,
        *,
        pool: bool = False,
    ):
        super().__init__()
        self.patches = PatchEmbedding(image_size, patch_size, cfg.d_model)
        encoder = Encoder(cfg)  # reuse its layers and final norm, not its embedding
        self.layers, self.norm = encoder.layers, encoder.norm
        self.pool = pool

    def forward(self, images: Tensor) -> Tensor:
        x = self.patches(images)  # (B, N, D)
        for layer in self.layers:
            x = layer(x)  # every patch is real: no mask
        x = self.norm(x)
        return x.mean(dim=1, keepdim=True) if self.pool else x  # (B, 1, D) | (B, N, D)


class Captioner(nn.Module):
    """An image encoder and the chapter 6 decoder: words attend to image patches.

    Has the interface ``decoding.greedy_decode`` and ``beam_search`` expect:

    - ``encode(images)``: (B, H, W) -> ``(memory (B, N, D), mask (B, 1, 1, N))``, the
      mask all True (or N = 1 with ``pool=True``).
    - ``decode(tgt, memory, mask, *, caches=None)`` -> logits (B, T, V).
    - ``forward(images, tgt)`` -> logits (B, T, V) (teacher forcing).

    ``cfg.tgt_vocab_size`` is the caption vocabulary; ``cfg.src_vocab_size`` is unused.
    Source: Xu et al. 2015 (soft attention over image regions), with the Transformer
    decoder of Vaswani et al. 2017.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        image_size: tuple[int, int],
        patch_size: int,
        *,
        pool: bool = False,
    ):
        super().__init__()
        self.cfg = cfg
        self.encoder = ImageEncoder(cfg, image_size, patch_size, pool=pool)
        self.decoder = Decoder(cfg)
        for name, p in self.named_parameters():  # Xavier for matrices, as chapter 6's
            if p.dim() > 1 and "embed" not in name and "positions" not in name:
                nn.init.xavier_uniform_(p)  # Transformer (and nn.Transformer) do

    def encode(self, images: Tensor) -> tuple[Tensor, Tensor]:
        memory = self.encoder(images)  # (B, N, D)
        mask = torch.ones(
            memory.shape[0],
            1,
            1,
            memory.shape[1],
            dtype=torch.bool,
            device=memory.device,
        )  # (B, 1, 1, N): every patch visible
        return memory, mask

    def decode(self, tgt: Tensor, memory: Tensor, mask: Tensor, *, caches=None):
        return self.decoder(tgt, memory, mask, caches=caches)

    def forward(self, images: Tensor, tgt: Tensor) -> Tensor:
        return self.decode(tgt, *self.encode(images))


@torch.no_grad()
def cross_attention(model: Captioner, images: Tensor, tgt: Tensor) -> Tensor:
    """The last decoder layer's cross-attention, averaged over heads.

    Runs ``model(images, tgt)`` once (teacher forcing on ``tgt``, e.g. BOS + the
    decoded caption) and records the weights of the cross-attention module(s) of the
    last decoder layer (a forward hook on the ``MultiHeadAttention`` whose name says
    "cross"). That module runs on the "naive" backend for this call (fused backends
    such as "sdpa" return no weights) and gets its own backend back afterwards.

    Shapes: images (B, H, W), tgt (B, T) -> (B, T, N): row t is where the word read
    at position t (predicting word t + 1) looked.

    Raises:
        RuntimeError: if no cross-attention weights were recorded.
    """
    found: list[Tensor] = []
    layer = model.decoder.layers[-1]
    modules = [
        m
        for name, m in layer.named_modules()
        if isinstance(m, MultiHeadAttention) and "cross" in name
    ]
    backends = [m.backend for m in modules]
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: found.append(out[1]))
        for m in modules
    ]
    try:
        for m in modules:
            m.backend = "naive"  # the backend that returns the weights
        with evaluating(model):  # dropout off, then every module's mode given back
            model(images, tgt)
    finally:
        for h, m, backend in zip(hooks, modules, backends):
            h.remove()
            m.backend = backend
    if not found or found[-1] is None:
        raise RuntimeError(
            "cross_attention: no cross-attention weights recorded in the last "
            "decoder layer"
        )
    return found[-1].mean(dim=1)  # (B, T, N)


def cell_of_patch(grid: tuple[int, int], n_cells: int) -> Tensor:
    """Which digit cell (0 = leftmost) each patch lies in, for images that are
    ``n_cells`` square cells side by side. Shapes: -> (N,) int64, N = rows * cols."""
    rows, cols = grid
    if cols % n_cells:
        raise ValueError(
            f"n_cells: expected a divisor of {cols} patch columns, got {n_cells}"
        )
    col = torch.arange(rows * cols) % cols  # row-major patch order
    return col // (cols // n_cells)  # (N,)
