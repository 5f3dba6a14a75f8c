"""The graph planner on a GPU: per conv node a GPU primitive, per batch of windows a time and
a device peak, within the device's memory cap.

Each conv node gets the fastest primitive of gpu_costs.gpu_conv_primitives; while the
device peak is over the cap, the node whose next option saves peak bytes at the least
added time per byte moves to it (kept kernel spectra go first, then large workspaces);
ValueError where nothing fits. The device peak (DevicePeak) counts, at the precision's
storage bytes (primitives/precision.storage_bytes): the live tensors in the device
executor's order (gpu_costs.device_tensor_bytes: tensor lifetimes, Graph.last_use; every
node a new array, fused activations none) for the batch, the weights, the kept
kernel spectra, the largest node workspace (the executor's own bounds, but cuDNN's, whose
size query the planner cannot ask: gpu_costs.cudnn_cost), the cuFFT plan cache's reserved
work areas, and the double-buffered fp32 window staging buffers. A batch's time is its
nodes' seconds, overlapped with the host->device upload of its windows and the
device->host download of its share of the blended output: the engine streams both on a
copy stream while the batch computes, so the batch costs the larger of the two (max, not
sum).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from znni.model.graph import Graph, reader_counts
from znni.planner.graph.gpu_costs import (
    FP32_BYTES,
    ConvCost,
    conv_costs,
    device_tensor_bytes,
    fft_plan_bytes,
    other_gpu_seconds,
    other_workspace_bytes,
    weights_bytes,
)
from znni.planner.graph.search import GraphPlan, NodePlan
from znni.planner.machine import MachineProfile
from znni.primitives.precision import check_precision, storage_bytes

GPU_FRACTION = 0.9  # of the device's memory (allocator slack, CUDA context): planner.search's
# kept kernel spectra: at most 1/8 of the device cap, the executor's bound of its LRU
# (primitives/gpu/conv_dispatch.SPECTRA_CAP_SHARE); beyond it they would be evicted and
# recomputed, slower than planned
SPECTRA_CAP_SHARE = 8
STAGING_BUFFERS = 2  # double-buffered input windows: one uploading while one computes


@dataclass(frozen=True)
class DevicePeak:
    """The device bytes of a pass, by what holds them."""

    tensors_bytes: int
    weights_bytes: int
    kept_bytes: int
    workspace_bytes: int
    fft_plan_bytes: int
    staging_bytes: int
    accumulator_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.tensors_bytes + self.weights_bytes + self.kept_bytes
                + self.workspace_bytes + self.fft_plan_bytes + self.staging_bytes
                + self.accumulator_bytes)


def device_cap_bytes(machine: MachineProfile, limit_bytes: int | None = None) -> int:
    """GPU_FRACTION of the planned GPU's memory, within `limit_bytes` where one is given
    (--memory-limit's cap). ValueError for a machine without a GPU."""
    if machine.gpu is None:
        raise ValueError(f"machine profile {machine.name!r} has no GPU to plan a graph on")
    cap = int(machine.gpu.memory_bytes * GPU_FRACTION)
    return min(cap, int(limit_bytes)) if limit_bytes else cap


def window_bytes(graph: Graph) -> tuple[int, int]:
    """One window's fp32 input and output bytes (what is uploaded, and blended)."""
    return (prod(graph.shapes[graph.input][1:]) * FP32_BYTES,
            prod(graph.shapes[graph.output][1:]) * FP32_BYTES)


def host_pinned_bytes(graph: Graph, batch: int) -> int:
    """Host bytes of a pass: the double-buffered pinned input and output windows."""
    return STAGING_BUFFERS * batch * sum(window_bytes(graph))


def device_peak(graph: Graph, picks: dict[int, ConvCost], precision: str, batch: int,
                cap_bytes: int, accumulator_bytes: int = 0) -> DevicePeak:
    """The device peak of a batch with these conv primitives (see the module's docstring)."""
    in_bytes, out_bytes = window_bytes(graph)
    other = max([0, *_other_workspaces(graph, precision, batch).values()])
    kept, workspace, plans = _pick_bytes(picks, cap_bytes, other)
    return DevicePeak(
        tensors_bytes=device_tensor_bytes(graph, batch, storage_bytes(precision)),
        weights_bytes=weights_bytes(graph, precision),
        kept_bytes=kept, workspace_bytes=workspace, fft_plan_bytes=plans,
        staging_bytes=batch * (STAGING_BUFFERS * in_bytes + out_bytes),
        accumulator_bytes=accumulator_bytes,
    )


def _other_workspaces(graph: Graph, precision: str, batch: int) -> dict[int, int]:
    """Node index -> the temporaries the executor reserves around it, for the nodes that
    are not convs (gpu_costs.other_workspace_bytes)."""
    readers = reader_counts(graph)
    return {i: other_workspace_bytes(graph, i, precision, batch, readers)
            for i, node in enumerate(graph.nodes) if not conv_costs_apply(node.op)}


def _pick_bytes(picks: dict[int, ConvCost], cap_bytes: int,
                other_workspace: int = 0) -> tuple[int, int, int]:
    """(kept spectra, the largest workspace of the picks and `other_workspace`, the cuFFT
    plan cache's reservation)."""
    return (sum(c.kept_bytes for c in picks.values()),
            max([other_workspace, *(c.workspace_bytes for c in picks.values())]),
            fft_plan_bytes(cap_bytes) if any(c.uses_fft for c in picks.values()) else 0)


def plan_graph_gpu(
    graph: Graph, machine: MachineProfile, cap_bytes: int | None = None, *,
    precision: str = "fp32", batch: int = 1, download_bytes: float | None = None,
    accumulator_bytes: int = 0,
) -> GraphPlan:
    """The GPU plan of `batch` windows of `graph` within `cap_bytes` of device memory
    (None: device_cap_bytes). `download_bytes`: one window's share of the output that
    comes back to the host (default its whole fp32 output); `accumulator_bytes`: device
    bytes the engine keeps beside the pass (the blended block). ValueError where nothing
    fits or the machine has no GPU."""
    check_precision(precision)
    cap = cap_bytes if cap_bytes is not None else device_cap_bytes(machine)
    gpu = machine.gpu
    if gpu is None:
        raise ValueError(f"machine profile {machine.name!r} has no GPU to plan a graph on")
    options = {i: sorted(conv_costs(graph, node, gpu, precision, batch), key=_seconds)
               for i, node in enumerate(graph.nodes) if conv_costs_apply(node.op)}
    picks = {i: opts[0] for i, opts in options.items()}
    _bound_kept(picks, options, cap // SPECTRA_CAP_SHARE)
    _fit(graph, picks, options, precision, batch, accumulator_bytes, cap)
    peak = device_peak(graph, picks, precision, batch, cap, accumulator_bytes)
    readers, others = reader_counts(graph), _other_workspaces(graph, precision, batch)
    nodes = []
    for i, node in enumerate(graph.nodes):
        if i in picks:
            nodes.append(NodePlan(
                node.name, node.op, picks[i].primitive, picks[i].seconds,
                picks[i].workspace_bytes,
                tuple((c.primitive, c.seconds, c.workspace_bytes) for c in options[i])))
        else:
            nodes.append(NodePlan(node.name, node.op, None, other_gpu_seconds(
                graph, i, gpu, precision, batch, readers), others[i]))
    compute_s = sum(n.predicted_s for n in nodes)
    in_bytes, out_bytes = window_bytes(graph)
    down = out_bytes if download_bytes is None else download_bytes
    transfer_s = batch * (in_bytes + down) / gpu.transfer_bytes_per_s
    return GraphPlan(
        network=graph.name, window=graph.window, nodes=tuple(nodes),
        predicted_window_s=max(compute_s, transfer_s) / batch,
        peak_bytes=host_pinned_bytes(graph, batch), spectra_bytes=peak.kept_bytes,
        batch=batch, device="gpu", precision=precision, device_peak_bytes=peak.total_bytes,
        compute_s=compute_s, transfer_s=transfer_s,
    )


def conv_costs_apply(op: str) -> bool:
    return op in ("conv", "conv_transpose")


def _seconds(c: ConvCost) -> float:
    return c.seconds


def _bound_kept(picks: dict[int, ConvCost], options: dict[int, list[ConvCost]],
                limit_bytes: int) -> None:
    """While the kept spectra exceed `limit_bytes`, the node whose spectra cost least time
    per byte to give up moves to its fastest option that keeps none (in `picks`)."""
    while sum(c.kept_bytes for c in picks.values()) > limit_bytes:
        def loss(i: int) -> float:
            alt = next(o for o in options[i] if not o.kept_bytes)
            return (alt.seconds - picks[i].seconds) / picks[i].kept_bytes

        i = min((i for i, c in picks.items() if c.kept_bytes), key=loss)
        picks[i] = next(o for o in options[i] if not o.kept_bytes)


def _fit(graph: Graph, picks: dict[int, ConvCost], options: dict[int, list[ConvCost]],
         precision: str, batch: int, accumulator_bytes: int, cap: int) -> None:
    """While the device peak is over `cap`, move the node whose other option saves peak
    bytes at the least added seconds per byte saved (in `picks`); ValueError where no move
    saves any."""
    empty = device_peak(graph, {}, precision, batch, cap, accumulator_bytes)
    fixed, other = empty.total_bytes - empty.workspace_bytes, empty.workspace_bytes

    def peak(p: dict[int, ConvCost]) -> int:
        return fixed + sum(_pick_bytes(p, cap, other))

    need = peak(picks)
    while need > cap:
        best: tuple[float, int, ConvCost, int] | None = None
        for i, opts in options.items():
            for o in opts:
                if o is picks[i]:
                    continue
                trial = peak({**picks, i: o})
                if trial >= need:
                    continue
                cost = (o.seconds - picks[i].seconds) / (need - trial)
                if best is None or cost < best[0]:
                    best = (cost, i, o, trial)
        if best is None:
            raise ValueError(
                f"graph {graph.name!r} at window {tuple(graph.window)} needs {need:,} bytes of "
                f"device memory for a batch of {batch} at {precision}, more than the "
                f"{cap:,}-byte cap")
        _, i, o, need = best
        picks[i] = o
