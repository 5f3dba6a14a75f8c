"""The whole job on N Dask workers: plain arithmetic over the one-machine block costs.

Where the workers run:
- **nodes**: one worker per machine of a profile (a batch cluster's nodes, `--machine`).
  Dask hands the blocks out in order, each to the first worker free (the scheduler's queue;
  engine/sweep/dask.py submits them in block order), so the compute makespan is list
  scheduling: a min-heap of worker free times walked over the blocks, which is where the
  tail of the last blocks comes from. Each worker starts with its own FFTW planning and
  first pass's pages (its process plans its shapes, jobtime counts them once per process).
  A worker reads, computes and writes a block one after another (run_block_task: no
  read-ahead on Dask), so a block costs its compute plus its local read and write.
- **host**: N worker processes on this one machine (`--scheduler local:N`). Each worker's
  backend uses every core (primitives/cpu/backend.usable_cores; Dask's threads_per_worker=1
  is its task slots, not the backend's threads), so N workers share the cores: while any
  worker is busy the machine runs at its calibrated rate, and the blocks take the sum of
  their seconds, whatever N. Each worker adds its own process start, FFTW planning and
  first pass; memory is N workers' peaks.
The store: its aggregate read + write bandwidth B (bytes/s; None: unbounded) is shared by
whichever workers transfer at once. A worker's block is a cycle of its work (compute and
local reads and writes) and its transfer (its bytes over B, if alone); mean value analysis
of that closed network (residence_s: the store a processor-sharing queue; on one host the
cores one too) gives each block's mean wait at the store, queueing included. One worker
never overlaps its transfer with its compute; many saturate the store, whose throughput,
1 / (bytes per block / B), then bounds the job. The workers' makespan is the blocks as
scheduled plus each worker's share of those waits. The whole job: the submitting
process's start-up and search, the cluster's start, the batch queue's wait, then that
makespan. The bottleneck: "start-up" (with the queue's wait) where it is the largest part,
else "store bandwidth" where a block waits longer at the store than it works, else
"compute" ("worker reads/writes" where the blocks' local reads, decodes, encodes and
writes outweigh their compute).
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import Any, Literal

from znni.planner.block_costs import BlockCosts

Placement = Literal["host", "nodes"]

# LocalCluster(n_workers=N, threads_per_worker=1, processes=True) started, a client
# connected, and a first task run on every worker that imports what run_block_task imports
# (znni's engine, zarr, the CPU backend), wall seconds from before the interpreter starts:
# `benchmarks/cluster.py startup --workers 1,2,4 --reps 3` (under nice -10, which the
# kernel's autogroups keep from lifting it above other sessions' work: load 4-6 from
# their tests), 2-core AMD EPYC VM (lscpu "AMD EPYC"), 2026-11-28 17:29 UTC:
# medians 2.70 s (1 worker), 3.09 s (2), 5.23 s (4). Nodes start their one worker each in
# parallel: CLUSTER_START_S, the one-worker figure. On one host the workers import on the
# shared cores: SCHEDULER_START_S + N * HOST_WORKER_START_S, the least-squares line over
# the three (2.5, 3.4, 5.1 s).
# beyond this many workers the mean value analysis (residence_s) is Schweitzer's fixed point
EXACT_MVA_WORKERS = 2000
SCHWEITZER_STEPS = 200
CLUSTER_START_S = 2.7
SCHEDULER_START_S = 1.6
HOST_WORKER_START_S = 0.9


@dataclass(frozen=True)
class Cluster:
    """Where the job runs: `workers` Dask workers placed on `placement` (module docstring)
    of a machine with `cores` cores and `memory_bytes`; the store's aggregate bandwidth
    (None: unbounded); the batch queue's wait before the workers start."""

    workers: int
    placement: Placement = "nodes"
    cores: int = 1
    memory_bytes: int = 0
    store_bandwidth: float | None = None  # bytes/s, reads and writes together
    queue_wait_s: float = 0.0
    machine: str = ""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.store_bandwidth is not None and not self.store_bandwidth > 0:
            raise ValueError(f"store bandwidth must be positive, got {self.store_bandwidth}")
        if not self.queue_wait_s >= 0:
            raise ValueError(f"queue wait must be zero or more seconds, got {self.queue_wait_s}")


