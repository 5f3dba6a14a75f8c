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

A sequential (ZNNi) network's patch pass keeps its tensors of 0.1-1 GB in the heap only
below SEQUENTIAL_MMAP_THRESHOLD_BYTES: n337 at width 35 over 84x225x166 (3 GiB limit, one
172x204x204 patch pass of 1 GB tensors, AMD EPYC Zen 4, 2 cores, 2026-11-28) peaked at
3.46-3.47 GiB resident against the memory model's 2.49 with every tensor kept (1 GiB
threshold; 91-97 s), 3.40 GiB at 256 MiB (99 s), 2.68 at 128 MiB (108 s), 2.45 at 64 MiB
(105-106 s) and 2.40 with glibc's defaults (145 s): a user's memory limit is kept at 64
MiB, for 13% of the time.
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
SEQUENTIAL_MMAP_THRESHOLD_BYTES = 64 * 2**20
TRIM_THRESHOLD_BYTES = 2**31 - 1  # the largest int mallopt takes

_lock = threading.Lock()
_done = False


def keep_freed_memory(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Raise glibc's mmap threshold (to `mmap_threshold_bytes`) and trim threshold once per
    process (the first call's threshold stays); False where it does not apply (another C
    library, or ZNNI_KEEP_HEAP=0)."""
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
        ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes) == 1
        ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
        ok = mallopt(M_ARENA_MAX, 1) == 1 and ok
        if not ok:
            log.debug("mallopt refused the heap thresholds; glibc defaults kept")
        _done = ok
        return ok
