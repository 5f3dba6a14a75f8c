"""`POST /v1/plan` bodies: the planner's plan for a sequential network, or the window (or
tile) summary of an ONNX graph model (the same dict `znni plan MODEL.onnx --json` prints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from znni.engine.location import Location
from znni.jobs.catalogue import Model
from znni.jobs.settings import Settings
from znni.model.network import Network
from znni.model.onnx_model import OnnxModel

if TYPE_CHECKING:
    from znni.engine.output.form import OutputForm


class PlannerUnavailableError(RuntimeError):
    """The planner cannot run on this server (not installed, or a device it lacks)."""


@dataclass(frozen=True)
class JobShape:
    """What a job's whole run time depends on beyond its region: the input's bytes per
    value, the output's dtype and chunks, the precision, where the region lies in the
    volume (the output's chunks and the mask are the volume's) and the output form
    (labels, mask, skip_empty: engine.output.form, as the request gave them)."""

    in_bytes: int = 1
    dtype: str = "float32"
    chunks: tuple[int, int, int] | None = None
    precision: str = "fp32"
    tta: str | None = None  # test-time flips: 2^k passes per window or patch
    lo: tuple[int, int, int] = (0, 0, 0)  # the region's start in the volume
    volume: tuple[int, int, int] | None = None  # the input volume's shape (None: the region)
    form: OutputForm | None = None  # checked (jobs.submission.plan_form)
    labels: str | None = None  # the output options as given, shown in the plan
    mask: str | None = None
    skip_empty: float | None = None

    @property
    def flips(self) -> int:
        from znni.engine.compute.tta import flip_count

        return flip_count(self.tta)

    def stored(self, channels: int) -> tuple[int, str]:
        """The output array's channels and dtype (labels set them)."""
        return (channels, self.dtype) if self.form is None else (self.form.channels,
                                                                 self.form.dtype)

    def output_chunks(self, region: tuple[int, int, int], channels: int) -> Any:
        """The output's chunks as the job's (engine.io.volume.output_chunks on the volume)."""
        from znni.engine.io.volume import output_chunks

        return output_chunks(self.chunks, None, self.volume or region,
                             *self.stored(channels), "the output")

    def fields(self, channels: int, skipped_blocks: int | None) -> dict[str, Any]:
        """The plan's labels, mask and skip_empty fields (as `znni plan` shows them)."""
        from znni.engine.output.form import plan_fields

        mask = None if self.mask is None else Location.parse(self.mask, "mask")
        return plan_fields(self.labels, self.dtype, mask, self.skip_empty, channels,
                           skipped_blocks)


def plan_summary(
    model: Model, settings: Settings, device: str, memory_limit_bytes: int | None,
    region: tuple[int, int, int] | None = None, overlap: float = 0.25,
    window: tuple[int, int, int] | None = None, job: JobShape = JobShape(),
) -> dict[str, Any]:
    """The plan body for `model` on this server's machine (or its `--machine` profile),
    within the pass budget a job with this memory limit plans in, for `region` (the
    request's input region) where given, with the whole run's `predicted_job_seconds`
    as `znni plan --input` gives it (blocks wholly outside the job's mask not computed);
    ValueError for a request that cannot be planned."""
    if isinstance(model, OnnxModel):
        return _graph_summary(model, settings, device, memory_limit_bytes, region, overlap,
                              window, job)
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
    # rates from a first plan's part of the calibration (`znni plan` measured no more yet)
    partial = {"partial_calibration": True} if machine.partial_calibration else {}
    if region is None:
        plan = flipped_plan(exact_plan(model, machine, settings, device, memory_limit_bytes),
                            job.flips, model)
        return {"mode": "exact", **plan.to_dict(), **partial,
                **job.fields(model.out_channels, 0)}
    plan = job_plan(model, machine, settings, device, memory_limit_bytes, region, job)
    return {"mode": "exact", **plan.to_dict(), **partial, "region": list(region),
            "predicted_seconds": region_seconds(region, region_voxels_per_second(plan, region)),
            "predicted_job_seconds": plan.job_seconds["total_s"],
            "job_peak_bytes": plan.job_seconds["peak_bytes"],
            **job.fields(model.out_channels, plan.job_seconds.get("skipped_blocks", 0))}