@dataclass(frozen=True)
class JobFixed:
    """The one-machine prediction's parts outside the blocks (jobtime.JobSeconds)."""

    client_s: float  # the submitting process: start-up and the planner's search
    worker_first_s: float  # each worker process: FFTW planning of new shapes, first pass
    worker_peak_bytes: int  # one worker's peak
    cache_bytes: int = 0  # each worker's input chunk cache (engine/io/chunk_cache.py)


def makespan_s(durations: list[float] | tuple[float, ...], workers: int,
               first_s: float = 0.0) -> float:
    """List scheduling: each block in order to the worker free first (ties: any), every
    worker free at `first_s`; the time the last block ends."""
    free = [first_s] * min(workers, max(1, len(durations)))
    heapq.heapify(free)
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def compute_makespan(costs: BlockCosts, workers: int, first_s: float) -> tuple[float, str]:
    """(seconds, how) of the blocks on `workers` nodes: alike blocks in closed form, else
    the list-scheduling simulation over the block order, else (a layout too large to list)
    Graham's bound first + sum/N + (1 - 1/N) * longest, which exceeds the simulation by
    at most one block."""
    n = costs.blocks
    if n == 0:
        return 0.0, "uniform"
    live = [c for c in costs.classes if c.count]
    if len(live) == 1:
        return first_s + -(-n // workers) * live[0].seconds, "uniform"
    if costs.order is not None:
        seconds = [c.seconds for c in costs.classes]
        return makespan_s([seconds[i] for i in costs.order], workers, first_s), "simulated"
    total = costs.total("seconds")
    bound = first_s + total / workers + (1 - 1 / workers) * costs.longest_s()
    return max(bound, first_s + costs.longest_s()), "graham bound"


def store_read_bytes(costs: BlockCosts, fixed: JobFixed, busy: int) -> float:
    """Input bytes the workers fetch from the store: every block's read box with its halo,
    except where a worker's chunk cache holds the whole region's input (with the halo),
    where it fetches each input chunk at most once: at most `busy` times the region's."""
    halos = costs.total("read_bytes")
    whole = costs.region_read_bytes
    if whole and whole <= fixed.cache_bytes:
        return min(halos, busy * whole)
    return halos


def residence_s(d_cpu: float, d_store: float, workers: int, shared_cpu: bool
                ) -> tuple[float, float]:
    """(seconds at the cores, seconds at the store) of a block in the steady state of
    `workers` workers cycling through their block's work (`d_cpu` seconds: its compute and
    local reads and writes) and its transfer (`d_store` seconds at the store's whole
    bandwidth), the store shared by whoever transfers at once (processor sharing) and the
    cores shared too where the workers are processes of one host: mean value analysis of
    that closed network, exact up to EXACT_MVA_WORKERS, Schweitzer's approximation beyond."""
    if workers <= EXACT_MVA_WORKERS:
        q_cpu = q_store = 0.0
        r_cpu, r_store = d_cpu, d_store
        for n in range(1, workers + 1):
            r_cpu = d_cpu * (1 + q_cpu) if shared_cpu else d_cpu
            r_store = d_store * (1 + q_store)
            x = n / max(r_cpu + r_store, 1e-300)
            q_cpu, q_store = x * r_cpu, x * r_store
        return r_cpu, r_store
    n, q_cpu, q_store = workers, workers / 2, workers / 2
    for _ in range(SCHWEITZER_STEPS):
        r_cpu = d_cpu * (1 + (n - 1) / n * q_cpu) if shared_cpu else d_cpu
        r_store = d_store * (1 + (n - 1) / n * q_store)
        x = n / max(r_cpu + r_store, 1e-300)
        q_cpu, q_store = (q_cpu + x * r_cpu) / 2, (q_store + x * r_store) / 2  # damped
    return r_cpu, r_store


def cluster_seconds(costs: BlockCosts, fixed: JobFixed, cluster: Cluster) -> dict[str, Any]:
    """The whole job on `cluster` (module docstring), as a JSON-ready record."""
    n, workers = costs.blocks, cluster.workers
    busy = max(1, min(workers, n))  # a worker beyond the blocks gets none
    host = cluster.placement == "host"
    read = store_read_bytes(costs, fixed, busy)
    moved = read + costs.total("write_bytes")
    mean_block = costs.total("seconds") / max(1, n)
    bandwidth = cluster.store_bandwidth
    io_s = None if bandwidth is None else moved / bandwidth
    d_store = 0.0 if bandwidth is None else moved / max(1, n) / bandwidth
    r_cpu, r_store = residence_s(mean_block, d_store, busy, host)
    if host:  # the blocks at the shared cores' and store's pace (n / throughput)
        start_s = SCHEDULER_START_S + workers * HOST_WORKER_START_S
        makespan = n * (r_cpu + r_store) / busy + busy * fixed.worker_first_s
        how, peak = "shared cores", workers * fixed.worker_peak_bytes
    else:
        start_s = CLUSTER_START_S
        # the blocks as scheduled (their tail included), each worker's share of the
        # blocks' waits at the store added: first + n / throughput + the tail
        compute_only, how = compute_makespan(costs, busy, fixed.worker_first_s)
        makespan = compute_only + n * r_store / busy
        peak = fixed.worker_peak_bytes
    if host:
        compute_only = costs.total("seconds") + busy * fixed.worker_first_s
    balanced = (costs.total("seconds") + n * r_store + busy * fixed.worker_first_s) / busy
    mean_compute = costs.total("compute_s") / max(1, n)
    store_s = makespan if r_store > r_cpu else 0.0
    startup = fixed.client_s + start_s
    # the workers' block time is their compute, or where their reads and writes (decode,
    # encode at the local zarr rates) take longer, those
    local_io = costs.total("read_s") + costs.total("write_s")
    busy_name = "compute" if costs.total("compute_s") >= local_io else "worker reads/writes"
    parts = {"start-up": startup + cluster.queue_wait_s, busy_name: makespan,
             "store bandwidth": store_s}
    if store_s:
        parts[busy_name] = 0.0
    total = startup + cluster.queue_wait_s + makespan
    held_s = total - fixed.client_s - cluster.queue_wait_s  # nodes held from their start
    nodes = workers if cluster.placement == "nodes" else 1
    return {
        "workers": workers, "placement": cluster.placement, "machine": cluster.machine,
        "cores": cluster.cores, "blocks": n, "busy_workers": busy,
        "per_worker_compute_s": balanced if cluster.placement == "nodes" else makespan,
        "block_s_mean": costs.total("seconds") / max(1, n), "block_s_max": costs.longest_s(),
        "block_compute_s_mean": mean_compute, "block_local_io_s_mean": local_io / max(1, n),
        "worker_first_s": fixed.worker_first_s,
        "compute_makespan_s": compute_only, "makespan_method": how,
        "makespan_s": makespan,  # the blocks with their waits at the store
        "tail_s": max(0.0, makespan - balanced) if not host else 0.0,
        "store_wait_s": r_store,  # a block's mean seconds at the store, queueing included
        "read_bytes": int(read),
        "write_bytes": int(costs.total("write_bytes")),
        "store_bandwidth_bytes_per_s": cluster.store_bandwidth, "store_io_s": io_s,
        "bandwidth_to_stay_compute_bound": moved / max(compute_only, 1e-9),
        "client_s": fixed.client_s, "cluster_start_s": start_s,
        "queue_wait_s": cluster.queue_wait_s, "startup_s": startup,
        "total_s": total, "node_hours": nodes * held_s / 3600,
        "bottleneck": max(parts, key=lambda k: parts[k]),
        "peak_bytes": peak, "memory_bytes": cluster.memory_bytes,
        "memory_fits": not cluster.memory_bytes or peak <= cluster.memory_bytes,
    }


def smallest_workers(costs: BlockCosts, fixed: JobFixed, cluster: Cluster,
                     deadline_s: float) -> dict[str, Any]:
    """The fewest workers (1 up to the block count) whose whole job meets `deadline_s`, by
    binary search (more nodes never lengthen the makespan by more than one block's
    tail; on one host more workers only add start-ups, so there only 1 is tried); the
    record at that N, or at the block count with `deadline_sentence` saying what bounds it."""
    if not deadline_s > 0:
        raise ValueError(f"deadline must be a positive duration, got {deadline_s} s")

    def at(n: int) -> dict[str, Any]:
        return cluster_seconds(costs, fixed, _with_workers(cluster, n))

    top = 1 if cluster.placement == "host" else max(1, costs.blocks)
    best = at(top)
    if best["total_s"] > deadline_s:
        return {**best, "deadline_s": deadline_s, "deadline_workers": None,
                "deadline_sentence": _unreachable(best, deadline_s, cluster)}
    lo, hi = 1, top  # hi meets it
    while lo < hi:
        mid = (lo + hi) // 2
        if at(mid)["total_s"] <= deadline_s:
            hi = mid
        else:
            lo = mid + 1
    return {**at(hi), "deadline_s": deadline_s, "deadline_workers": hi,
            "deadline_sentence": None}


def _with_workers(cluster: Cluster, n: int) -> Cluster:
    return Cluster(n, cluster.placement, cluster.cores, cluster.memory_bytes,
                   cluster.store_bandwidth, cluster.queue_wait_s, cluster.machine)


def _unreachable(best: dict[str, Any], deadline_s: float, cluster: Cluster) -> str:
    """One sentence: no N meets the deadline, and what bounds the job at the most."""
    if cluster.placement == "host":
        return (f"no number of workers on this host meets the deadline of {deadline_s:,.0f} s: "
                f"they share its {cluster.cores} cores, and one worker takes "
                f"{best['total_s']:,.0f} s; give --machine PROFILE to size a cluster of nodes")
    why = {"start-up": "start-up and the queue's wait alone take "
                       f"{best['startup_s'] + best['queue_wait_s']:,.0f} s",
           "store bandwidth": f"the store's {best['store_bandwidth_bytes_per_s']:,.0f} bytes/s "
                              f"move the job's bytes in {best['store_io_s']:,.0f} s",
           "compute": f"its longest block takes {best['block_s_max']:,.0f} s",
           "worker reads/writes": f"its longest block takes {best['block_s_max']:,.0f} s, "
                                  "most of it reading and writing"}[best["bottleneck"]]
    return (f"no number of workers up to the {best['blocks']:,} blocks meets the deadline of "
            f"{deadline_s:,.0f} s: with one worker per block the job takes "
            f"{best['total_s']:,.0f} s, bound by {best['bottleneck']} ({why})")


_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
                   "w": 7 * 86400.0}
