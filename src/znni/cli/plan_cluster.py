"""`znni plan --workers N` (or `--scheduler`, `--deadline`): the job on a Dask cluster
(planner/cluster.py), and `znni plan --measure-store URL`: a store's bandwidth."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from znni.model.network import Network
    from znni.planner.block_costs import BlockCosts
    from znni.planner.cluster import JobFixed
    from znni.planner.plan import Plan

BATCH_SCHEDULERS = ("slurm", "pbs", "lsf", "sge")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, help="with --input: predict the job on N Dask "
                   "workers: with --machine, N nodes of that profile (one worker each); "
                   "without, N worker processes sharing this host (as --scheduler local:N)")
    p.add_argument("--scheduler", help="as `znni segment --scheduler`: local:N (N processes "
                   "on this host), slurm:N, pbs:N, lsf:N or sge:N (N nodes of --machine, "
                   "default this machine); tcp://HOST:PORT with --workers N (nodes)")
    p.add_argument("--store-bandwidth", metavar="RATE", help="with --workers: the store's "
                   "aggregate read + write bandwidth, e.g. 2GB/s (default: unbounded; "
                   "`znni plan --measure-store URL` measures one)")
    p.add_argument("--queue-wait", metavar="DURATION", default="0", help="with --workers: "
                   "the batch queue's wait before the workers start, e.g. 10m (default 0)")
    p.add_argument("--deadline", metavar="DURATION", help="with --input: the fewest workers "
                   "whose whole job takes at most this, e.g. 7d (s, m, h, d)")
    p.add_argument("--measure-store", metavar="URL", help="measure a store's write and read "
                   "bandwidth (a scratch array of --measure-size under URL, removed after) "
                   "and print it as a --store-bandwidth value; no NETWORK needed")
    p.add_argument("--measure-size", default="256MiB", help="with --measure-store: bytes "
                   "written then read (default 256MiB)")


@dataclass(frozen=True)
class ClusterAsk:
    """The cluster the options describe, checked before any planning."""

    workers: int | None  # None: --deadline searches it
    placement: str  # "host" or "nodes"
    store_bandwidth: float | None
    queue_wait_s: float
    deadline_s: float | None


def cluster_ask(args: argparse.Namespace) -> ClusterAsk | None:
    """The options' cluster, or None where none is asked; ValueError in one sentence for
    anything inconsistent."""
    from znni.planner.cluster import parse_bandwidth, parse_duration

    workers, placement = _scheduler_workers(args)
    if args.workers is not None:
        if args.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        if workers is not None and workers != args.workers:
            raise ValueError(f"--workers {args.workers} and --scheduler {args.scheduler} ask "
                             "for different numbers of workers")
        workers = args.workers
        placement = placement or ("nodes" if args.machine else "host")
    deadline = None if args.deadline is None else parse_duration(args.deadline, "--deadline")
    if deadline is not None and deadline <= 0:
        raise ValueError(f"--deadline {args.deadline!r} must be a positive duration")
    given = [f for f, v in (("--store-bandwidth", args.store_bandwidth),
                            ("--queue-wait", args.queue_wait not in (None, "0"))) if v]
    if workers is None and deadline is None:
        if given:
            raise ValueError(f"{given[0]} needs --workers N (or --scheduler, --deadline)")
        return None
    if args.input is None:
        raise ValueError("--workers, --scheduler and --deadline need --input, the volume "
                         "whose blocks the workers share")
    bandwidth = None if args.store_bandwidth is None else parse_bandwidth(args.store_bandwidth)
    return ClusterAsk(workers, placement or "nodes", bandwidth,
                      parse_duration(args.queue_wait or "0", "--queue-wait"), deadline)


def _scheduler_workers(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """(workers, placement) of --scheduler; (None, None) without it."""
    text = getattr(args, "scheduler", None)
    if text is None:
        return None, None
    m = re.fullmatch(r"(local|slurm|pbs|lsf|sge):(\d+)", text)
    if m:
        n = int(m.group(2))
        if n < 1:
            raise ValueError(f"--scheduler {text} needs at least one worker")
        return n, "host" if m.group(1) == "local" else "nodes"
    if re.fullmatch(r"tcp://[\w.\-]+:\d+", text):
        if args.workers is None:
            raise ValueError(f"--scheduler {text} is a running cluster whose size the plan "
                             "cannot know; give --workers N, its number of workers")
        return None, "nodes"
    raise ValueError(f"--scheduler {text!r} is not local:N, slurm:N, pbs:N, lsf:N, sge:N or "
                     "tcp://HOST:PORT")


def _cluster(ask: ClusterAsk, machine: Any, workers: int) -> Any:
    from znni.planner.cluster import Cluster

    return Cluster(workers, "host" if ask.placement == "host" else "nodes", machine.cores,
                   machine.memory_bytes, ask.store_bandwidth, ask.queue_wait_s, machine.name)


def predict(ask: ClusterAsk, costs: BlockCosts, fixed: JobFixed, machine: Any
            ) -> dict[str, Any]:
    """The cluster record: at --workers, or the fewest meeting --deadline (both: the
    deadline's N, and the given N's total kept as `at_workers`)."""
    from znni.planner.cluster import cluster_seconds, smallest_workers

    if ask.deadline_s is None:
        assert ask.workers is not None
        return cluster_seconds(costs, fixed, _cluster(ask, machine, ask.workers))
    found = smallest_workers(costs, fixed, _cluster(ask, machine, ask.workers or 1),
                             ask.deadline_s)
    if ask.workers is not None:
        at = cluster_seconds(costs, fixed, _cluster(ask, machine, ask.workers))
        found["at_workers"] = {"workers": ask.workers, "total_s": at["total_s"],
                               "bottleneck": at["bottleneck"]}
    return found


def sequential_cluster(args: argparse.Namespace, ask: ClusterAsk, network: Network,
                       plan: Plan, machine: Any) -> dict[str, Any]:
    """The cluster record of a sequential network's planned job over --input."""
    from znni.cli.output_options import plan_form
    from znni.cli.plan_common import input_volume
    from znni.planner.block_costs import block_costs
    from znni.planner.cluster import JobFixed

    job = plan.job_seconds or {}
    assert plan.block_edges is not None
    volume = input_volume(args, network.in_channels)
    form = plan_form(args, network.out_channels, volume.shape)
    edges = plan.block_edges
    costs = block_costs(plan, network, edges, in_bytes=volume.dtype.itemsize,
                        out_dtype=form.dtype, skipped=form.outside(edges),
                        out_channels=form.channels)
    fixed = JobFixed(job["startup_s"] + job.get("planning_s", 0.0),
                     job["fftw_planning_s"] + job["first_pass_s"], int(job["peak_bytes"]),
                     worker_cache_bytes(args, machine))
    return predict(ask, costs, fixed, machine)