def _graph_summary(
    model: OnnxModel, settings: Settings, device: str, memory_limit_bytes: int | None,
    region: tuple[int, int, int] | None, overlap: float,
    window: tuple[int, int, int] | None, job: JobShape,
) -> dict[str, Any]:
    """A graph model's summary (`znni plan MODEL.onnx --json`'s), with its whole run over
    `region` where given; a graph run's prediction computes the blocks outside the mask
    too, so `blocks_outside_mask` is null (as `znni plan` shows it). `device` as a job
    runs it (graph_plan_device)."""
    from znni.engine.compute.graph_plan import graph_plan, graph_plan_device, with_job_time

    other = _machine(settings) if settings.machine is not None else None
    if job.precision in ("int8", "auto"):  # the CPU's; measured when a job runs on the input
        from znni.engine.compute.execution import check_precision
        from znni.engine.precision_run import JOB_MEASURES, plan_candidates, unmeasured_summary

        check_precision(device, job.precision)  # not on a GPU
        summary = unmeasured_summary(job.precision, plan_candidates(
            job.precision, lambda p: graph_plan(model, memory_limit_bytes, region, overlap,
                                                other, window, device="cpu", precision=p,
                                                flips=job.flips)), JOB_MEASURES)
    else:
        summary = graph_plan(model, memory_limit_bytes, region, overlap, other, window,
                             device=graph_plan_device(device, other),
                             precision=job.precision, flips=job.flips)
    fields = job.fields(model.out_channels, None if job.mask is not None else 0)
    if region is None:
        return {**summary, **fields}
    chunks = job.output_chunks(region, model.out_channels)
    channels, out_dtype = job.stored(model.out_channels)
    return {**with_job_time(summary, model, chunks, job.in_bytes, out_dtype,
                            out_channels=channels), **fields}


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
    from znni.planner.plan import as_device
    from znni.planner.search import make_plan

    other = machine.memory_bytes if settings.machine is not None else None
    if pass_bytes is None:
        pass_bytes = pass_budget_bytes(memory_limit_bytes, other)
    try:
        result = make_plan(
            network, machine=machine, device=as_device(device), memory_limit_bytes=pass_bytes,
            max_output=region,
        )
    except ImportError as e:  # e.g. a GPU profile asked for without CuPy installed
        raise PlannerUnavailableError(f"the planner cannot run here ({e})") from e
    return result


def job_plan(
    network: Network, machine: Any, settings: Settings, device: str,
    memory_limit_bytes: int | None, region: tuple[int, int, int], job: JobShape,
) -> Any:
    """The plan a job over `region` (from `job.lo`) makes (patch, batch and blocks chosen
    together, its whole run predicted with the blocks wholly outside the mask written
    without compute: engine.compute.layout.plan_with_layout), as `znni plan --input` does."""
    from znni.engine.compute.layout import memory_budget_bytes, plan_with_layout
    from znni.engine.geometry import Box

    other = machine.memory_bytes if settings.machine is not None else None
    chunks = job.output_chunks(region, network.out_channels)
    budget = memory_budget_bytes(memory_limit_bytes, other)
    lo = job.lo
    box = Box(lo, (lo[0] + region[0], lo[1] + region[1], lo[2] + region[2]))

    def other_machine(pass_bytes: int) -> Any:
        return exact_plan(network, machine, settings, device, None, region, pass_bytes)

    # this machine: as a job plans (execution.plan_job, its plans cached)
    channels, out_dtype = job.stored(network.out_channels)
    from znni.planner.plan import as_device

    return plan_with_layout(network, as_device(device), chunks, box, budget, job.in_bytes,
                            out_dtype, plan_for=None if settings.machine is None else other_machine,
                            known_machine=settings.machine is None, flips=job.flips,
                            skip=None if job.form is None else job.form.outside,
                            out_channels=channels)
