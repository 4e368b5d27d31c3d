"""Measuring speed and memory: one timer that waits for the GPU, the peak bytes of
tensors alive at once, the size of a KV cache and of saved weights, and a recorder of
every forward call (the steps of ``generate``).

Used in chapters 1 (additive vs dot-product attention) and 7 (making attention fast),
and by ``benchmarks/`` and ``tools/gpu_check.py``.

CUDA kernels run asynchronously: a clock read right after a call measures only the
launch. ``best_time`` therefore synchronises the device before starting the clock and
after each call.
"""

from __future__ import annotations

import io
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from transformer_course import _validation

Tensor = torch.Tensor


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def best_time(fn, device=None, repeat: int = 5, *, warmup: int = 1) -> float:
    """Fastest of ``repeat`` calls of ``fn()``, in seconds, under ``torch.no_grad``.

    ``warmup`` calls come first and are not timed (caches, lazy initialisation,
    ``torch.compile``). The minimum is reported because interference from other work
    on the machine only ever adds time.

    Args:
        fn: called with no arguments.
        device: where ``fn`` computes (a ``torch.device`` or a string); on a GPU the
            device is synchronised before the clock starts and after each call.
            Default: the CPU.
        repeat: timed calls (>= 1). warmup: untimed calls first (>= 0).

    Returns:
        Seconds (float).

    Raises:
        TypeError / ValueError: for a non-int or too small ``repeat`` / ``warmup``.
    """
    _validation.positive_int("repeat", repeat)
    _validation.positive_int("warmup", warmup, 0)
    device = torch.device("cpu" if device is None else device)
    best = float("inf")
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        for _ in range(repeat):
            _synchronize(device)
            start = time.perf_counter()
            fn()
            _synchronize(device)
            best = min(best, time.perf_counter() - start)
    return best


@contextmanager
def record_forward(model: nn.Module) -> Iterator[list[tuple[float, Tensor]]]:
    """``with record_forward(model) as steps:`` appends ``(seconds, logits)`` for every
    call of ``model`` inside the block: the seconds since the block began (the device
    synchronised first) and the output's last position, (B, V) for an LM.

    Wraps ``decoding.generate`` to see each step without writing the loop again: the
    next-token logits of every step and the time to the n-th token (chapter 7).
    """
    steps: list[tuple[float, Tensor]] = []
    start = time.perf_counter()

    def hook(module, args, out):
        _synchronize(out.device)
        steps.append((time.perf_counter() - start, out[:, -1].detach()))

    handle = model.register_forward_hook(hook)
    try:
        yield steps
    finally:
        handle.remove()


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: what the weights take on disk."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def kv_cache_bytes_per_token(
    n_layers: int, n_kv_heads: int, d_k: int, dtype: torch.dtype = torch.float32
) -> int:
    """Bytes a KV cache stores per token: 2 (keys and values) x n_layers x n_kv_heads
    x d_k x the size of one element of ``dtype``.

    Raises TypeError / ValueError for a size that is not an int >= 1. Source: Pope et
    al. 2023, "Efficiently Scaling Transformer Inference", section 3.
    """
    _validation.positive_int("n_layers", n_layers)
    _validation.positive_int("n_kv_heads", n_kv_heads)
    _validation.positive_int("d_k", d_k)
    return 2 * n_layers * n_kv_heads * d_k * torch.empty((), dtype=dtype).element_size()


class _TensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storage that PyTorch operators create and that are
    still referenced, and remembers the peak. Views share their base's storage and
    are counted once."""

    def __init__(self):
        super().__init__()
        self.refs: dict[int, tuple[int, int]] = {}  # address -> (tensors, bytes)
        self.live = self.peak = 0

    def _release(self, key: int) -> None:
        count, size = self.refs[key]
        if count > 1:
            self.refs[key] = (count - 1, size)
        else:
            del self.refs[key]
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0:
                continue
            count, size = self.refs.get(key, (0, storage.nbytes()))
            if count == 0:
                self.live += size
                self.peak = max(self.peak, self.live)
            self.refs[key] = (count + 1, size)
            weakref.finalize(t, self._release, key)
        return out


def peak_tensor_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Peak bytes of new tensors alive at once while ``fn()`` runs (under no_grad).

    On a CUDA device this is ``torch.cuda.max_memory_allocated`` minus what was
    allocated before. Elsewhere the tensors each operator returns are counted as they
    are created and freed; scratch buffers that a fused kernel allocates inside itself
    (e.g. the tiles of PyTorch's flash kernel) are not seen.

    Args:
        fn: called with no arguments; what it returns is freed before the count ends.
        device: where ``fn`` computes.

    Returns:
        Bytes (int).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            out = fn()
            torch.cuda.synchronize(device)
        del out
        return torch.cuda.max_memory_allocated(device) - before
    with torch.no_grad(), _TensorBytes() as counter:
        out = fn()
        del out
    return counter.peak
