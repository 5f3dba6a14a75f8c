"""The one place that knows the three worker kinds: a spec in, its worker out."""

from __future__ import annotations

from typing import Any

from znni.engine.workers.base import Worker
from znni.engine.workers.exact_graph import ExactGraphSpec, ExactGraphWorker
from znni.engine.workers.finish import FinishSpec, FinishWorker
from znni.engine.workers.mpf import BlockSpec, BlockWorker
from znni.engine.workers.windowed import WindowedSpec, WindowedWorker
from znni.primitives.base import Backend

Spec = BlockSpec | WindowedSpec | ExactGraphSpec | FinishSpec


def make_worker(spec: Spec, backend: Backend | None = None, output_array: Any = None) -> Worker:
    """The worker that computes blocks of `spec`'s kind (MPF, windowed or exact graph).
    `backend`: run everything on it (tests, benchmarks); `output_array`: an opened output.
    A `FinishSpec` (labels, mask, --skip-empty) wraps the worker of its inner spec."""
    if isinstance(spec, FinishSpec):
        inner = make_worker(spec.inner, backend=backend, output_array=output_array)
        return FinishWorker(inner, spec)  # type: ignore[return-value]
    if isinstance(spec, WindowedSpec):
        return WindowedWorker(spec, backend=backend, output_array=output_array)
    if isinstance(spec, ExactGraphSpec):
        return ExactGraphWorker(spec, backend=backend, output_array=output_array)
    if isinstance(spec, BlockSpec):
        return BlockWorker(spec, backend=backend, output_array=output_array)
    raise TypeError(f"no worker computes blocks of a {type(spec).__name__}")
