"""`POST /v1/plan` with `workers` (or `deadline`): the job on a Dask cluster, the record
`znni plan --workers N --json` prints under `cluster` (planner/cluster.py)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from znni.api.planning import JobShape, _machine
from znni.jobs.settings import Settings


def cluster_asked(workers: int | None, deadline: str | float | None,
                  store_bandwidth: str | float | None, queue_wait: str | float | None,
                  has_input: bool) -> bool:
    """Whether a cluster is asked for; ValueError for cluster fields that cannot be used."""
    if workers is None and deadline is None:
        given = [n for n, v in (("store_bandwidth", store_bandwidth),
                                ("queue_wait", queue_wait)) if v is not None]
        if given:
            raise ValueError(f"{given[0]} needs workers (or deadline)")
        return False
    if not has_input:
        raise ValueError("workers and deadline need an input, the volume whose blocks the "
                         "workers share")
    return True


def cluster_record(
    result: dict[str, Any], model: Any, settings: Settings, job: JobShape, *,
    workers: int | None, placement: str | None, store_bandwidth: str | float | None,
    queue_wait: str | float | None, deadline: str | float | None,
    memory_limit_bytes: int | None = None,
) -> dict[str, Any]:
    """The cluster record for a plan body `result` (plan_summary's, with its whole run).
    Placement: `nodes` (one worker per machine of this server's profile) or `host` (worker
    processes sharing this server's machine); default nodes with the server's --machine,
    else host, as `znni plan --workers` without and with --machine."""
    from znni.planner.cluster import (
        Cluster,
        cluster_seconds,
        parse_bandwidth,
        parse_duration,
        smallest_workers,
    )

    machine = _machine(settings)
    where = placement or ("nodes" if settings.machine is not None else "host")
    if deadline is not None and workers is None:
        where = placement or "nodes"
    bandwidth = None if store_bandwidth is None else parse_bandwidth(store_bandwidth)
    wait = 0.0 if queue_wait is None else parse_duration(queue_wait, "queue_wait")
    limit = None if deadline is None else parse_duration(deadline, "deadline")
    if limit is not None and limit <= 0:
        raise ValueError(f"deadline {deadline!r} must be a positive duration")
    from znni.engine.compute.layout import input_cache_bytes, memory_budget_bytes

    costs, fixed = _costs(result, model, job)
    other = machine.memory_bytes if settings.machine is not None else None
    fixed = replace(fixed, cache_bytes=input_cache_bytes(
        memory_budget_bytes(memory_limit_bytes, other)))
    cluster = Cluster(workers or 1, "host" if where == "host" else "nodes", machine.cores,
                      machine.memory_bytes, bandwidth, wait, machine.name)
    if limit is None:
        return cluster_seconds(costs, fixed, cluster)
    return smallest_workers(costs, fixed, cluster, limit)


def _costs(result: dict[str, Any], model: Any, job: JobShape) -> tuple[Any, Any]:
    """(BlockCosts, JobFixed) of the planned job in `result`."""
    from znni.model.onnx_model import OnnxModel
    from znni.planner.block_costs import block_costs, uniform_costs
    from znni.planner.cluster import JobFixed
    from znni.planner.plan import Plan

    seconds = result["job_seconds"]
    if isinstance(model, OnnxModel):
        return (uniform_costs(seconds["blocks"], seconds["block_compute_s"],
                              seconds["block_read_s"], seconds["block_write_s"],
                              seconds["block_read_bytes"], seconds["block_write_bytes"]),
                JobFixed(seconds["startup_s"], 0.0, int(result.get("window_peak_bytes", 0))))
    names = {f.name for f in fields(Plan)}
    plan = Plan.from_dict({k: v for k, v in result.items() if k in names})
    assert plan.block_edges is not None
    channels, out_dtype = job.stored(model.out_channels)
    skipped = frozenset() if job.form is None else job.form.outside(plan.block_edges)
    costs = block_costs(plan, model, plan.block_edges, in_bytes=job.in_bytes,
                        out_dtype=out_dtype, skipped=skipped, out_channels=channels)
    fixed = JobFixed(seconds["startup_s"] + seconds.get("planning_s", 0.0),
                     seconds["fftw_planning_s"] + seconds["first_pass_s"],
                     int(seconds["peak_bytes"]))
    return costs, fixed
