"""Keep freed tensor memory in the process heap so the next window reuses its pages.

glibc serves allocations above its mmap threshold (at most 32 MiB while it adapts)
with fresh mmap'd pages and unmaps them on free, so every window of a U-Net faults in
and zeroes each of its large tensors again (16 x 98^3 float32 is 60 MiB). With the
threshold raised to 1 GiB and heap trimming off, freed tensors stay in the heap and
are reused: a 96^3 BasicUNet window took 1.50 s of CPU (0.18 s of it in the kernel)
and 1.27 s after (0.02 s in the kernel), on the CI kind (2026-11-23). The price is
fragmentation: a kept heap holds freed blocks that a later, larger tensor cannot
use (BasicUNet 96^3: numpy's own peak 196 MiB, the resident one 231).

One arena for every thread: glibc gives each new thread its own arena, and a kept
heap then also holds each worker's largest workspace apart from the tensors' freed
blocks (BasicUNet 96^3: 28.5 MiB in three worker arenas against the 8 MiB of
workspace the memory model counts). On the six benchmarks/graph_planner.py windows
(CI kind, 2026-11-24) the first pass's resident peak was 1.14-1.30x the memory
model's at 64^3-96^3 with an arena per thread, 0.88-1.17x with one; a whole 128^3
BasicUNet segment peaked at 0.32 GiB against 0.38 and took 4.09 s against 4.03
(medians of 8, fresh processes, alternated). Set ZNNI_KEEP_HEAP=0 to leave glibc's
defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 2**30
TRIM_THRESHOLD_BYTES = 2**31 - 1  # the largest int mallopt takes

_lock = threading.Lock()
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; False where it does not
    apply (another C library, or ZNNI_KEEP_HEAP=0)."""
    global _done
    with _lock:
        if _done:
            return True
        if os.environ.get("ZNNI_KEEP_HEAP", "1") == "0":
            return False
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name)
            mallopt = libc.mallopt
        except (OSError, AttributeError, TypeError):
            return False  # not glibc (musl, macOS): nothing to tune
        ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
        ok = mallopt(M_ARENA_MAX, 1) == 1 and ok
        if not ok:
            log.debug("mallopt refused the heap thresholds; glibc defaults kept")
        _done = ok
        return ok
