"""The cluster model's arithmetic (planner/cluster.py, planner/block_costs.py) on given
block costs: list scheduling against an explicit step-by-step simulation, the bottleneck,
the deadline search against a linear scan, and the block classes against the one-machine
prediction (jobtime.job_seconds) they come from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from znni.model.network import network_shapes_only
from znni.planner.block_costs import BlockClass, BlockCosts, block_costs, uniform_costs
from znni.planner.cluster import (
    CLUSTER_START_S,
    HOST_WORKER_START_S,
    Cluster,
    JobFixed,
    cluster_seconds,
    compute_makespan,
    makespan_s,
    parse_bandwidth,
    parse_duration,
    residence_s,
    smallest_workers,
)

NETS = Path(__file__).resolve().parents[2] / "benchmarks" / "networks"
FIXED = JobFixed(client_s=1.0, worker_first_s=2.0, worker_peak_bytes=2**30)


def stepped_makespan(durations: list[int], workers: int, first: int) -> int:
    """An independent reference: a clock ticking one unit at a time; at every tick each
    idle worker (lowest index first) takes the next block in order."""
    left = [first] * workers  # time units each worker is still busy
    queue, t = list(durations), 0
    while True:
        for w in range(workers):
            if left[w] == 0 and queue:
                left[w] = queue.pop(0)
        if not queue and not any(left):
            return t
        t += 1
        left = [max(0, v - 1) for v in left]


@pytest.mark.parametrize("seed", range(12))
def test_list_scheduling_matches_a_step_simulation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    durations = [int(v) for v in rng.integers(1, 9, size=int(rng.integers(1, 14)))]
    for workers in range(1, 6):
        first = int(rng.integers(0, 3))
        got = makespan_s(durations, workers, first)
        assert got == stepped_makespan(durations, min(workers, len(durations)), first)


def test_the_tail_of_the_last_blocks() -> None:
    """Five blocks of 10 s on 4 workers: the fifth runs alone (20 s, not 12.5)."""
    costs = uniform_costs(5, 10.0, 0.0, 0.0, 100, 100)
    assert compute_makespan(costs, 4, 0.0) == (20.0, "uniform")
    record = cluster_seconds(costs, JobFixed(0.0, 0.0, 1), Cluster(4))
    assert record["tail_s"] == pytest.approx(20.0 - 50.0 / 4)


def _two_classes(n_big: int, n_small: int, listed: bool) -> BlockCosts:
    big = BlockClass(n_big, 7.0, 0.5, 0.5, 10**6, 4 * 10**6)
    small = BlockClass(n_small, 2.0, 0.25, 0.25, 5 * 10**5, 10**6)
    order = tuple(i % 3 == 2 for i in range(n_big + n_small))  # every third block small
    return BlockCosts((big, small), tuple(int(v) for v in order) if listed else None)


def test_graham_bound_where_the_order_is_not_listed() -> None:
    """A layout too large to list gets Graham's bound: never below the simulation, at most
    one longest block above it."""
    listed, bare = _two_classes(20, 10, True), _two_classes(20, 10, False)
    for workers in (1, 3, 7):
        simulated, how = compute_makespan(listed, workers, 1.0)
        bound, how2 = compute_makespan(bare, workers, 1.0)
        assert (how, how2) == ("simulated", "graham bound")
        assert simulated <= bound + 1e-9 <= simulated + listed.longest_s() + 1e-9


def test_whole_job_and_bottleneck_on_nodes() -> None:
    costs = _two_classes(20, 10, True)
    moved = costs.total("read_bytes") + costs.total("write_bytes")
    free = cluster_seconds(costs, FIXED, Cluster(4, store_bandwidth=None, queue_wait_s=30))
    makespan, _ = compute_makespan(costs, 4, FIXED.worker_first_s)
    start = FIXED.client_s + CLUSTER_START_S
    assert free["total_s"] == pytest.approx(start + 30 + makespan)
    assert free["bottleneck"] == "compute" and free["store_io_s"] is None
    assert free["node_hours"] == pytest.approx(4 * (free["total_s"] - 1.0 - 30) / 3600)
    # a slow store: every block waits its share of the store (residence_s), and the job
    # takes at least its bytes over the bandwidth
    slow = cluster_seconds(costs, FIXED, Cluster(4, store_bandwidth=moved / 100))
    r_cpu, r_store = residence_s(costs.total("seconds") / 30, 100 / 30, 4, False)
    assert slow["store_io_s"] == pytest.approx(100.0)
    assert slow["total_s"] == pytest.approx(start + makespan + 30 * r_store / 4)
    assert start + 100 < slow["total_s"] < start + 100 + 2 * costs.longest_s()
    assert slow["bottleneck"] == "store bandwidth" and r_store > r_cpu
    assert free["bandwidth_to_stay_compute_bound"] == pytest.approx(moved / makespan)
    # tiny blocks behind a day's queue: start-up
    tiny = uniform_costs(3, 0.1, 0.0, 0.0, 1, 1)
    assert cluster_seconds(tiny, FIXED, Cluster(2, queue_wait_s=86400))["bottleneck"] == \
        "start-up"


def test_workers_on_one_host_share_its_cores() -> None:
    """N processes on one machine: the blocks take their sum whatever N, each worker adds
    its start and first pass, and memory is N peaks."""
    costs = _two_classes(20, 10, True)
    one = Cluster(1, "host", cores=2, memory_bytes=3 * 2**30)
    four = Cluster(4, "host", cores=2, memory_bytes=3 * 2**30)
    a, b = cluster_seconds(costs, FIXED, one), cluster_seconds(costs, FIXED, four)
    assert a["compute_makespan_s"] == pytest.approx(costs.total("seconds") + 2.0)
    assert b["compute_makespan_s"] == pytest.approx(costs.total("seconds") + 4 * 2.0)
    assert b["total_s"] - a["total_s"] == pytest.approx(3 * (HOST_WORKER_START_S + 2.0))
    assert (a["memory_fits"], b["memory_fits"]) == (True, False)
    assert b["peak_bytes"] == 4 * 2**30 and b["node_hours"] == pytest.approx(
        (b["total_s"] - 1.0) / 3600)


def test_deadline_gives_the_fewest_workers_a_linear_scan_finds() -> None:
    """Alike blocks and an unbounded store: the whole job never lengthens with more
    workers, and the search gives what a scan from 1 up gives. With mixed blocks and a
    store, the found N meets the deadline and N - 1 does not."""
    costs = uniform_costs(60, 7.0, 0.5, 0.5, 10**6, 4 * 10**6)
    totals = {n: cluster_seconds(costs, FIXED, Cluster(n))["total_s"] for n in range(1, 61)}
    assert all(totals[n + 1] <= totals[n] for n in range(1, 60))
    for deadline in (totals[1] + 1, totals[3], totals[7] + 0.01, totals[60]):
        want = min(n for n, t in totals.items() if t <= deadline)
        found = smallest_workers(costs, FIXED, Cluster(1), deadline)
        assert found["deadline_workers"] == want and found["workers"] == want
    mixed, cluster = _two_classes(40, 20, True), Cluster(1, store_bandwidth=4e6)
    for deadline in (200.0, 120.0, 90.0):
        n = smallest_workers(mixed, FIXED, cluster, deadline)["deadline_workers"]
        assert n is not None
        at = [cluster_seconds(mixed, FIXED, Cluster(k, store_bandwidth=4e6))["total_s"]
              for k in (n - 1, n)]
        assert at[1] <= deadline and (n == 1 or at[0] > deadline)


def test_store_queue_by_hand() -> None:
    """residence_s against mean value analysis worked by hand (a worker computing Z s a
    block, the store D s a block): one worker never queues; two: the second finds the
    first at the store with probability D / (Z + D); many: the store's throughput, 1 / D,
    bounds them; Schweitzer's approximation beyond EXACT_MVA_WORKERS stays close."""
    from znni.planner.cluster import EXACT_MVA_WORKERS

    z, d = 3.0, 1.0
    assert residence_s(z, d, 1, False) == (3.0, 1.0)
    q1 = d / (z + d)
    assert residence_s(z, d, 2, False) == pytest.approx((3.0, d * (1 + q1)))
    r_cpu, r_store = residence_s(z, d, 400, False)
    assert 400 / (r_cpu + r_store) == pytest.approx(1 / d, rel=1e-6)
    big = EXACT_MVA_WORKERS + 1
    exact = sum(residence_s(z, d, EXACT_MVA_WORKERS, False))
    approx = sum(residence_s(z, d, big, False))
    assert approx == pytest.approx(exact * big / EXACT_MVA_WORKERS, rel=0.02)
    # processes of one host queue at its cores too: N of them, each D at the cores
    assert sum(residence_s(2.0, 0.0, 3, True)) == pytest.approx(6.0)