def worker_cache_bytes(args: argparse.Namespace, machine: Any) -> int:
    """A worker's input chunk cache under the run's memory budget (as segment sizes it)."""
    from znni.engine.compute.layout import input_cache_bytes, memory_budget_bytes
    from znni.engine.units import parse_bytes

    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    return input_cache_bytes(memory_budget_bytes(
        limit, machine.memory_bytes if args.machine else None))


def graph_cluster(args: argparse.Namespace, ask: ClusterAsk, summary: dict[str, Any]
                  ) -> dict[str, Any]:
    """The cluster record of a graph model's job (its blocks alike, as graph_job_seconds
    prices them)."""
    from znni.planner.block_costs import uniform_costs
    from znni.planner.cluster import JobFixed

    job = summary["job_seconds"]
    costs = uniform_costs(job["blocks"], job["block_compute_s"], job["block_read_s"],
                          job["block_write_s"], job["block_read_bytes"],
                          job["block_write_bytes"])
    machine = this_or_profile(args)
    fixed = JobFixed(job["startup_s"], 0.0, int(summary.get("window_peak_bytes", 0)),
                     worker_cache_bytes(args, machine))
    return predict(ask, costs, fixed, machine)


def this_or_profile(args: argparse.Namespace) -> Any:
    from znni.planner.detect import detect_machine
    from znni.planner.machine import MachineProfile

    return MachineProfile.load(args.machine) if args.machine else detect_machine()


