"""What every block worker is, and the set-up the three kinds share.

A worker computes any block of one job in one process: `read` the block's input (the
reader thread calls it ahead), `compute` its encoded output, `write` it. The three kinds
(`mpf.BlockWorker` for sequential networks, `exact_graph.ExactGraphWorker` for valid
graphs, `windowed.WindowedWorker` for everything else) differ only in `read_box` and
`compute`; they share `VolumeWorker`'s opened input and lazily opened output.
Setting ZNNI_ENGINE_TRACE=FILE appends the key of every computed block to FILE, so
tests and operators can see exactly what a run recomputed.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

import numpy as np

from znni.engine.compute.compiled_forward import CompiledForward
from znni.engine.compute.graph_device import device_graph_ops, device_run_report
from znni.engine.compute.graph_forward import make_graph_backend, run_graph
from znni.engine.compute.tta import tta_forward
from znni.engine.geometry import Block, Triple
from znni.engine.io.volume import open_input, write_block
from znni.primitives.base import Backend

TRACE_ENV = "ZNNI_ENGINE_TRACE"
log = logging.getLogger("znni.engine")


class Worker(Protocol):
    """The contract `pipeline.run_local` and `distributed.run_block_task` rely on."""

    spec: Any  # the picklable job description the worker was made from

    def read(self, block: Block) -> np.ndarray:
        """The raw input the block needs, (C, *read box); called on the reader thread."""
        ...

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        """The block's encoded output, (Cout, *block.write.shape)."""
        ...

    def write(self, block: Block, values: np.ndarray) -> None:
        """Store the block's output; called on the writer thread."""
        ...

    def run(self, block: Block) -> None:
        """read, compute and write one block on this thread."""
        ...


class VolumeWorker:
    """The input opened once (through its decoded-chunk cache) and the output opened at
    the first write: the set-up every worker kind shares. `spec` has `input_path`,
    `output_path`, `input_cache_bytes` and `store` (the job's `StoreContext`)."""

    def __init__(self, spec: Any, in_channels: int, output_array: Any = None) -> None:
        self.spec = spec
        self.volume = open_input(spec.input_path, in_channels, spec.input_cache_bytes,
                                 ctx=spec.store)
        self.output = output_array  # None: spec.output_path, opened at the first write

    def read(self, block: Block) -> np.ndarray:
        raise NotImplementedError

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def write(self, block: Block, values: np.ndarray) -> None:
        self.output = write_block(self.output, self.spec.output_path, block.write, values,
                                  ctx=self.spec.store)

    def run(self, block: Block) -> None:
        self.write(block, self.compute(block, self.read(block)))


class GraphWorker(VolumeWorker):
    """A VolumeWorker that runs an ONNX model's graph at one input size (the exact tile or
    the window) with the planner's primitives: the exact-graph and windowed workers' shared
    set-up. `spec` also has `model`, `backend_name`, `spectra_bytes`, `primitives`,
    `precision`, `device_bytes` (a GPU backend's memory cap; 0: the device's own), `batch`,
    `compiled` ("openvino-network": the whole window on OpenVINO) and `flips` (test-time
    flips, engine/compute/tta.py, or None)."""

    def __init__(self, spec: Any, size: Triple, backend: Backend | None = None,
                 output_array: Any = None) -> None:
        super().__init__(spec, spec.model.in_channels, output_array)
        self.backend = backend or make_graph_backend(spec.backend_name, spec.spectra_bytes,
                                                     spec.device_bytes)
        self.graph = spec.model.graph(size)
        self.primitives = dict(spec.primitives)
        # a GPU backend: the graph runs on device-resident tensors at the job's precision
        self.device_ops = None if spec.compiled else device_graph_ops(self.backend,
                                                                      spec.precision)
        # the planner's "openvino-network": the whole window compiled (begins compiling now)
        self.compiled = CompiledForward(spec.model.path, self.graph, spec.batch,
                                        spec.precision) if spec.compiled else None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """(N, C, *size) windows or tiles -> their outputs, on the host: the compiled
        network where the plan says so, else our executor with the planned primitives."""
        if self.compiled is not None:
            try:
                return self.compiled(x)
            except Exception as e:  # noqa: BLE001 - OpenVINO's own errors: our kernels run
                log.warning("OpenVINO could not compile or run %s (%s); our own kernels run "
                            "it instead", self.spec.model.name, e)
                self.compiled = None
                self.primitives = {}  # the compiled plan chose no per-conv primitives
        return run_graph(self.graph, x, self.backend, self.primitives)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """`forward`, averaged over the spec's test-time flips (`flips`, engine/compute/tta.py)
        where it has some: the batch's flipped copies run `batch` at a time."""
        flips = getattr(self.spec, "flips", None)
        if flips is None:
            return self.forward(x)
        return tta_forward(self.forward, x, flips, self.spec.batch)

    def device_report(self) -> dict[str, Any]:
        """What really ran. On a GPU: conv primitives by their real names, fallbacks, the
        batch after any allocation failure, the device's peak. A compiled network: its
        compile and its first call against the steady ones. {} otherwise."""
        if self.compiled is not None:
            return self.compiled.report()
        if self.device_ops is None:
            return {}
        runner = getattr(self, "on_device", None)
        return device_run_report(self.device_ops, getattr(runner, "shrinks", []))


def trace_block(block: Block) -> None:
    """Append "PID BLOCK" to $ZNNI_ENGINE_TRACE when set (tests count computed blocks)."""
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as f:  # one short O_APPEND write: safe across processes
            f.write(f"{os.getpid()} {block.key}\n")