def test_unreachable_deadline_is_one_sentence_naming_the_bound() -> None:
    costs = _two_classes(8, 4, True)
    moved = costs.total("read_bytes") + costs.total("write_bytes")
    found = smallest_workers(costs, FIXED, Cluster(1, store_bandwidth=moved / 500), 100.0)
    sentence = found["deadline_sentence"]
    assert found["deadline_workers"] is None and found["workers"] == costs.blocks
    assert sentence.startswith("no number of workers up to the 12 blocks meets the deadline")
    assert "store bandwidth" in sentence and sentence.count(". ") == 0
    host = smallest_workers(costs, FIXED, Cluster(1, "host", cores=2), 1.0)
    assert "share its 2 cores" in host["deadline_sentence"]
    with pytest.raises(ValueError, match="positive duration"):
        smallest_workers(costs, FIXED, Cluster(1), 0.0)


@pytest.mark.parametrize("text, seconds", [("7d", 7 * 86400), ("36h", 36 * 3600),
                                            ("10m", 600), ("90s", 90), ("3600", 3600),
                                            ("1.5h", 5400), (120, 120)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--deadline") == seconds


@pytest.mark.parametrize("text, rate", [("2GB/s", 2e9), ("500MiB/s", 500 * 2**20),
                                        ("1e9", 1e9), ("20 MB/s", 2e7), (3e8, 3e8)])
def test_bandwidths(text: str, rate: float) -> None:
    assert parse_bandwidth(text) == rate


@pytest.mark.parametrize("text", ["fast", "2GB/h", "-1GB/s", "0", ""])
def test_bad_bandwidths_name_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="store bandwidth"):
        parse_bandwidth(text)
    with pytest.raises(ValueError, match="--queue-wait"):
        parse_duration(text + "x", "--queue-wait")


def _n537_w24():  # type: ignore[no-untyped-def]
    raw = json.loads((NETS / "n537.json").read_text())
    for layer in [x for x in raw["layers"] if x["kind"] == "conv"][:-1]:
        layer["out_channels"] = 24
    return network_shapes_only(raw, "n537-w24")


@pytest.mark.parametrize("skipped", [frozenset(), frozenset({0, 5, 7})])
def test_block_classes_add_up_to_the_one_machine_prediction(skipped: frozenset) -> None:
    """The classes price each block as jobtime.job_seconds does: their compute sums to its
    patches' seconds and their reads and writes to its I/O."""
    from znni.planner.jobtime import job_seconds
    from znni.planner.plan import LayerPlan, Plan

    net = _n537_w24()
    layers = (LayerPlan(0, "conv", "cpu", "direct", 5.0, 0),)
    plan = Plan("n537-w24", "m", "cpu", (218,) * 3, (56,) * 3, 2, None,  # type: ignore[arg-type]
                ("direct",) * len(net.ops), layers, 2**30, 20.0, 1.0)
    edges = ((0, 112, 224, 250), (0, 112, 200), (0, 64, 128, 150))  # 18 blocks, 3 shapes
    job = job_seconds(plan, net, edges, in_bytes=1, out_dtype="float32", known_machine=False,
                      skipped=skipped)
    costs = block_costs(plan, net, edges, in_bytes=1, out_dtype="float32", skipped=skipped)
    assert costs.blocks == job.blocks == 18 and costs.order is not None
    assert len(costs.classes) == (10 if skipped else 8)  # two shapes gain a skipped class
    assert costs.total("compute_s") == pytest.approx(job.patches_s)
    assert costs.total("read_s") + costs.total("write_s") == pytest.approx(job.io_total_s)
    assert costs.total("write_bytes") == 250 * 200 * 150 * net.out_channels * 4
    assert [costs.classes[i].compute_s == 0 for i in costs.order].count(True) == len(skipped)


def test_reads_through_a_chunk_cache_that_holds_the_input() -> None:
    """A worker whose chunk cache holds the region's whole input (with its halo) fetches
    each input chunk once: at most N times the region; else every block's halo box."""
    from dataclasses import replace

    from znni.planner.cluster import store_read_bytes

    costs = replace(_two_classes(8, 4, True), region_read_bytes=3 * 10**6)
    halos = costs.total("read_bytes")  # 10 MB of halo boxes
    cached = JobFixed(0.0, 0.0, 1, cache_bytes=2**30)
    assert store_read_bytes(costs, cached, 1) == 3e6
    assert store_read_bytes(costs, cached, 2) == 6e6
    assert store_read_bytes(costs, cached, 4) == halos
    assert store_read_bytes(costs, JobFixed(0.0, 0.0, 1, cache_bytes=10**6), 1) == halos
    record = cluster_seconds(costs, cached, Cluster(2, store_bandwidth=1e6))
    assert record["read_bytes"] == 6e6
    assert record["store_io_s"] == pytest.approx((6e6 + costs.total("write_bytes")) / 1e6)
