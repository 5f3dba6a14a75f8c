"""A graph's forward pass as one OpenVINO compiled network (the planner's
"openvino-network", planner.graph.network_costs), timed so a run can say what its first
window cost against the steady ones (issue: the first window <= 1.5x a steady one).

`CompilePrefetch` starts that compile before the plan exists, for a job whose window is
given: the planner's choice needs the volume's shape, so it comes after Zarr's import and
the volume's opening (about 0.1 s), and the compile (0.15-0.2 s for BasicUNet) would
otherwise start after them and keep the first window waiting. The plan still decides:
a compile it did not choose is dropped.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from znni.engine.job import SegmentJob
from znni.model.graph import Graph
from znni.model.onnx_model import OnnxModel
from znni.planner.graph.search import GraphPlan
from znni.triple import Triple

MAX_TIMINGS = 4096  # per-call seconds kept for the steady median (32 KiB)


class CompiledForward:
    """The compile starts on a background thread when this is made (a worker makes it
    before reading its first block) and the first call waits for it. A batch smaller than
    the compiled one (a grid's last window group) is padded with zero windows, whose
    outputs are dropped."""

    def __init__(self, model_path: str, graph: Graph, batch: int, precision: str) -> None:
        from znni.primitives.cpu.openvino_network import NETWORKS

        self.shape = (batch, graph.in_channels, *graph.window)
        self._future = NETWORKS.start(model_path, self.shape, graph.output, precision)
        self._network: Any = None
        self.wait_s = 0.0  # the first call's wait for the compile (0: it was ready)
        self.call_s: list[float] = []  # each call's seconds: the first, then steady ones

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(N <= batch, C, *window) -> (N, Cout, *out_window), float32."""
        if self._network is None:
            t0 = time.perf_counter()
            self._network = self._future.result()
            self.wait_s = time.perf_counter() - t0
        n = x.shape[0]
        if n < self.shape[0]:
            full = np.zeros(self.shape, np.float32)  # (B, C, Z, Y, X)
            full[:n] = x
            x = full
        t0 = time.perf_counter()
        out = self._network.run(x)[:n]
        if len(self.call_s) < MAX_TIMINGS:
            self.call_s.append(time.perf_counter() - t0)
        return out

    def report(self) -> dict[str, Any]:
        """What ran: the compiled network's precision and compile, the first call (and the
        wait for the compile before it) against the median of the later ones."""
        if self._network is None:
            return {}
        net, calls = self._network, self.call_s
        return {"compiled_ran": {
            "runtime": "openvino", "precision": net.inference_precision,
            "batch": self.shape[0], "compile_s": net.compile_s, "compile_wait_s": self.wait_s,
            "first_s": calls[0] if calls else None,
            "steady_s": statistics.median(calls[1:]) if len(calls) > 1 else None,
            "calls": len(calls)}}


class CompilePrefetch:
    """The whole `window` of `model` compiled at batch 1 and `precision` (the planner's usual
    choice on the CPU) from now on, while the run opens its volume and plans; `settle`
    keeps it where the plan chose exactly that network and drops it otherwise."""

    def __init__(self, model: OnnxModel, window: Triple, precision: str) -> None:
        from znni.primitives.cpu.openvino_network import NETWORKS

        graph = model.graph(window)
        self.key = (model.path, (1, graph.in_channels, *graph.window), graph.output, precision)
        NETWORKS.start(*self.key)

    def settle(self, plan: GraphPlan | None) -> bool:
        """Whether `plan` (None: no plan, the run failed) runs this very network; if not,
        it is discarded (cancelled, or dropped once compiled)."""
        from znni.primitives.cpu.openvino_network import NETWORKS

        path, shape, output, started = self.key
        if plan is not None and plan.compiled == "openvino-network" and \
                plan.batch == shape[0] and plan.precision == started:
            return True
        NETWORKS.discard(path, shape, output, started)
        return False


def prefetch_compile(job: SegmentJob) -> CompilePrefetch | None:
    """The compile to start ahead of the plan for `job`, where the plan is likely to want
    it: an ONNX model with its window given (`--window`), run here on the CPU in fp32 or
    bf16, without test-time flips (their batches differ), OpenVINO installed; else None."""
    from znni.engine.compute.execution import graph_runs_on_gpu
    from znni.planner.graph.openvino_costs import openvino_ready

    model = job.network
    if not isinstance(model, OnnxModel) or job.window is None or job.scheduler is not None \
            or job.tta is not None or job.precision not in ("fp32", "bf16") \
            or graph_runs_on_gpu(job.device) or not openvino_ready():
        return None
    try:
        return CompilePrefetch(model, job.window, job.precision)
    except ValueError:  # a window the model refuses: the run's own checks say so
        return None
