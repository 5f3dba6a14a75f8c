"""`POST /v1/plan` bodies: the planner's plan for a sequential network, or the window (or
tile) summary of an ONNX graph model (the same dict `znni plan MODEL.onnx --json` prints)."""

from __future__ import annotations

from typing import Any

from znni.jobs.catalogue import Model
from znni.jobs.settings import Settings
from znni.model.network import Network
from znni.model.onnx_model import OnnxModel


class PlannerUnavailableError(RuntimeError):
    """The planner cannot run on this server (not installed, or a device it lacks)."""


def plan_summary(
    model: Model, settings: Settings, device: str, memory_limit_bytes: int | None,
    region: tuple[int, int, int] | None = None, overlap: float = 0.25,
    window: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """The plan body for `model` on this server's machine (or its `--machine` profile),
    within the pass budget a job with this memory limit plans in, for `region` (the
    request's input region) where given; ValueError for a request that cannot be
    planned."""
    if isinstance(model, OnnxModel):
        from znni.engine.compute.graph_plan import graph_plan

        other = _machine(settings) if settings.machine is not None else None
        return graph_plan(model, memory_limit_bytes, region, overlap, other, window)
    if window is not None:
        raise ValueError("window applies to ONNX graph models; this network is sequential "
                         "and its patch is planned")
    from znni.engine.compute.layout import region_seconds
    from znni.planner.search import region_voxels_per_second

    plan = exact_plan(model, _machine(settings), settings, device, memory_limit_bytes, region)
    extra = {} if region is None else {
        "region": list(region),
        "predicted_seconds": region_seconds(region, region_voxels_per_second(plan, region)),
    }
    return {"mode": "exact", **plan.to_dict(), **extra}


def _machine(settings: Settings) -> Any:
    try:
        from znni.planner.detect import detect_machine
        from znni.planner.machine import MachineProfile
    except ImportError as e:
        raise PlannerUnavailableError("the planner is not installed") from e
    if settings.machine is not None:
        return MachineProfile.load(settings.machine)
    return detect_machine(calibrate=None)  # cached rates; never measures here


def exact_plan(
    network: Network, machine: Any, settings: Settings, device: str,
    memory_limit_bytes: int | None, region: tuple[int, int, int] | None = None,
) -> Any:
    """The planner's plan (planner.Plan) for a sequential network, as a job would make it."""
    from znni.engine.compute.layout import pass_budget_bytes
    from znni.planner.search import make_plan

    other = machine.memory_bytes if settings.machine is not None else None
    try:
        result = make_plan(
            network, machine=machine, device=device,
            memory_limit_bytes=pass_budget_bytes(memory_limit_bytes, other), max_output=region,
        )
    except ImportError as e:  # e.g. a GPU profile asked for without CuPy installed
        raise PlannerUnavailableError(f"the planner cannot run here ({e})") from e
    return result
