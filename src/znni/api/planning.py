"""`POST /v1/plan` bodies: the planner's plan for a sequential network, or the window (or
tile) summary of an ONNX graph model (the same dict `znni plan MODEL.onnx --json` prints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from znni.jobs.catalogue import Model
from znni.jobs.settings import Settings
from znni.model.network import Network
from znni.model.onnx_model import OnnxModel


class PlannerUnavailableError(RuntimeError):
    """The planner cannot run on this server (not installed, or a device it lacks)."""


@dataclass(frozen=True)
class JobShape:
    """What a job's whole run time depends on beyond its region: the input's bytes per
    value, the output's dtype and chunks, and the precision."""

    in_bytes: int = 1
    dtype: str = "float32"
    chunks: tuple[int, int, int] | None = None
    precision: str = "fp32"
    tta: str | None = None  # test-time flips: 2^k passes per window or patch

    @property
    def flips(self) -> int:
        from znni.engine.compute.tta import flip_count

        return flip_count(self.tta)


def plan_summary(
    model: Model, settings: Settings, device: str, memory_limit_bytes: int | None,
    region: tuple[int, int, int] | None = None, overlap: float = 0.25,
    window: tuple[int, int, int] | None = None, job: JobShape = JobShape(),
) -> dict[str, Any]:
    """The plan body for `model` on this server's machine (or its `--machine` profile),
    within the pass budget a job with this memory limit plans in, for `region` (the
    request's input region) where given, with the whole run's `predicted_job_seconds`
    as `znni plan --input` gives it; ValueError for a request that cannot be planned."""
    if isinstance(model, OnnxModel):
        from znni.engine.compute.graph_plan import graph_plan, with_job_time

        other = _machine(settings) if settings.machine is not None else None
        summary = graph_plan(model, memory_limit_bytes, region, overlap, other, window,
                             precision=job.precision, flips=job.flips)
        if region is None:
            return summary
        from znni.engine.io.volume import output_chunks

        chunks = output_chunks(job.chunks, None, region, model.out_channels, job.dtype,
                               "the output")
        return with_job_time(summary, model, chunks, job.in_bytes, job.dtype)
    if window is not None:
        raise ValueError("window applies to ONNX graph models; this network is sequential "
                         "and its patch is planned")
    if job.precision != "fp32":
        raise ValueError(f"precision {job.precision} applies to ONNX graph models in this "
                         "version; sequential networks are planned in fp32")
    from znni.engine.compute.layout import region_seconds
    from znni.engine.compute.tta import flipped_plan
    from znni.planner.search import region_voxels_per_second

    machine = _machine(settings)
    if region is None:
        plan = flipped_plan(exact_plan(model, machine, settings, device, memory_limit_bytes),
                            job.flips, model)
        return {"mode": "exact", **plan.to_dict()}
    plan = job_plan(model, machine, settings, device, memory_limit_bytes, region, job)
    return {"mode": "exact", **plan.to_dict(), "region": list(region),
            "predicted_seconds": region_seconds(region, region_voxels_per_second(plan, region)),
            "predicted_job_seconds": plan.job_seconds["total_s"],
            "job_peak_bytes": plan.job_seconds["peak_bytes"]}


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
    pass_bytes: int | None = None,
) -> Any:
    """The planner's plan (planner.Plan) for a sequential network, as a job would make it
    (within `pass_bytes` where given, else the pass budget of `memory_limit_bytes`)."""
    from znni.engine.compute.layout import pass_budget_bytes
    from znni.planner.search import make_plan

    other = machine.memory_bytes if settings.machine is not None else None
    if pass_bytes is None:
        pass_bytes = pass_budget_bytes(memory_limit_bytes, other)
    try:
        result = make_plan(
            network, machine=machine, device=device, memory_limit_bytes=pass_bytes,
            max_output=region,
        )
    except ImportError as e:  # e.g. a GPU profile asked for without CuPy installed
        raise PlannerUnavailableError(f"the planner cannot run here ({e})") from e
    return result


def job_plan(
    network: Network, machine: Any, settings: Settings, device: str,
    memory_limit_bytes: int | None, region: tuple[int, int, int], job: JobShape,
) -> Any:
    """The plan a job over `region` makes (patch, batch and blocks chosen together, its whole
    run predicted: engine.compute.layout.plan_with_layout), as `znni plan --input` does."""
    from znni.engine.compute.layout import memory_budget_bytes, plan_with_layout
    from znni.engine.geometry import Box
    from znni.engine.io.volume import output_chunks

    other = machine.memory_bytes if settings.machine is not None else None
    chunks = output_chunks(job.chunks, None, region, network.out_channels, job.dtype,
                           "the output")
    budget = memory_budget_bytes(memory_limit_bytes, other)

    def other_machine(pass_bytes: int) -> Any:
        return exact_plan(network, machine, settings, device, None, region, pass_bytes)

    # this machine: as a job plans (execution.plan_job, its plans cached)
    return plan_with_layout(network, device, chunks, Box((0, 0, 0), region), budget,
                            job.in_bytes, job.dtype,
                            plan_for=None if settings.machine is None else other_machine,
                            known_machine=settings.machine is None, flips=job.flips)
