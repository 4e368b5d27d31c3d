"""Choosing where tensors live, and making runs repeatable.

Derived in the preface ("Running the chapters"). Every chapter starts with
``device = get_device()`` so the same cells use a GPU in Colab and the CPU on a laptop,
and ``set_cpu_threads()`` so that PyTorch uses the cores this machine gives it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch

from transformer_course import _validation

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


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """``with seeded(seed):`` runs the block on PyTorch's CPU random stream seeded
    with ``seed``, then gives the caller's stream back exactly as it was
    (``torch.random.fork_rng``). For library code that builds modules (whose
    initialisers draw from the global stream) reproducibly without reseeding the
    caller's process, which ``set_seed`` would do (fairseq2 PR #591).

    Raises:
        TypeError: if ``seed`` is not an int.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class CPUThreads(NamedTuple):
    """What ``set_cpu_threads`` chose: ``threads`` of ``cores``, and why (``reason``:
    ``"argument"``, ``"OMP_NUM_THREADS"``, ``"busy"`` or ``"cores"``)."""

    threads: int
    cores: int
    reason: str

    def __str__(self) -> str:
        busy = ", one thread as the machine is busy" if self.reason == "busy" else ""
        return f"{self.threads} CPU thread(s) of {self.cores} core(s){busy}"


def cpu_cores() -> int:
    """The number of CPU cores this process may run on (its affinity where the OS has
    one, e.g. a container limited to 2 of 64 cores; else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def set_cpu_threads(threads: int | None = None) -> CPUThreads:
    """Set ``torch.set_num_threads`` from the machine's cores and return the choice.

    The number is, in this order: ``threads`` if given; the environment variable
    ``OMP_NUM_THREADS`` if set (the user's choice wins); 1 if the machine is busy (its
    1-minute load average exceeds the cores: threads that fight other programs for a
    core can make a step many times slower); else ``cpu_cores()``. Every chapter calls
    it once after ``get_device()``, so the book build uses the same rule everywhere.

    Args:
        threads: a positive int to force, or None to choose as above.

    Returns:
        A ``CPUThreads(threads, cores, reason)``; ``str()`` of it is a one-line summary.

    Raises:
        TypeError: if ``threads`` is not an int or None.
        ValueError: if ``threads`` < 1, or ``OMP_NUM_THREADS`` is not a positive int.
    """
    cores = cpu_cores()
    if threads is not None:
        _validation.positive_int("threads", threads)
        reason = "argument"
    elif os.environ.get("OMP_NUM_THREADS"):
        value = os.environ["OMP_NUM_THREADS"]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"$OMP_NUM_THREADS: expected a positive int, got {value!r}"
            )
        threads, reason = int(value), "OMP_NUM_THREADS"
    elif hasattr(os, "getloadavg") and os.getloadavg()[0] > cores:
        threads, reason = 1, "busy"
    else:
        threads, reason = cores, "cores"
    torch.set_num_threads(threads)
    return CPUThreads(threads, cores, reason)
