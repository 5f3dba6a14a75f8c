"""Choosing a backend by name. A backend is a value passed down, never a global flag."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from znni.primitives.base import Backend
from znni.primitives.reference import ReferenceBackend

# N: the stand-in device's N-th reservation fails once (tests of allocation-failure recovery)
STANDIN_FAIL_ENV = "ZNNI_GPU_STANDIN_FAIL_AT"


def _reference(**_: Any) -> Backend:
    return ReferenceBackend()


def _cpu(**options: Any) -> Backend:
    from znni.primitives.cpu import CpuBackend  # lazy: the CPU backend's modules

    return CpuBackend(**options)


def _gpu(**options: Any) -> Backend:
    """The CUDA device through CuPy; ValueError naming the fix when there is none."""
    from znni.primitives.gpu.backend import GpuBackend
    from znni.primitives.gpu.cupy_device import CupyDevice

    device = CupyDevice(options.pop("memory_cap_bytes", None))
    return GpuBackend(device, **options)


def _gpu_standin(**options: Any) -> Backend:
    """The GPU backend on the numpy stand-in device (CI, and machines without CUDA)."""
    from znni.primitives.gpu.backend import GpuBackend
    from znni.primitives.gpu.device import HostDevice

    fail_at = int(os.environ.get(STANDIN_FAIL_ENV) or 0)
    device = HostDevice(options.pop("memory_cap_bytes", 2**30), fail_at=fail_at)
    return GpuBackend(device, **options)


# name -> factory; imports of fast backends stay lazy so nothing heavy runs at import time.
BACKEND_FACTORIES: dict[str, Callable[..., Backend]] = {
    "reference": _reference,
    "cpu": _cpu,
    "gpu": _gpu,
    "gpu-standin": _gpu_standin,
}


def make_backend(name: str, **options: Any) -> Backend:
    """Build the backend called `name` ('reference', 'cpu', ...)."""
    factory = BACKEND_FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKEND_FACTORIES)}")
    return factory(**options)
