"""What a run of an ONNX graph model will do: its dense-output mode and why, its grid,
and the window (windowed) or tile (exact) chosen within the memory budget."""

from __future__ import annotations

from typing import Any, TypedDict

from znni.engine.compute.execution import graph_backend_name, planning_machine
from znni.engine.compute.graph_choice import GraphChoice, choose, plan_window
from znni.engine.compute.layout import pass_budget_bytes, region_seconds, windowed_block_shape
from znni.engine.compute.tiles import block_tiles, exact_block_shape, tile_output
from znni.engine.compute.windows import WindowGrid
from znni.engine.geometry import Box
from znni.engine.job import SegmentJob
from znni.model.graph import window_dependence
from znni.model.onnx_model import OnnxModel
from znni.planner.machine import MachineProfile
from znni.triple import Triple, as_triple

UNBOUNDED = (512, 512, 512)  # no region given: plan for a 512^3 volume
EXACT_REASON = (
    "window-independent: valid convolutions and pools, crops, upsampling and merges; "
    "tiled on its downsampling grid, equal to one run over the border-extended volume"
)


def graph_plan_device(device: str, machine: MachineProfile | None) -> str:
    """"cpu" or "gpu": where a graph job's windows run, as segment runs them
    (execution.graph_runs_on_gpu): cpu-gpu runs every window on the GPU (the CPU reads,
    gathers and writes), auto does where a device is visible; with another machine's
    profile, auto means the profile's GPU when it has one."""
    from znni.engine.compute.execution import graph_runs_on_gpu

    if device == "auto" and machine is not None:
        return "gpu" if machine.gpu is not None else "cpu"
    return "gpu" if graph_runs_on_gpu(device) else "cpu"


class _How(TypedDict):
    """How graph_plan's window is planned (plan_window's and choose's keywords)."""

    device: str
    precision: str
    device_cap: int | None


def graph_plan(
    model: OnnxModel, limit_bytes: int | None, region: tuple[int, int, int] | None = None,
    overlap: float = 0.25, machine: MachineProfile | None = None,
    window: tuple[int, int, int] | None = None, *, device: str = "cpu",
    precision: str = "fp32", flips: int = 1,
) -> dict[str, Any]:
    """A JSON-ready summary (the `znni plan` and POST /v1/plan body for graph models): the
    window `segment` would choose for `region` (the volume or ROI; None: UNBOUNDED) under
    the same pass budget, and what it predicts for the whole region. `machine`: another
    computer's profile (its budget, without a limit, half its memory), else this one;
    `window`: the given window (or tile) instead of the chosen one; `device` "gpu": the GPU
    plan at `precision` within the device cap (--memory-limit caps it too), with each conv
    node's primitive and the predicted time of every candidate; `flips`: passes a window."""
    budget = pass_budget_bytes(limit_bytes, machine.memory_bytes if machine else None)
    shape = region or UNBOUNDED
    common = {
        "network": model.name, "in_channels": model.in_channels,
        "out_channels": model.out_channels, "size_factor": list(model.size_factor),
        "min_window": list(model.min_window),
        "fixed_window": list(model.fixed_window) if model.fixed_window else None,
        "memory_budget_bytes": budget,
    }
    how: _How = {"device": device, "precision": precision, "device_cap": None}
    gpu: dict[str, Any] = {}
    if device == "gpu":
        from znni.planner.graph.gpu_search import device_cap_bytes

        machine = machine or planning_machine()
        gpu["device_cap_bytes"] = how["device_cap"] = device_cap_bytes(machine, limit_bytes)
    if window is not None:  # segment's --window: planned and checked, not chosen
        choice = plan_window(model, window, budget, shape, overlap, machine, **how, flips=flips)
    else:
        choice = choose(model, budget, shape, overlap, machine, **how, flips=flips)
    if device == "gpu":
        gpu.update(gpu_details(choice))
    planned = {
        "region": list(shape),
        "region_given": region is not None,
        "window_given": window is not None,
        "passes": choice.passes, "flips": choice.flips,  # windows; passes each (test-time flips)
        "predicted_seconds": region_seconds(shape, choice.predicted_voxels_per_second),
        "window": list(choice.window),
        "window_peak_bytes": choice.plan.peak_bytes,
        "batch": choice.plan.batch,
        "predicted_window_s": choice.plan.predicted_window_s,
        "predicted_voxels_per_second": choice.predicted_voxels_per_second,
        "primitives": choice.plan.primitives,
        "device": choice.plan.device,
        "precision": choice.plan.precision,
        "compiled": choice.plan.compiled,  # why: against our node-by-node plan's time
        "node_by_node_window_s": choice.plan.alternative_s or choice.plan.predicted_window_s,
        **gpu,
    }
    if model.mode == "exact":
        return {"mode": "exact", "reason": EXACT_REASON, **common,
                "context": list(model.context),
                "tile_output": list(tile_output(model, choice.window)), **planned}
    reason = window_dependence(model.graph(choice.window)) or "its output has the window's size"
    return {"mode": "windowed", "reason": reason, "overlap": overlap, **common, **planned}


