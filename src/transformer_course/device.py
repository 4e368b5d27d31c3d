"""Choosing where tensors live, and making runs repeatable.

Derived in the preface ("Running the chapters"). Every chapter starts with
``device = get_device()`` so the same cells use a GPU in Colab and the CPU on a laptop.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

ENV_VAR = "TRANSFORMER_COURSE_DEVICE"
_KNOWN = ("cuda", "mps", "cpu")


def _available(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return (
            bool(getattr(torch.backends, "mps", None))
            and torch.backends.mps.is_available()
        )
    return kind == "cpu"


def get_device(prefer: str | None = None) -> torch.device:
    """Return the best available device: CUDA, then Apple's MPS, then the CPU.

    Args:
        prefer: ``"cuda"``, ``"mps"`` or ``"cpu"`` (optionally with an index, ``"cuda:1"``)
            to ask for one device. The environment variable ``TRANSFORMER_COURSE_DEVICE``
            overrides both ``prefer`` and the automatic choice, so a whole book build can
            be pinned to the CPU.

    Returns:
        A ``torch.device``.

    Raises:
        ValueError: if the requested device kind is unknown.
        RuntimeError: if the requested device is not available on this machine.
    """
    requested = os.environ.get(ENV_VAR) or prefer
    if requested:
        kind = requested.split(":")[0]
        if kind not in _KNOWN:
            raise ValueError(
                f"device: expected one of {_KNOWN} (from `prefer` or ${ENV_VAR}), "
                f"got {requested!r}"
            )
        if not _available(kind):
            raise RuntimeError(
                f"device: {requested!r} was requested but is not available"
            )
        return torch.device(requested)
    for kind in _KNOWN:
        if _available(kind):
            return torch.device(kind)
    return torch.device("cpu")  # unreachable: the CPU is always available


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's (CPU and CUDA) random generators.

    Args:
        seed: a non-negative integer.

    Raises:
        TypeError: if ``seed`` is not an int.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
