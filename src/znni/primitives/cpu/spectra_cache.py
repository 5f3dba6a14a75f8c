"""Kernel spectra kept between patches, in an LRU bounded in bytes.

Spectra are Cin*Cout*Nz*Ny*(Nx/2+1)*8 bytes (6.9 GB for 80x80 at 64^3), so
what fits decides between "fft-keep" and "fft-recompute". The key holds
everything that shapes the spectra: a digest of the weight bytes, the weight
shape and dtype, and the padded transform size.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from znni.primitives.base import Triple


def spectra_key(weight: np.ndarray, padded: Triple) -> Hashable:
    """Cache key of the spectra of `weight` transformed at `padded`."""
    w = np.ascontiguousarray(weight)
    digest = hashlib.blake2b(w.view(np.uint8).reshape(-1), digest_size=16).hexdigest()
    return (digest, w.shape, w.dtype.str, tuple(padded))


class SpectraCache:
    """LRU of arrays whose total `nbytes` never exceeds `max_bytes` (0: keeps nothing).
    Also the engine's byte-bounded LRU of kept window outputs and input chunks."""

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
        """Cached spectra, or `make()` (kept if they fit; evicting before allocating)."""
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