def gpu_details(choice: GraphChoice) -> dict[str, Any]:
    """A GPU plan's device peak, its batch's compute and copy seconds, and per conv node the
    chosen primitive and every candidate's predicted seconds (why it was chosen)."""
    plan = choice.plan
    return {
        "device_peak_bytes": plan.device_peak_bytes,
        "compute_s": plan.compute_s,
        "transfer_s": plan.transfer_s,
        "conv_nodes": [
            {"name": n.name, "op": n.op, "primitive": n.primitive, "predicted_s": n.predicted_s,
             "workspace_bytes": n.workspace_bytes,
             "candidates": {name: seconds for name, seconds, _ in n.candidates}}
            for n in plan.nodes if n.primitive is not None
        ],
    }


def run_summary(job: SegmentJob, choice: GraphChoice | None, volume_shape: Triple,
                block_shape: Triple, region: Triple | None = None,
                in_bytes: int = 1, stored: tuple[int, str] | None = None) -> dict[str, Any]:
    """A graph model run's plan for its report: mode, window or tile, where it runs and at
    what precision (what runs: our CPU kernels stay fp32), whether the whole window is one
    compiled network, predictions, primitives. `stored`: the output's (channels, dtype)
    as written (labels change them; None: the network's channels, the job's dtype)."""
    model = job.network
    if choice is None or not isinstance(model, OnnxModel):
        raise TypeError(f"run_summary is for ONNX graph models, not {type(model).__name__}")
    stored = stored or (model.out_channels, job.dtype)
    window = choice.window
    predicted = {
        "device": graph_backend_name(job.device), "precision": choice.plan.precision,
        "compiled": choice.plan.compiled,
        "predicted_window_s": choice.plan.predicted_window_s,
        "predicted_voxels_per_second": choice.predicted_voxels_per_second,
        "peak_bytes": choice.plan.peak_bytes, "batch": choice.plan.batch,
        "primitives": choice.plan.primitives, "block_shape": list(block_shape),
        "tta": job.tta, "flips": choice.flips,
        "passes": choice.passes,  # over the region in one block (tiles: blocks run more)
    }
    if model.mode == "exact":
        summary = {"mode": "exact", "tile": list(window),
                   "tile_output": list(tile_output(model, window)),
                   "context": list(model.context), "size_factor": list(model.size_factor),
                   **predicted}
        return _job_time(summary, model, region, in_bytes, stored)
    grid = WindowGrid.for_volume(volume_shape, window, job.overlap)
    summary = {"mode": "windowed", "window": list(window), "overlap": job.overlap,
               "blend": job.blend, "windows": grid.num_windows, **predicted}
    return _job_time(summary, model, region, in_bytes, stored)


def _job_time(summary: dict[str, Any], model: OnnxModel, region: Triple | None,
              in_bytes: int, stored: tuple[int, str]) -> dict[str, Any]:
    """A run's summary with its whole-run prediction over `region` (none without one)."""
    if region is None:
        return summary
    return with_job_time({**summary, "region": list(region)}, model, None, in_bytes,
                         stored[1], out_channels=stored[0])


def with_job_time(summary: dict[str, Any], model: OnnxModel, chunks: Triple | None,
                  in_bytes: int, out_dtype: str,
                  out_channels: int | None = None) -> dict[str, Any]:
    """`summary` (graph_plan's or run_summary's) with the whole run's predicted seconds
    (planner.jobtime.graph_job_seconds) over its region, in the blocks `segment` cuts: the
    summary's block shape, else the default for the output's `chunks` (exact tiles: every
    block runs its own tiles, counted)."""
    from znni.planner.jobtime import graph_job_seconds

    region = as_triple(summary["region"], "the plan's region")
    window = as_triple(summary.get("window") or summary["tile"], "the plan's window")
    box = Box((0, 0, 0), region)
    if summary.get("block_shape"):
        block = as_triple(summary["block_shape"], "the plan's block shape")
    elif chunks is None:
        raise ValueError("a graph plan's whole-run time needs the output's chunks or blocks")
    else:
        block = default_block_shape(model, window, chunks, box)
    region_s = region_seconds(region, summary["predicted_voxels_per_second"])
    margin: Triple = window  # windowed: a block reads about half a window beyond each face
    if model.mode == "exact":
        span = tile_output(model, window)
        margin = (window[0] - span[0], window[1] - span[1], window[2] - span[2])
        region_s *= block_tiles(model, window, block, box) / max(1, summary["passes"])
    job = graph_job_seconds(region_s, region, block, margin, in_channels=model.in_channels,
                            out_channels=out_channels or model.out_channels, in_bytes=in_bytes,
                            out_dtype=out_dtype)
    return {**summary, "predicted_job_seconds": job["total_s"], "job_seconds": job}


def with_settling_time(summary: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A run's summary with int8's or auto's settlement (measured, `seconds`) in its
    whole-run time (planner.jobtime.with_settling); a summary without one as it is."""
    from znni.planner.jobtime import with_settling

    if not summary.get("job_seconds"):
        return summary
    job = with_settling(summary["job_seconds"], seconds)
    return {**summary, "job_seconds": job, "predicted_job_seconds": job["total_s"]}


def default_block_shape(model: OnnxModel, window: Triple, chunks: Triple, region: Box) -> Triple:
    """`segment`'s block for a graph job without --block: about two windows wide (windows
    straddling blocks are kept, computed once), or for exact tiles the extent that runs the
    fewest tiles (tiles.exact_block_shape)."""
    if model.mode == "exact":
        return exact_block_shape(model, window, chunks, region)
    return windowed_block_shape(chunks, window, region.shape)
