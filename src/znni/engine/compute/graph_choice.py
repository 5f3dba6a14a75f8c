"""Choosing the window (windowed) or tile (exact) of a graph model with the planner.

Every candidate (the same number of grid steps on each axis, within the region and a
per-axis cap) is planned (planner.graph.search: a primitive per conv, a predicted
time and peak); among those whose peak fits the budget, the one with the most
predicted output voxels per second over the region wins. That weighs a window's
cost against the recomputed overlap: windowed runs compute MONAI's scan of windows
(more, smaller windows overlap more), exact runs one tile per grid step of output; and
a run's first pass, which pays once for the pages of its peak and the import of openvino
(planner.graph.search.first_pass_seconds): large windows make few passes to share it.

On the GPU (`device="gpu"`) each candidate is planned by planner.graph.gpu_search at the
run's precision: a GPU primitive per conv node, the batch of windows (GPU_BATCHES) with the
most predicted voxels/s whose device peak fits the device cap (gpu_search.device_cap_bytes:
90% of the device's memory, within --memory-limit's cap) and whose pinned host windows fit
the host budget; the window's download is its share of the region's blended output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, prod

from znni.engine.compute.execution import planning_machine
from znni.engine.compute.tiles import tile_output
from znni.engine.compute.windows import WindowGrid
from znni.model.graph import Graph
from znni.model.onnx_model import OnnxModel
from znni.planner.graph.gpu_search import device_cap_bytes, plan_graph_gpu, window_bytes
from znni.planner.graph.network_costs import openvino_network_plan
from znni.planner.graph.search import GraphPlan, first_pass_seconds, plan_graph
from znni.planner.machine import MachineProfile
from znni.triple import Triple

# windowed: per axis. One 256^3 window covers a 256^3 volume at once where 160^3 windows
# need 8 (MONAI's 0.25 overlap): BasicUNet's whole segment took 17.4-19.5 s with it
# against 22.7 s with the 80^3 windows chosen before (2026-11-23); planning up to 256
# took 0.13-0.36 s for 128^3-512^3 volumes
MAX_WINDOW = 256
MAX_TILE = 192  # exact: input voxels per axis
# windowed: windows run together share each node's per-call cost, and a batch of 64^3
# BasicUNet windows ran 7-8% faster per window in pairs (2026-11-23); 96^3 windows did
# not gain beyond the noise. A batch multiplies the tensors' memory, so it is taken only
# where the planner predicts it this much faster per window than the next smaller one.
BATCHES = (1, 2, 4)
# bf16: OpenVINO compiled networks where they predict faster (our kernels stay fp32); int8:
# only NNCF's quantized network compiled by OpenVINO (engine/compute/int8_calibration)
CPU_PRECISIONS = ("fp32", "bf16", "int8")
BATCH_GAIN = 0.03
# the GPU: a batch shares each kernel's launch and keeps the device busy on small windows;
# its tensors count against the device cap (planner.graph.gpu_search)
GPU_BATCHES = (1, 2, 4, 8, 16)
GRAPH_DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class GraphChoice:
    """The chosen window or tile, its plan, and the predicted throughput over the region."""

    window: Triple
    plan: GraphPlan
    passes: int  # windows or tiles over the region
    predicted_voxels_per_second: float
    flips: int = 1  # forward passes per window or tile: 2^k with test-time flips (tta.py)

    # what the engine runs, from the plan: device, precision, batch, primitive per conv node
    @property
    def device(self) -> str:
        return self.plan.device

    @property
    def precision(self) -> str:
        return self.plan.precision

    @property
    def batch(self) -> int:
        return self.plan.batch

    @property
    def primitives(self) -> dict[str, str]:
        return self.plan.primitives

    @property
    def predicted_window_s(self) -> float:
        return self.plan.predicted_window_s

    @property
    def device_peak_bytes(self) -> int:
        return self.plan.device_peak_bytes


def plan_window(model: OnnxModel, window: Triple, budget_bytes: int, region: Triple,
                overlap: float = 0.25, machine: MachineProfile | None = None, *,
                device: str = "cpu", precision: str = "fp32",
                device_cap: int | None = None, flips: int = 1) -> GraphChoice:
    """The plan of one given window or tile on `machine` (default this one, as planned for
    runs); ValueError when it does not fit the budget. `device`: "cpu" or "gpu" (planned at
    `precision` within `device_cap` bytes of device memory, None: gpu_search's cap);
    `flips`: forward passes per window (test-time flips run through the same batch: they
    cost time, and memory only for each window's means, `_flip_bytes`)."""
    model.check_window(window)
    windows = _passes(model, window, region, overlap)
    n = windows * flips
    graph = model.graph(window)
    machine = machine or planning_machine()
    host, dev = _flip_bytes(graph, flips)
    most = 1 if model.mode == "exact" else GPU_BATCHES[-1] if device == "gpu" else BATCHES[-1]
    if device == "gpu":
        cap = device_cap if device_cap is not None else device_cap_bytes(machine)
        plan = _gpu_plan(model, graph, machine, budget_bytes, region, n, precision=precision,
                         device_cap=cap - dev * most)
        plan = replace(plan, device_peak_bytes=plan.device_peak_bytes + dev * plan.batch)
    else:
        plan = _cpu_plan(model, graph, machine, budget_bytes - host * most, n, device, precision)
        plan = replace(plan, peak_bytes=plan.peak_bytes + host * plan.batch)
    run_s = n * plan.predicted_window_s + first_pass_seconds(plan)
    return GraphChoice(window, plan, windows, prod(region) / max(1e-12, run_s), flips)


def _flip_bytes(graph: Graph, flips: int) -> tuple[int, int]:
    """Per window of a batch with test-time flips: the host's bytes beside the planned
    batch (the group's unflipped inputs, its float32 means: engine/compute/tta.tta_forward)
    and the device's (the means: device_windows, device_tiles); none without flips."""
    if flips == 1:
        return 0, 0
    inputs, outputs = window_bytes(graph)
    return inputs + outputs, outputs


def _cpu_plan(model: OnnxModel, graph: Graph, machine: MachineProfile, budget_bytes: int,
              n: int, device: str, precision: str) -> GraphPlan:
    """The CPU plan of the window, batched where windowed; ValueError beyond the budget."""
    if device not in GRAPH_DEVICES:
        raise ValueError(f"graph models are planned for device cpu or gpu, not {device!r}")
    if precision not in CPU_PRECISIONS:
        raise ValueError(f"--precision {precision} needs --device gpu")
    try:
        plan = plan_graph(graph, machine, budget_bytes, passes=n)
        need = plan.peak_bytes
    except ValueError:  # no primitive fits beside the window's tensors
        plan, need = None, graph.peak_tensor_bytes()
    if plan is not None and need <= budget_bytes and model.mode == "windowed":
        plan = _batched(graph, plan, budget_bytes, n, machine)
    if plan is not None and need <= budget_bytes:
        plan = _compiled_or_not(model, graph, plan, budget_bytes, n, machine, precision)
    if plan is None or need > budget_bytes:
        raise ValueError(
            f"window {tuple(graph.window)} of model {model.name!r} needs {need:,} bytes or more "
            f"per pass, beyond the {budget_bytes:,}-byte memory budget; choose a smaller "
            "window or a larger memory limit"
        )
    return plan


def _compiled_or_not(model: OnnxModel, graph: Graph, plan: GraphPlan, budget_bytes: int,
                     passes: int, machine: MachineProfile, precision: str) -> GraphPlan:
    """Our node-by-node `plan`, or the whole window as one OpenVINO compiled network
    (planner.graph.network_costs) at the batch that predicts the shortest run, whichever
    predicts less (the network's compile and import counted once) and fits the budget.
    bf16 runs only in compiled networks: our kernels stay fp32. int8 runs only there: the
    network is its compiled one whatever our plan predicts (ValueError where none fits)."""
    int8 = precision == "int8"
    best, best_s = plan, passes * plan.predicted_window_s + first_pass_seconds(plan)
    for batch in BATCHES if model.mode == "windowed" else (1,):
        if batch > max(1, passes):
            break
        network = openvino_network_plan(graph, machine, plan, batch=batch, precision=precision)
        if network is None or network.peak_bytes > budget_bytes:
            break
        run_s = passes * network.predicted_window_s + first_pass_seconds(network)
        if (int8 and not best.compiled) or \
                run_s < best_s * (1 - BATCH_GAIN if best.compiled else 1.0):
            best, best_s = network, run_s
    if int8 and not best.compiled:
        raise ValueError(
            f"--precision int8 runs model {model.name!r} as one OpenVINO network, which "
            + ("is not installed (pip install openvino)" if network is None else
               f"needs {network.peak_bytes:,} bytes for window {tuple(graph.window)}, beyond "
               f"the {budget_bytes:,}-byte budget; choose a smaller window or a larger "
               "memory limit"))
    return best


def _gpu_plan(model: OnnxModel, graph: Graph, machine: MachineProfile, budget_bytes: int,
              region: Triple, passes: int, *, precision: str,
              device_cap: int | None) -> GraphPlan:
    """The GPU batch (GPU_BATCHES, windowed models only) with the shortest predicted run
    over the region (its windows, and the first pass's pinned pages) whose device peak fits
    the cap and pinned windows the host budget, each taken only where BATCH_GAIN faster
    than the best smaller one; ValueError where not even one window fits."""
    cap = device_cap if device_cap is not None else device_cap_bytes(machine)
    download = model.out_channels * prod(region) * 4 / max(1, passes)  # fp32 block share
    best: GraphPlan | None = None
    best_s, error = 0.0, ""
    for batch in GPU_BATCHES if model.mode == "windowed" else (1,):
        if batch > max(1, passes):
            break
        try:
            plan = plan_graph_gpu(graph, machine, cap, precision=precision, batch=batch,
                                  download_bytes=download)
        except ValueError as e:
            error = str(e)
            break  # a larger batch needs more device memory still
        if plan.peak_bytes > budget_bytes:
            error = (f"window {tuple(graph.window)} of model {model.name!r} needs "
                     f"{plan.peak_bytes:,} bytes of pinned host buffers per pass, beyond the "
                     f"{budget_bytes:,}-byte memory budget")
            break
        run_s = passes * plan.predicted_window_s + first_pass_seconds(plan)
        if best is None or run_s < (1 - BATCH_GAIN) * best_s:
            best, best_s = plan, run_s
    if best is None:
        raise ValueError(f"{error}; choose a smaller window or a larger memory limit")
    return best


def _batched(graph: Graph, plan: GraphPlan, budget_bytes: int, passes: int,
             machine: MachineProfile) -> GraphPlan:
    """The plan of the largest batch of windows (BATCHES) that fits the budget and is
    predicted BATCH_GAIN faster per window than the batch before it."""
    for batch in BATCHES[1:]:
        if batch > passes:
            break
        try:
            bigger = plan_graph(graph, machine, budget_bytes, passes=passes, batch=batch)
        except ValueError:
            break
        if bigger.peak_bytes > budget_bytes or \
                bigger.predicted_window_s > (1 - BATCH_GAIN) * plan.predicted_window_s:
            break
        plan = bigger
    return plan


def choose(model: OnnxModel, budget_bytes: int, region: Triple,
           overlap: float = 0.25, machine: MachineProfile | None = None, *,
           device: str = "cpu", precision: str = "fp32",
           device_cap: int | None = None, flips: int = 1) -> GraphChoice:
    """The candidate with the most predicted voxels/s whose pass fits the budget (its
    first pass's extra cost counted once); `device`, `precision`, `device_cap`, `flips`
    as plan_window takes them."""
    candidates = ([model.fixed_window] if model.fixed_window
                  else _fewer_passes(model, _candidates(model, region), region, overlap))
    best: GraphChoice | None = None
    errors = []
    for window in candidates:
        try:
            choice = plan_window(model, window, budget_bytes, region, overlap, machine,
                                 device=device, precision=precision, device_cap=device_cap,
                                 flips=flips)
        except ValueError as e:
            errors.append(str(e))
            break  # larger candidates need more memory still
        if best is None or choice.predicted_voxels_per_second > best.predicted_voxels_per_second:
            best = choice
    if best is None:
        raise ValueError(errors[0] if errors else f"model {model.name!r} has no window")
    return best


def _candidates(model: OnnxModel, region: Triple) -> list[Triple]:
    m, f, c = model.min_window, model.size_factor, model.context
    if model.mode == "exact":  # the tile's output no larger than the region (plus a step)
        cap = [max(m[a], min(MAX_TILE, region[a] + c[a] + f[a])) for a in range(3)]
    else:  # the window no larger than the region rounded up to the grid
        cap = [max(m[a], min(MAX_WINDOW, m[a] + ceil((region[a] - m[a]) / f[a]) * f[a]))
               for a in range(3)]
    out: list[Triple] = []
    for k in range(0, 64):
        w = [min(m[a] + k * f[a], m[a] + (cap[a] - m[a]) // f[a] * f[a]) for a in range(3)]
        if model.mode == "exact":  # a tile must cover at least one grid step of output
            w = [w[a] + f[a] * max(0, ceil((f[a] - (w[a] - c[a])) / f[a])) for a in range(3)]
        window = (w[0], w[1], w[2])
        if out and window == out[-1]:
            break
        out.append(window)
    return out


def _fewer_passes(model: OnnxModel, candidates: list[Triple], region: Triple,
                  overlap: float) -> list[Triple]:
    """The candidates (growing on every axis) that need fewer passes than every smaller one:
    a larger window with as many passes costs more per pass and computes no fewer, so
    only these are planned (e.g. 33 tiles of the valid U-Net over 128^3 became 6)."""
    kept: list[Triple] = []
    fewest = None
    for window in candidates:
        n = _passes(model, window, region, overlap)
        if fewest is None or n < fewest:
            kept.append(window)
            fewest = n
    return kept


def _passes(model: OnnxModel, window: Triple, region: Triple, overlap: float) -> int:
    if model.mode == "windowed":
        return WindowGrid.for_volume(region, window, overlap).num_windows
    out = tile_output(model, window)
    f = model.size_factor
    steps = [max(f[a], out[a] // f[a] * f[a]) for a in range(3)]
    return prod(ceil(region[a] / steps[a]) + (1 if region[a] % f[a] else 0) for a in range(3))
