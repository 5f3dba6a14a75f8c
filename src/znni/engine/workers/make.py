"""The one place that knows the four worker specs: a spec in, its worker out."""

from __future__ import annotations

from typing import Any

from znni.engine.sweep.stage import BlockWork
from znni.engine.workers.exact_graph import ExactGraphSpec
from znni.engine.workers.finish import FinishSpec
from znni.engine.workers.mpf import BlockSpec
from znni.engine.workers.windowed import WindowedSpec
from znni.primitives.base import Backend

Spec = BlockSpec | WindowedSpec | ExactGraphSpec | FinishSpec  # the inference stages
SPECS = (BlockSpec, WindowedSpec, ExactGraphSpec, FinishSpec)


def make_worker(spec: Spec, backend: Backend | None = None, output_array: Any = None) -> BlockWork:
    """The worker that computes blocks of `spec`'s kind (MPF, windowed or exact graph).
    `backend`: run everything on it (tests, benchmarks); `output_array`: an opened output.
    A `FinishSpec` (labels, mask, --skip-empty) wraps the worker of its inner spec."""
    if not isinstance(spec, SPECS):
        raise TypeError(f"no worker computes blocks of a {type(spec).__name__}")
    return spec.build(backend=backend, output_array=output_array)
