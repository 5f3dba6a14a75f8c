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
    model: Model, settings: Settings, device: str, memory_limit_bytes: int | None
) -> dict[str, Any]:
    """The plan body for `model`; ValueError for a request that cannot be planned."""
    if isinstance(model, OnnxModel):
        from znni.engine.graph_plan import graph_plan

        return graph_plan(model, memory_limit_bytes)
    return {"mode": "exact", **exact_plan(model, settings, device, memory_limit_bytes)}


def exact_plan(
    network: Network, settings: Settings, device: str, memory_limit_bytes: int | None
) -> dict[str, Any]:
    """The planner's plan on this server's machine (or its `--machine` profile)."""
    try:
        from znni.planner.detect import detect_machine
        from znni.planner.machine import MachineProfile
        from znni.planner.search import make_plan
    except ImportError as e:
        raise PlannerUnavailableError("the planner is not installed") from e
    try:
        machine = (
            MachineProfile.load(settings.machine)
            if settings.machine is not None
            else detect_machine(calibrate=None)  # cached rates; never measures here
        )
        result = make_plan(
            network, machine=machine, device=device, memory_limit_bytes=memory_limit_bytes
        )
    except ImportError as e:  # e.g. a GPU profile asked for without CuPy installed
        raise PlannerUnavailableError(f"the planner cannot run here ({e})") from e
    return result.to_dict()
