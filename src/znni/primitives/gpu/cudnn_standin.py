"""The numpy stand-in of the cuDNN path (reports call it "cudnn-standin", never cuDNN).

It keeps the real path's contract (cudnn_conv.LibraryConv): graphs built once per
`ConvSpec` in the same count-bounded `GraphCache`, a workspace size query whose bytes
are allocated through the device's accounting, bias and activation fused into the
call, inputs in the storage dtype with the arithmetic in float32 and the output cast
back. The arithmetic is the per-offset GEMM kernels (graph_kernels.conv /
conv_transpose) in float32, an independent path from the tests' naive references.

Its workspace "size query" is a stated formula, the GEMM loop's own temporaries
(graph_split.workspace_bytes) plus float32 copies of input and weight when the storage
dtype is 2 bytes, so a memory cap constrains it as cuDNN's workspace would.
Failures can be injected: `unsupported` makes specs unrunnable (the caller falls
back), `fail_executes` makes the next executions raise the device's native
out-of-memory error (the caller translates it to DeviceOutOfMemory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from znni.primitives.gpu.conv_spec import DEFAULT_MAX_GRAPHS, ConvSpec
from znni.primitives.gpu.cudnn_conv import LibraryConv
from znni.primitives.gpu.device import Device, StandinNativeOOM
from znni.primitives.gpu.gemm_loop import gemm_loop_arith, gemm_loop_workspace_bytes


def standin_workspace_bytes(spec: ConvSpec) -> int:
    """The stand-in's answer to cuDNN's workspace query (see the module docstring)."""
    return gemm_loop_workspace_bytes(spec)


class CudnnStandin(LibraryConv):
    """The cuDNN path's contract on a numpy device (`HostDevice`)."""

    name = "cudnn-standin"

    def __init__(self, device: Device, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        super().__init__(device, max_graphs)
        self.unsupported: Callable[[ConvSpec], bool] | None = None
        self.fail_executes = 0
        self.executes = 0

    def _build(self, spec: ConvSpec) -> dict[str, Any] | None:
        if self.unsupported is not None and self.unsupported(spec):
            return None
        return {"spec": spec, "workspace": standin_workspace_bytes(spec)}

    def _workspace_bytes(self, built: Any) -> int:
        return int(built["workspace"])

    def _execute(
        self, built: Any, spec: ConvSpec, x: Any, params: Mapping[str, Any], y: Any, ws: Any
    ) -> None:
        if self.fail_executes > 0:
            self.fail_executes -= 1
            raise StandinNativeOOM(
                f"injected: {self.name} could not allocate during a conv on {spec.x_shape}"
            )
        y[...] = gemm_loop_arith(np, np.asarray(x), params, spec)  # float32 inside
        self.executes += 1
