"""What every block worker is, and the set-up the three kinds share.

The worker kinds are the inference stage of the block sweep (`engine/sweep/`): a spec
(`mpf.BlockSpec` for sequential networks, `exact_graph.ExactGraphSpec` for valid graphs,
`windowed.WindowedSpec` for everything else, `finish.FinishSpec` around any of them) is the
sweep's `Stage`, and the worker it builds its `BlockWork`: `read` the block's input (the
reader thread calls it ahead), `compute` its encoded output, `write` it. The kinds differ
only in `read_box` and `compute`; they share `VolumeWorker`'s opened input and lazily
opened output.
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
from znni.engine.compute.tta import FlipSpec, tta_forward
from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Triple
from znni.engine.io.volume import open_input, open_output_array, write_block
from znni.engine.location import Location
from znni.engine.sweep.stage import BlockWork, Stage
from znni.model.carried import CarriedFiles
from znni.model.onnx_model import OnnxModel
from znni.primitives.base import Backend

TRACE_ENV = "ZNNI_ENGINE_TRACE"
log = logging.getLogger("znni.engine")


class VolumeSpec(Stage, Protocol):
    """What `VolumeWorker` reads from a spec: every kind's spec has it (a sweep `Stage`)."""

    @property
    def input_path(self) -> Location: ...
    @property
    def output_path(self) -> Location: ...
    @property
    def input_cache_bytes(self) -> int: ...  # decoded input chunks kept between blocks
    @property
    def store(self) -> StoreContext: ...  # the job's store options (and this process's caches)


class GraphSpec(VolumeSpec, Protocol):
    """What `GraphWorker` reads from an ONNX model's spec (`ExactGraphSpec`, `WindowedSpec`)."""

    @property
    def model(self) -> OnnxModel: ...
    @property
    def backend_name(self) -> str: ...
    @property
    def primitives(self) -> tuple[tuple[str, str], ...]: ...  # conv node -> primitive
    @property
    def spectra_bytes(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def device_bytes(self) -> int: ...  # a GPU backend's memory cap (0: the device's own)
    @property
    def batch(self) -> int: ...
    @property
    def compiled(self) -> str: ...  # "openvino-network": the whole window on OpenVINO
    @property
    def compiled_path(self) -> str: ...  # what it compiles: "" the model; int8 the IR
    @property
    def compiled_files(self) -> CarriedFiles | None: ...  # that IR, sent as bytes
    @property
    def flips(self) -> FlipSpec | None: ...


class _Buildable(Protocol):
    """A spec that builds its kind's worker (`InferenceStage`'s self)."""

    @property
    def output_path(self) -> Location: ...
    @property
    def store(self) -> StoreContext: ...
    def build(self, backend: Backend | None = None, output_array: Any = None) -> BlockWork: ...


class InferenceStage:
    """A worker spec as the sweep's `Stage` (mixed into every spec). `build` is each kind's
    own (a backend for everything, tests and benchmarks; an output opened already, as
    `segment` hands its local worker); `make_worker` is the worker a process makes from the
    spec alone, as a Dask worker does: a remote output opened now, a local one at the first
    write."""

    def make_worker(self: _Buildable) -> BlockWork:
        remote = self.output_path.is_remote
        return self.build(output_array=open_output_array(self.output_path, ctx=self.store)
                          if remote else None)


class VolumeWorker:
    """The input opened once (through its decoded-chunk cache) and the output opened at
    the first write: the set-up every worker kind shares. `spec` has `input_path`,
    `output_path`, `input_cache_bytes` and `store` (the job's `StoreContext`)."""

    def __init__(self, spec: VolumeSpec, in_channels: int, output_array: Any = None) -> None:
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
    `compiled` ("openvino-network": the whole window on OpenVINO), `compiled_path` (the
    file it compiles: int8's quantized IR; "" the model's; `compiled_files`: that IR sent to
    a worker on another host, written there) and `flips` (test-time flips,
    engine/compute/tta.py, or None)."""

    spec: GraphSpec

    def __init__(self, spec: GraphSpec, size: Triple, backend: Backend | None = None,
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
        # (int8: NNCF's quantized IR, made before the sweep, engine/precision_run.py)
        self.compiled = CompiledForward(compiled_network(spec), self.graph, spec.batch,
                                        spec.precision) if spec.compiled else None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """(N, C, *size) windows or tiles -> their outputs, on the host: the compiled
        network where the plan says so, else our executor with the planned primitives."""
        if self.compiled is not None:
            try:
                return self.compiled(x)
            except Exception as e:  # noqa: BLE001 - OpenVINO's own errors: our kernels run
                if self.spec.precision == "int8":  # only the quantized network is int8
                    raise ValueError(f"the int8 network {self.spec.compiled_path} could not "
                                     f"be compiled or run here ({e})") from e
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


def compiled_network(spec: GraphSpec) -> str:
    """The file a compiled worker compiles on this host: int8's IR (this host's copy where
    it was carried), else the model's."""
    if spec.compiled_files is not None:
        return spec.compiled_files.path()
    return spec.compiled_path or spec.model.path


def trace_block(block: Block) -> None:
    """Append "PID BLOCK" to $ZNNI_ENGINE_TRACE when set (tests count computed blocks)."""
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as f:  # one short O_APPEND write: safe across processes
            f.write(f"{os.getpid()} {block.key}\n")
