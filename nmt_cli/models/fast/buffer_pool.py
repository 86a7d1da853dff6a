"""Buffers for decoding caches on a CPU, kept from one batch to the next.

A batch's self-attention cache takes tens of MB. glibc serves blocks that large from
fresh pages (mmap) and returns them to the system when they are freed, so every batch
paid the page faults of touching its cache anew, and writes to fresh pages are much
slower than to memory already touched. A `BufferPool` keeps up to MAX_BUFFERS buffers for
as long as the model lives, and hands one out again once the tensor it was last handed
out as is gone. (On a GPU, torch's caching allocator does this already.)
"""

from __future__ import annotations

import math
import threading
import weakref

import torch
from torch import Tensor

# A cache holds at most three buffers at once: the row-major cache and its spare while
# one of them is copied into a larger buffer.
MAX_BUFFERS = 4


class BufferPool:
    """Flat CPU buffers, each handed out as one tensor at a time (see the module docstring).

    Only the tensor handed out is tracked: a view taken from it must not outlive it
    (the decoding cache takes such views for one step at a time).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (flat buffer, weak reference to the tensor it was last handed out as)
        self._buffers: list[tuple[Tensor, weakref.ref]] = []

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """An uninitialised contiguous CPU tensor, in a free pooled buffer when one is large enough.

        The smallest free buffer that fits is taken, so that a small cache does not hold
        on to a large buffer that the next step's growth would want.
        """
        numel = math.prod(shape)
        # Never inference tensors: a buffer first used under torch.inference_mode (as
        # search.generate runs) may next back a cache written in place outside it.
        with self._lock, torch.inference_mode(False):
            free = [i for i, (_, user) in enumerate(self._buffers) if user() is None]
            fitting = [i for i in free if self._buffers[i][0].dtype == dtype and self._buffers[i][0].numel() >= numel]
            if fitting:
                index = min(fitting, key=lambda i: self._buffers[i][0].numel())
                flat = self._buffers.pop(index)[0]
            elif len(self._buffers) < MAX_BUFFERS or free:
                if len(self._buffers) >= MAX_BUFFERS:  # make room: drop the smallest free buffer
                    del self._buffers[min(free, key=lambda i: self._buffers[i][0].numel())]
                flat = torch.empty(numel, dtype=dtype)
            else:  # every kept buffer is in use: this one is not kept
                return torch.empty(shape, dtype=dtype)
            tensor = flat[:numel].view(shape)
            self._buffers.append((flat, weakref.ref(tensor)))
            return tensor

    def __deepcopy__(self, memo: dict) -> "BufferPool":
        return BufferPool()  # scratch memory, not state: a copy starts empty

    def __reduce__(self):
        return (BufferPool, ())
