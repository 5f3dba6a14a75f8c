"""One LRU of numpy arrays bounded in bytes, for every cache that keeps arrays.

Kernel spectra (`primitives/cpu/spectra_cache.py`), decoded input chunks
(`engine/io/chunk_cache.py`) and kept window outputs (`engine/workers/windowed.py`)
are all arrays whose total size must stay under a budget the planner counted, so
they share this one thread-safe implementation. It imports nothing from znni, so
any package may use it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np


class BytesLRU:
    """LRU of arrays whose total `nbytes` never exceeds `max_bytes` (0: keeps nothing)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0  # kept as items come and go: thousands of chunks make a sum slow
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes

    def get(self, key: Hashable) -> np.ndarray | None:
        with self._lock:
            arr = self._items.get(key)
            if arr is not None:
                self._items.move_to_end(key)
            return arr

    def put(self, key: Hashable, arr: np.ndarray) -> bool:
        """Keep `arr`, evicting the least recently used; False if it alone is too big."""
        if arr.nbytes > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._items[key] = arr
            self.nbytes += arr.nbytes
            self._evict(self.max_bytes)
        return True

    def _evict(self, bound: int) -> None:
        """Drop the least recently used until at most `bound` bytes stay (lock held)."""
        while self._items and self.nbytes > bound:
            _, gone = self._items.popitem(last=False)
            self.nbytes -= gone.nbytes

    def get_or_make(self, key: Hashable, nbytes: int, make: Callable[[], np.ndarray]) -> np.ndarray:
        """The kept array, or `make()` (kept if it fits; evicting before allocating)."""
        arr = self.get(key)
        if arr is not None:
            return arr
        if self.fits(nbytes):
            with self._lock:
                self._evict(self.max_bytes - nbytes)
        arr = make()
        self.put(key, arr)
        return arr

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0