def cluster_lines(c: dict[str, Any]) -> str:
    """The cluster record as `znni plan`'s text."""
    from znni.planner.cluster import bandwidth_text

    where = (f"{c['workers']} worker processes sharing this host's {c['cores']} cores"
             if c["placement"] == "host" else
             f"{c['workers']} nodes of {c['machine']} ({c['cores']} cores each)")
    io = ("unbounded (no --store-bandwidth)" if c["store_io_s"] is None else
          f"{c['store_io_s']:,.1f} s at {bandwidth_text(c['store_bandwidth_bytes_per_s'])}")
    lines = [
        "", f"cluster: {where}; {c['blocks']:,} blocks, {c['busy_workers']:,} workers busy",
        f"  per-worker compute        {c['per_worker_compute_s']:>12,.1f} s  (a block "
        f"{c['block_s_mean']:,.2f} s mean, {c['block_s_max']:,.2f} s longest, read, compute "
        f"and write; each worker's first pass +{c['worker_first_s']:,.1f} s)",
        f"  compute makespan          {c['compute_makespan_s']:>12,.1f} s  "
        f"({c['makespan_method']}; tail of the last blocks {c['tail_s']:,.1f} s)",
        f"  with the store's waits    {c['makespan_s']:>12,.1f} s  (a block waits "
        f"{c['store_wait_s']:,.2f} s at the store, its queue included)",
        f"  store I/O                 {io}: {c['read_bytes'] / 1e9:,.2f} GB read, "
        f"{c['write_bytes'] / 1e9:,.2f} GB written; compute-bound above "
        f"{bandwidth_text(c['bandwidth_to_stay_compute_bound'])}",
        f"  start-up                  {c['startup_s']:>12,.1f} s  (this process "
        f"{c['client_s']:,.1f} s, the cluster {c['cluster_start_s']:,.1f} s), queue wait "
        f"{c['queue_wait_s']:,.0f} s",
        f"  whole job                 {c['total_s']:>12,.1f} s  ({_human(c['total_s'])}), "
        f"{c['node_hours']:,.2f} node-hours; bottleneck: {c['bottleneck']}",
    ]
    if not c["memory_fits"]:
        lines.append(f"  memory: {c['workers']} workers' peaks {c['peak_bytes'] / 2**30:,.2f} "
                     f"GiB exceed the machine's {c['memory_bytes'] / 2**30:,.2f} GiB")
    if "deadline_s" in c:
        lines.append(f"  deadline {_human(c['deadline_s'])}: " + (
            f"{c['deadline_workers']:,} workers (whole job {_human(c['total_s'])})"
            if c["deadline_workers"] else c["deadline_sentence"]))
    return "\n".join(lines)


def _human(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.1f} s"


def measure_store_run(args: argparse.Namespace) -> int:
    """`znni plan --measure-store URL`: the record (--json) or its lines."""
    from znni.engine.io.store_speed import measure_store
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.location import Location
    from znni.engine.units import parse_bytes
    from znni.planner.cluster import bandwidth_text

    where = Location.parse(args.measure_store, "store")
    ctx = context_for((where,), parse_storage_options(args.storage_option))
    record = measure_store(where, parse_bytes(args.measure_size), ctx=ctx)
    record["store_bandwidth"] = bandwidth_text(record["bytes_per_s"])
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    print(f"store {record['location']}: wrote {record['bytes'] / 1e6:,.0f} MB in "
          f"{record['chunks']} chunks at {bandwidth_text(record['write_bytes_per_s'])}, read "
          f"it back at {bandwidth_text(record['read_bytes_per_s'])} (one client)")
    print(f"--store-bandwidth {record['store_bandwidth']}")
    return 0
