"""Thread helpers: BLAS pinned to one thread while our own pool runs BLAS calls.

OpenBLAS spawns its threads for every call above a tiny size; from inside a
pool that already covers every core this costs 30x on the per-frequency
(Cout x Cin) products, so pool work runs with BLAS limited to one thread.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import AbstractContextManager
from typing import Any

log = logging.getLogger(__name__)
_lock = threading.Lock()
_controller: Any = None


def blas_single_thread() -> AbstractContextManager[Any]:
    """Context manager limiting BLAS to one thread (process-wide, restored on exit)."""
    global _controller
    with _lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


AVX512_CORES = frozenset({"SkylakeX", "Cooperlake", "SapphireRapids"})
_warned = False


def forced_blas_note(arch: str | None, forced: str | None, cpu_flags: set[str]) -> str | None:
    """Why float32 GEMMs will be slow, when OPENBLAS_CORETYPE pins pre-AVX-512 kernels, else None.

    OpenBLAS detects AVX-512 CPUs itself; an inherited OPENBLAS_CORETYPE=Haswell makes
    direct conv about 1.3x slower on the 2-core AVX-512 machine (AVX2 sgemm kernels).
    """
    if forced is None or arch is None or arch in AVX512_CORES or "avx512f" not in cpu_flags:
        return None
    return (
        f"OPENBLAS_CORETYPE={forced} pins OpenBLAS to {arch} kernels on an AVX-512 CPU; "
        "float32 GEMMs (direct conv) run slower than with OpenBLAS's own detection"
    )


def warn_if_blas_forced() -> None:
    """Log `forced_blas_note` once per process (a cheap check: environment, cpuinfo, BLAS info)."""
    global _warned
    if _warned or "OPENBLAS_CORETYPE" not in os.environ:
        return
    _warned = True
    from threadpoolctl import threadpool_info

    arch = next((i.get("architecture") for i in threadpool_info() if i["user_api"] == "blas"), None)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return
    note = forced_blas_note(arch, os.environ["OPENBLAS_CORETYPE"], set(flags))
    if note is not None:
        log.warning(note)
