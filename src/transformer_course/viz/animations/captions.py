"""Chapter 8: a caption written word by word with the patches each word looks at
(cross-attention, Xu et al. 2015 "Show, Attend and Tell"), and CLIP's zero-shot
classification, image by image (Radford et al. 2021, section 3.1.2)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML
from matplotlib.animation import FuncAnimation

from transformer_course import _validation
from transformer_course.viz import style
from transformer_course.viz.animations._frames import as_array
from transformer_course.viz.animations._player import animation_html


def _caption_frames(image, words: Sequence[str], weights, patch: int):
    """The figure of ``caption_animation`` and its frame function: (fig, update, n)."""
    img = as_array("image", image, 2, "(H, W)")
    w = as_array("weights", weights, 2, "(T, N)")
    _validation.positive_int("patch", patch)
    h, wd = img.shape
    if h % patch or wd % patch:
        raise ValueError(
            f"patch: expected a divisor of H = {h} and W = {wd}, got {patch}"
        )
    grid = (h // patch, wd // patch)
    if w.shape != (len(words), grid[0] * grid[1]):
        raise ValueError(
            f"weights: expected (T, N) = ({len(words)}, {grid[0] * grid[1]}): one row "
            f"per word, one column per {patch} x {patch} patch, got {w.shape}"
        )
    n = len(words)
    fig, (ax_i, ax_b) = plt.subplots(
        1, 2, figsize=(8.5, 2.9), dpi=72, gridspec_kw={"width_ratios": [1.6, 1]}
    )
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.2, top=0.78, wspace=0.25)
    ax_i.imshow(img, cmap="gray_r")
    ax_i.axis("off")
    vmax = float(w.max()) or 1.0
    spread = np.ones((patch, patch))  # each patch's weight over its pixels
    overlay = ax_i.imshow(
        np.kron(w[0].reshape(grid), spread), cmap="magma", alpha=0.6, vmin=0, vmax=vmax
    )
    patches = np.arange(w.shape[1])
    bars = ax_b.bar(patches, w[0], color=style.ROLE_COLORS["attention"])
    ax_b.set_ylim(0, 1.05)
    ax_b.set_xticks(patches, [str(p + 1) for p in patches])
    ax_b.set_xlabel("patch (left to right)")
    ax_b.set_ylabel("attention weight")
    title = fig.suptitle("")

    def update(frame: int):
        overlay.set_data(np.kron(w[frame].reshape(grid), spread))
        for bar, height in zip(bars, w[frame]):
            bar.set_height(height)
        written = " ".join(words[: frame + 1])
        title.set_text(f"word {frame + 1} of {n}: \u201c{written}\u201d")
        return (overlay, *bars, title)

    update(0)  # the still frame before play: the first word and where it looks
    return fig, update, n


def caption_animation(
    image, words: Sequence[str], weights, *, patch: int, interval: int = 700
) -> HTML:
    """A caption written word by word, with where each word looks (chapter 8).

    Frame t shows the image with word t's cross-attention over the patches laid over it
    (each patch's weight spread over its pixels, brighter = more weight), the same
    weights as bars per patch, and the caption written so far as the title.

    Args:
        image: (H, W) the image.
        words: T words of the caption, in order (e.g. with a final "<eos>").
        weights: (T, N) cross-attention of each word over the N = (H/p)(W/p) patches,
            in row-major patch order (``vision.cross_attention``'s rows).
        patch: p, the side of a square patch in pixels.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), T frames.

    Raises:
        ValueError: an image that is not 2-D, a ``patch`` that does not divide it, or
            weights that are not (T, N).
        TypeError: a ``patch`` that is not an int.
    """
    fig, update, n = _caption_frames(image, words, weights, patch)
    anim = FuncAnimation(fig, update, frames=n, interval=interval, blit=False)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: the caption '{' '.join(words)}' written one "
            "word a frame, with that word's cross-attention over the image patches "
            "laid over the image and drawn as bars, one per patch"
        ),
    )


def _zero_shot_frames(images, similarity, class_names: Sequence[str], true):
    """The figure of ``zero_shot_animation`` and its frame function: (fig, update, n)."""
    imgs = as_array("images", images, 3, "(M, H, W)")
    sim = as_array("similarity", similarity, 2, "(M, C)")
    if sim.shape != (imgs.shape[0], len(class_names)):
        raise ValueError(
            f"similarity: expected (M, C) = ({imgs.shape[0]}, {len(class_names)}): one "
            f"row per image, one column per class name, got {sim.shape}"
        )
    true = list(range(len(imgs))) if true is None else [int(c) for c in true]
    if len(true) != len(imgs) or not all(0 <= c < len(class_names) for c in true):
        raise ValueError(
            f"true: expected {len(imgs)} class indices in [0, {len(class_names)}), "
            f"got {true}"
        )
    n = len(imgs)
    fig, (ax_i, ax_b) = plt.subplots(
        1, 2, figsize=(8.5, 3.2), dpi=72, gridspec_kw={"width_ratios": [1, 2.2]}
    )
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.3, top=0.84, wspace=0.25)
    picture = ax_i.imshow(imgs[0], cmap="gray_r")
    ax_i.axis("off")
    classes = np.arange(len(class_names))
    bars = ax_b.bar(classes, sim[0])
    low, high = float(min(sim.min(), 0.0)), float(sim.max())
    ax_b.set_ylim(low - 0.05 * (high - low + 1e-9), high * 1.1 + 1e-9)
    ax_b.set_xticks(classes, class_names, rotation=45, ha="right")
    ax_b.set_ylabel("cosine similarity")
    ax_b.axhline(0, color="grey", lw=0.5)
    title = fig.suptitle("")
    best_color = style.ROLE_COLORS["query"]
    other = style.tint(style.ROLE_COLORS["key"], 0.45)

    def update(frame: int):
        picture.set_data(imgs[frame])
        best = int(sim[frame].argmax())
        for c, bar in enumerate(bars):
            bar.set_height(sim[frame, c])
            bar.set_color(best_color if c == best else other)
        verdict = "right" if best == true[frame] else "wrong"
        title.set_text(
            f"image {frame + 1} of {n} ({class_names[true[frame]]}): closest "
            f"caption \u201c{class_names[best]}\u201d, {verdict}"
        )
        return (picture, *bars, title)

    update(0)  # the still frame before play: one image classified
    return fig, update, n


def zero_shot_animation(
    images,
    similarity,
    class_names: Sequence[str],
    *,
    true: Sequence[int] | None = None,
    interval: int = 900,
) -> HTML:
    """Zero-shot classification with a CLIP-style model, one image a frame (chapter 8).

    Frame i shows image i and, as bars, its cosine similarity with the caption of each
    class; the closest caption (the prediction) is drawn in the query colour, and the
    title says whether it is the image's class.

    Args:
        images: (M, H, W) the images, one a frame.
        similarity: (M, C) cosine similarity of each image's vector with each class
            caption's vector.
        class_names: C captions (the class names).
        true: M class indices, the right class of each image; default: image i is
            class i.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), M frames.

    Raises:
        ValueError: images not (M, H, W), a similarity that is not (M, C), or ``true``
            with the wrong length or a class index outside [0, C).
    """
    fig, update, n = _zero_shot_frames(images, similarity, class_names, true)
    anim = FuncAnimation(fig, update, frames=n, interval=interval, blit=False)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: one test image a frame and a bar chart of its "
            f"cosine similarity with the {len(class_names)} captions "
            f"{', '.join(class_names)}; the closest caption, the zero-shot "
            "prediction, is highlighted"
        ),
    )
