"""Handwritten-digit number images for chapter 8: scikit-learn's ``load_digits``.

scikit-learn ships 1,797 real handwritten digits (8 x 8 pixels, 13 writers; Alpaydin and
Kaynak 1998, the UCI "optical recognition of handwritten digits" set) inside the
package, so nothing is downloaded. ``split_digit_images`` splits the *images* into
train / valid / test before anything is built from them; ``number_images`` places the
images of a number's digits side by side, the input of chapter 8's captioner.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch

Tensor = torch.Tensor

DIGIT_SIZE = 8  # scikit-learn's digits are 8 x 8 pixels


@cache
def _load_digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()  # ships inside scikit-learn: nothing is downloaded
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # ink in [0, 1]
    return images, torch.tensor(digits.target, dtype=torch.long)


def split_digit_images(
    fractions: tuple[float, float, float] = (0.7, 0.15, 0.15), seed: int = 0
) -> dict[str, tuple[Tensor, Tensor]]:
    """scikit-learn's 1,797 real handwritten digits (8 x 8, 13 writers), split into
    train / valid / test *images* by a seeded permutation, before anything is built
    from them, so no test image is ever seen in training. The split is of images, not
    of writers: the same 13 writers appear in every part.

    Returns:
        dict split -> (images (n, 8, 8) float32 ink in [0, 1], labels (n,) int64).

    Raises:
        ValueError: for fractions that are not three positive numbers summing to 1.
    Source: Alpaydin and Kaynak 1998 (UCI optical recognition of handwritten digits).
    """
    if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(
            f"fractions: expected three positive numbers summing to 1, got {fractions}"
        )
    images, labels = _load_digits()
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_train, n_valid = int(fractions[0] * len(perm)), int(fractions[1] * len(perm))
    parts = {
        "train": perm[:n_train],
        "valid": perm[n_train : n_train + n_valid],
        "test": perm[n_train + n_valid :],
    }
    return {name: (images[idx], labels[idx]) for name, idx in parts.items()}


def number_images(
    numbers: Sequence[int] | Tensor,
    images: Tensor,
    labels: Tensor,
    *,
    n_cells: int = 4,
    shift: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One image per number: the images of its digits side by side.

    The canvas has ``n_cells`` cells of 8 x 8 pixels; the number is right-aligned
    (units in the last cell, blank cells on the left). Each digit is a random image of
    that digit drawn from ``(images, labels)`` (one split of ``split_digit_images``),
    moved by up to ``shift`` pixels in each direction inside its cell (zero fill).

    Shapes: numbers (B,) ints in [0, 10 ** n_cells); returns (B, 8, 8 * n_cells) float32.

    Raises:
        ValueError: for a number outside [0, 10 ** n_cells), or a digit that has no
            image in ``labels``.
    """
    numbers = torch.as_tensor(numbers, dtype=torch.long).reshape(-1)  # (B,)
    if numbers.numel() and (numbers.min() < 0 or numbers.max() >= 10**n_cells):
        raise ValueError(
            f"numbers: expected values in [0, {10**n_cells}), got "
            f"{numbers.min().item()} .. {numbers.max().item()}"
        )
    S, B = DIGIT_SIZE, len(numbers)
    pool = [torch.nonzero(labels == d).flatten() for d in range(10)]
    cells = torch.zeros(B, n_cells, S, S)  # (B, cells, 8, 8), cell n_cells-1 = units
    padded = torch.nn.functional.pad(images, (shift,) * 4)  # (n, 8 + 2s, 8 + 2s)
    ar = torch.arange(S)
    for d in range(10):
        k = torch.arange(n_cells)  # k = 0 is the units digit, in the last cell
        digit = (numbers[:, None] // 10**k) % 10  # (B, cells)
        shown = (numbers[:, None] >= 10**k) | (k == 0)  # no leading zeros
        rows, ks = torch.nonzero(shown & (digit == d), as_tuple=True)
        if len(rows) == 0:
            continue
        if len(pool[d]) == 0:
            raise ValueError(f"labels: no image of the digit {d} to draw from")
        pick = pool[d][torch.randint(len(pool[d]), (len(rows),), generator=generator)]
        dy, dx = torch.randint(2 * shift + 1, (2, len(rows)), generator=generator)
        crops = padded[
            pick[:, None, None],
            (dy[:, None, None] + ar[None, :, None]),
            (dx[:, None, None] + ar[None, None, :]),
        ]  # (M, 8, 8)
        cells[rows, n_cells - 1 - ks] = crops
    return cells.permute(0, 2, 1, 3).reshape(B, S, n_cells * S)  # (B, 8, 8 * cells)
