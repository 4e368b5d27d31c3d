"""Framed messages between the trusted re-check and the worker that runs learner code.

Each message is ``torch.save`` of plain data, prefixed by its length; it is read back with
``torch.load(weights_only=True)``, which accepts tensors, numbers, strings, tuples, lists
and dicts and never executes code.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import torch
from torch.utils import _pytree as pytree


def send(stream, payload: Any) -> None:
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def recv(stream) -> Any:
    """The next message. Raises ``EOFError`` when the other side closed the stream."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the worker closed its output")
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    return torch.load(io.BytesIO(data), weights_only=True)


def tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor in nested tuples/lists/dicts, in pytree order."""
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def detach(tree: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda x: x.detach(), tree)
