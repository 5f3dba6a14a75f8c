"""Tiles of a memory-bound graph kernel on a small shared thread pool.

numpy ufuncs and BLAS release the GIL, so the cache-sized tiles of a normalisation,
a transposed conv or a pooling run on every core; OpenBLAS is pinned to one thread
meanwhile (its own threads would contend with the pool's). Small volumes stay on
the calling thread, where a pool round trip costs more than it saves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from znni.primitives.cpu.threads import blas_single_thread

T = TypeVar("T")
R = TypeVar("R")

# volumes (bytes moved) below this run on the calling thread
PARALLEL_BYTES = 4 << 20
# and above this pin BLAS to one thread even there: OpenBLAS threads its dot
# products and small GEMMs, and on a busy machine one call then stalls for a
# scheduler quantum (8-16 ms seen on the 2-core machine)
PIN_BLAS_BYTES = 64 << 10

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def workers() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(workers(), thread_name_prefix="znni-graph-ops")
        return _pool


def run_tiles(fn: Callable[[Sequence[T]], list[R]], tiles: Sequence[T], nbytes: int) -> list[R]:
    """fn over consecutive runs of `tiles`, one run per core when `nbytes` is large enough.

    fn takes a run of tiles and returns one result per tile; the results come back
    in tile order. The calling thread works too, so a busy pool cannot deadlock it.
    """
    parts = min(workers(), len(tiles))
    if nbytes < PIN_BLAS_BYTES:
        return fn(tiles)
    if nbytes < PARALLEL_BYTES or parts < 2:
        with blas_single_thread():
            return fn(tiles)
    bounds = [len(tiles) * i // parts for i in range(parts + 1)]
    runs = [tiles[bounds[i] : bounds[i + 1]] for i in range(parts)]
    with blas_single_thread():
        futures = [_shared_pool().submit(fn, run) for run in runs[1:]]
        try:
            first = fn(runs[0])
        finally:
            wait(futures)  # no tile outlives the call (nor the BLAS limit)
    return first + [r for f in futures for r in f.result()]
