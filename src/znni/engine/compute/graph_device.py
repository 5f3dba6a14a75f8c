"""Running a `Graph` on device-resident tensors: one upload in, nothing back until the end.

The device twin of graph_forward.run_graph. Every node runs on the GPU through
`primitives.gpu.graph_device.DeviceGraphOps` (convs on the planner's GPU primitive,
the rest on `xp` kernels), each tensor freed on the device after its last reader.
A ReLU-family activation right after a conv or a normalisation, read by nothing else,
runs in that node's call (cuDNN fuses it into the conv). A failure frees every tensor
this pass made and re-raises: `DeviceOutOfMemory` tells the caller to run fewer windows
at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from znni.engine.compute.device_stream import download
from znni.model.graph import FUSABLE_ACTIVATIONS, Graph, reader_counts
from znni.primitives.base import Activation, Backend
from znni.primitives.gpu.device import Device
from znni.primitives.gpu.graph_device import DeviceGraphOps

FUSES_NEXT = ("conv", "conv_transpose", "instance_norm", "group_norm", "batch_norm")


def device_graph_ops(backend: Backend, precision: str) -> DeviceGraphOps | None:
    """The device-resident graph ops of a GPU backend (its `device`); None on the CPU."""
    device = getattr(backend, "device", None)
    if device is None:  # our CPU kernels compute in fp32 (bf16: compiled networks only)
        return None
    return DeviceGraphOps(device, precision)


def device_run_report(ops: DeviceGraphOps, shrinks: list[int]) -> dict[str, Any]:
    """What ran on the device, under real names (a GEMM loop is never called cuDNN)."""
    return conv_run_report(ops.device, shrinks)


def conv_run_report(device: Any, shrinks: list[int] | None = None) -> dict[str, Any]:
    """The device's conv tally (conv_dispatch.conv_state), fallbacks, batch shrinks, peak."""
    from znni.primitives.gpu.conv_dispatch import conv_state

    state = conv_state(device)
    return {
        "device_ran": {"device": device.name, "convs": dict(state.ran),
                       "fallbacks": list(state.fallbacks), "batch_shrinks": list(shrinks or []),
                       "peak_device_bytes": device.peak_bytes},
    }


def run_graph_on_device(graph: Graph, x: np.ndarray, device: Device,
                        primitives: Mapping[str, str] | None = None) -> np.ndarray:
    """graph_forward.run_graph's contract (host arrays in and out, float32) on a GPU
    backend's `device`: one upload, every node on the device, one download. Primitives
    that are not GPU primitives (a CPU plan's) are left to the default."""
    from znni.primitives.gpu.conv_dispatch import GPU_CONV_PRIMITIVES

    ops = DeviceGraphOps(device)
    gpu = {k: v for k, v in (primitives or {}).items() if v in GPU_CONV_PRIMITIVES}
    xd = ops.to_device(np.asarray(x, np.float32))
    try:
        y = run_graph_device(graph, xd, ops, gpu)
        try:
            return download(ops.device, y).astype(np.float32, copy=False)
        finally:
            ops.free(y)
    finally:
        ops.free(xd)
        ops.close()


def run_graph_device(graph: Graph, x: Any, ops: DeviceGraphOps,
                     primitives: Mapping[str, str] | None = None) -> Any:
    """(N, C, *graph.window) device array -> (N, graph.out_channels, *graph.out_window),
    a new device array in the precision's storage dtype, counted until `ops.free`.
    `x` stays the caller's. `primitives`: conv node -> the planner's GPU primitive."""
    shape = tuple(x.shape)
    if len(shape) != 5 or shape[1] != graph.in_channels or shape[2:] != graph.window:
        raise ValueError(
            f"graph {graph.name!r} runs on (N, {graph.in_channels}, {graph.window}) windows, "
            f"got a device array of shape {shape}"
        )
    chosen = primitives or {}
    nodes, readers, last = graph.nodes, reader_counts(graph), graph.last_use()
    env: dict[str, Any] = {graph.input: x}
    try:
        i = 0
        while i < len(nodes):
            node = nodes[i]
            act = _fused_activation(graph, i, readers)
            y = ops.run(node.op, node.name, node.params, [env[t] for t in node.inputs],
                        chosen.get(node.name), act)
            end = i + (act is not None)
            env[nodes[end].outputs[0]] = y
            for t in {*node.inputs, *nodes[end].inputs}:
                if last.get(t, -1) <= end and t not in (graph.input, graph.output) and t in env:
                    ops.free(env.pop(t))
            i = end + 1
    except BaseException:
        for name, arr in env.items():
            if name != graph.input:
                ops.free(arr)
        raise
    return env[graph.output]


def _fused_activation(graph: Graph, i: int, readers: dict[str, int]) -> Activation | None:
    """The activation node i + 1 when node i (a conv or a norm) alone feeds it."""
    nodes = graph.nodes
    if nodes[i].op not in FUSES_NEXT or i + 1 >= len(nodes):
        return None
    nxt = nodes[i + 1]
    if nxt.op not in FUSABLE_ACTIVATIONS or nxt.inputs != nodes[i].outputs:
        return None
    if readers[nodes[i].outputs[0]] != 1 or nodes[i].outputs[0] == graph.output:
        return None
    return Activation(nxt.op, float(nxt.params.get("alpha", 0.01)))
