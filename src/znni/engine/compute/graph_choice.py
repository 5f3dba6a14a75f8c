"""Choosing the window (windowed) or tile (exact) of a graph model with the planner.

Every candidate (the same number of grid steps on each axis, within the region and a
per-axis cap) is planned (planner.graph.search: a primitive per conv, a predicted
time and peak); among those whose peak fits the budget, the one with the most
predicted output voxels per second over the region wins. That weighs a window's
cost against the recomputed overlap: windowed runs compute MONAI's scan of windows
(more, smaller windows overlap more), exact runs one tile per grid step of output; and
a run's first pass, which pays once for the pages of its peak and the import of openvino
(planner.graph.search.first_pass_seconds): large windows make few passes to share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from znni.engine.compute.execution import planning_machine
from znni.engine.compute.tiles import tile_output
from znni.engine.compute.windows import WindowGrid
from znni.model.graph import Graph
from znni.model.onnx_model import OnnxModel
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
BATCH_GAIN = 0.03


@dataclass(frozen=True)
class GraphChoice:
    """The chosen window or tile, its plan, and the predicted throughput over the region."""

    window: Triple
    plan: GraphPlan
    passes: int  # windows or tiles over the region
    predicted_voxels_per_second: float


def plan_window(model: OnnxModel, window: Triple, budget_bytes: int, region: Triple,
                overlap: float = 0.25, machine: MachineProfile | None = None) -> GraphChoice:
    """The plan of one given window or tile on `machine` (default this one, as planned for
    runs); ValueError when it does not fit the budget."""
    model.check_window(window)
    n = _passes(model, window, region, overlap)
    graph = model.graph(window)
    machine = machine or planning_machine()
    try:
        plan = plan_graph(graph, machine, budget_bytes, passes=n)
        need = plan.peak_bytes
    except ValueError:  # no primitive fits beside the window's tensors
        plan, need = None, graph.peak_tensor_bytes()
    if plan is not None and need <= budget_bytes and model.mode == "windowed":
        plan = _batched(graph, plan, budget_bytes, n, machine)
    if plan is None or need > budget_bytes:
        raise ValueError(
            f"window {tuple(window)} of model {model.name!r} needs {need:,} bytes or more per "
            f"pass, beyond the {budget_bytes:,}-byte memory budget; choose a smaller window or "
            "a larger memory limit"
        )
    run_s = n * plan.predicted_window_s + first_pass_seconds(plan)
    return GraphChoice(window, plan, n, prod(region) / max(1e-12, run_s))


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
           overlap: float = 0.25, machine: MachineProfile | None = None) -> GraphChoice:
    """The candidate with the most predicted voxels/s whose pass fits the budget (its
    first pass's extra cost counted once)."""
    candidates = ([model.fixed_window] if model.fixed_window
                  else _fewer_passes(model, _candidates(model, region), region, overlap))
    best: GraphChoice | None = None
    errors = []
    for window in candidates:
        try:
            choice = plan_window(model, window, budget_bytes, region, overlap, machine)
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
