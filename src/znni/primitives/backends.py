"""Choosing a backend by name. A backend is a value passed down, never a global flag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from znni.primitives.base import Backend
from znni.primitives.reference import ReferenceBackend


def _reference(**_: Any) -> Backend:
    return ReferenceBackend()


def _cpu(**options: Any) -> Backend:
    from znni.primitives.cpu import CpuBackend  # lazy: imports pyFFTW

    return CpuBackend(**options)


# name -> factory; imports of fast backends stay lazy so nothing heavy runs at import time.
BACKEND_FACTORIES: dict[str, Callable[..., Backend]] = {"reference": _reference, "cpu": _cpu}


def make_backend(name: str, **options: Any) -> Backend:
    """Build the backend called `name` ('reference', 'cpu', ...)."""
    factory = BACKEND_FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKEND_FACTORIES)}")
    return factory(**options)