_BYTE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
               "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10,
               "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_duration(text: str | float, what: str) -> float:
    """'7d', '36h', '10m', '90s' or plain seconds -> seconds; ValueError naming `what`."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _DURATION_UNITS:
            raise ValueError(f"{what} {text!r} is not a duration like 7d, 36h, 10m, 90s or "
                             "a number of seconds")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    if not 0 <= seconds < 1e12:
        raise ValueError(f"{what} {text!r} must be zero or more seconds, below 10^12")
    return seconds


def parse_bandwidth(text: str | float) -> float:
    """'2GB/s', '500MiB/s', '1e9' (bytes/s) -> bytes/s; ValueError for anything else."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]*)\s*(?:/\s*s)?\s*", str(text))
        if not m or m.group(2).lower() not in _BYTE_UNITS:
            raise ValueError(f"store bandwidth {text!r} is not a rate like 2GB/s, 500MiB/s "
                             "or a number of bytes per second")
        value = float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()]
    if not 0 < value < 1e16:
        raise ValueError(f"store bandwidth {text!r} must be positive bytes per second")
    return value


def bandwidth_text(bytes_per_s: float) -> str:
    """A rate as `--store-bandwidth` takes it (decimal units, 3 significant digits)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.3g}{unit}/s"
    return f"{bytes_per_s:.3g}B/s"
