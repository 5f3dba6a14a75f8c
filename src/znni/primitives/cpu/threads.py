"""Thread helpers: BLAS pinned to one thread while our own pool runs BLAS calls.

OpenBLAS spawns its threads for every call above a tiny size; from inside a
pool that already covers every core this costs 30x on the per-frequency
(Cout x Cin) products, so pool work runs with BLAS limited to one thread.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

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
