"""Reusable page-locked host buffers, bounded in bytes and counted.

Pinning host memory (cudaHostAlloc) is slow, so `Device.pinned` hands out views of
pooled blocks. A view's block goes back to the pool when the caller drops the last
reference to the view (a weakref finalizer), so callers need no `give back` call.
Blocks are sized in powers of two (at least 64 KiB) so windows of similar sizes reuse
them. The pool keeps at most `max_bytes` of blocks (in use or idle); past that a request
gets an unpooled block, freed when dropped, and `overflows` counts it. Pinned memory
is host RAM: `held_bytes` is reported beside the device cap, not inside it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np

MIN_BLOCK_BYTES = 1 << 16
DEFAULT_PINNED_BYTES = 1 << 30


def block_size(nbytes: int) -> int:
    """The pooled block size for a request: a power of two >= nbytes, >= 64 KiB."""
    return max(MIN_BLOCK_BYTES, 1 << max(0, int(nbytes) - 1).bit_length())


class PinnedPool:
    """Pooled host blocks from `allocate(nbytes)` (a buffer-protocol object)."""

    def __init__(self, allocate: Callable[[int], Any], max_bytes: int = DEFAULT_PINNED_BYTES
                 ) -> None:
        if max_bytes < 0:
            raise ValueError(f"the pinned pool bound must be >= 0 bytes, got {max_bytes}")
        self._allocate = allocate
        self.max_bytes = int(max_bytes)
        self.held_bytes = 0  # pooled blocks, in use or idle
        self.idle: dict[int, list[Any]] = {}
        self.allocations = 0
        self.reuses = 0
        self.overflows = 0
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """An uninitialised host array of `shape` on a (reused where possible) pinned block."""
        dt = np.dtype(dtype)
        need = int(prod(shape)) * dt.itemsize
        size = block_size(need)
        block, pooled = self._block(size)
        arr = np.ndarray(shape, dtype=dt, buffer=memoryview(block)[:need])
        if pooled:
            weakref.finalize(arr, self._give, size, block)
        return arr

    def _block(self, size: int) -> tuple[Any, bool]:
        with self._lock:
            free = self.idle.get(size)
            if free:
                self.reuses += 1
                return free.pop(), True
            self._evict_idle(self.max_bytes - size)
            pooled = self.held_bytes + size <= self.max_bytes
            if pooled:
                self.held_bytes += size
            else:
                self.overflows += 1
        block = self._allocate(size)  # outside the lock: pinning is slow
        with self._lock:
            self.allocations += 1
        return block, pooled

    def _evict_idle(self, bound: int) -> None:
        """Drop idle blocks (largest first) until at most `bound` bytes are held (lock held)."""
        for size in sorted(self.idle, reverse=True):
            blocks = self.idle[size]
            while blocks and self.held_bytes > bound:
                blocks.pop()
                self.held_bytes -= size

    def _give(self, size: int, block: Any) -> None:
        with self._lock:
            self.idle.setdefault(size, []).append(block)

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(size * len(blocks) for size, blocks in self.idle.items())

    def clear(self) -> None:
        """Drop the idle blocks (blocks in use return to the pool and stay until cleared)."""
        with self._lock:
            self._evict_idle(self.held_bytes - sum(s * len(b) for s, b in self.idle.items()))
