"""A graph's forward pass as one OpenVINO compiled network (the planner's
"openvino-network", planner.graph.network_costs), timed so a run can say what its first
window cost against the steady ones (issue: the first window <= 1.5x a steady one)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from znni.model.graph import Graph

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
