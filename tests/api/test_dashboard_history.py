"""The throughput history behind the dashboard's chart: bounded per job, spread over the job's
life, its "now" rate, and both a fresh and an existing (older) job database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from support.server_util import new_job

from znni.api.machine import parse_gpu_line
from znni.jobs import store as store_module
from znni.jobs import throughput
from znni.jobs.store import JobStore


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.row_factory = sqlite3.Row
    return con


def _events(con: sqlite3.Connection, job_id: int, n: int, *, t0: float = 1000.0,
            dt: float = 0.5, voxels: int = 1000, attempt: int = 1, start_at: int = 0) -> None:
    """`n` progress events `dt` apart, `voxels` each: a steady voxels/dt voxels/s."""
    for i in range(start_at, start_at + n):
        t = t0 + (i + 1) * dt
        done = (i + 1) * voxels
        elapsed = (i + 1 - start_at) * dt
        throughput.record(con, job_id, attempt, t, blocks_done=i + 1, voxels_done=done,
                          elapsed_s=elapsed, average=(i + 1 - start_at) * voxels / elapsed)


def test_history_is_bounded_and_keeps_first_and_latest(tmp_path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = new_job(store, "/r/out.zarr")
    other = new_job(store, "/r/other.zarr")
    con = _connect(store.path)
    _events(con, job, 5000)
    _events(con, other, 3)
    points = store.throughput(job)
    assert len(points) <= throughput.MAX_POINTS
    assert len(points) >= throughput.MAX_POINTS // 4  # thinned, not emptied
    assert points[0]["blocks_done"] == 1
    assert points[-1]["blocks_done"] == 5000 and points[-1]["voxels_done"] == 5_000_000
    times = [p["t"] for p in points]
    assert times == sorted(times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= 0.1 * (times[-1] - times[0])  # spread over the whole life
    assert all(abs(p["rate"] - 2000.0) < 1.0 for p in points)  # steady: now == average
    assert len(store.throughput(other)) == 3
    rows = con.execute("SELECT COUNT(*) FROM job_throughput").fetchone()[0]
    assert rows == len(points) + 3


def test_rate_now_follows_a_slowdown_the_average_hides(tmp_path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = new_job(store, "/r/out.zarr")
    con = _connect(store.path)
    _events(con, job, 200, dt=0.5)  # 2000 vox/s for 100 s
    t0 = 1000.0 + 200 * 0.5
    for i in range(1, 31):  # then 250 vox/s for 120 s
        t = t0 + 4.0 * i
        throughput.record(con, job, 1, t, blocks_done=200 + i, voxels_done=200_000 + 1000 * i,
                          elapsed_s=t - 1000.0, average=(200_000 + 1000 * i) / (t - 1000.0))
    last = store.throughput(job)[-1]
    assert 240 < last["rate"] < 300
    assert last["average"] > 900  # the run's average still remembers the fast part


def test_a_resumed_attempt_starts_its_rate_again(tmp_path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = new_job(store, "/r/out.zarr")
    con = _connect(store.path)
    _events(con, job, 10)
    _events(con, job, 10, t0=5000.0, attempt=2, start_at=10, voxels=4000)
    points = store.throughput(job)
    assert [p["attempt"] for p in points][-1] == 2
    second = [p for p in points if p["attempt"] == 2]
    assert all(abs(p["rate"] - 8000.0) < 1.0 for p in second)  # not dragged by the gap


def test_existing_database_gains_the_table_and_old_jobs_have_a_history(tmp_path) -> None:
    """A job database written before the history table existed: opening it adds the table;
    a job that ran then shows its progress mirror (job_blocks), thinned to the bound."""
    path = tmp_path / "old.sqlite"
    con = _connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(store_module.SCHEMA)  # the tables of the older znni, no job_throughput
    con.execute(
        "INSERT INTO jobs (status, network, network_digest, input_path, output_path, parameters,"
        " created_at) VALUES ('succeeded', 'tiny', 'd', '/r/in', '/r/old.zarr', '{}', 1.0)"
    )
    for i in range(1000):
        con.execute(
            "INSERT INTO job_blocks (job_id, attempt, blocks_done, voxels_done, elapsed_s, at)"
            " VALUES (1, 1, ?, ?, ?, ?)",
            (i + 1, (i + 1) * 100, (i + 1) * 0.1, 2000.0 + (i + 1) * 0.1),
        )
    con.close()
    store = JobStore(path)
    points = store.throughput(1)
    assert len(points) <= throughput.MAX_POINTS
    assert points[0]["blocks_done"] == 1 and points[-1]["blocks_done"] == 1000
    assert all(abs(p["rate"] - 1000.0) < 1.0 for p in points)
    job = new_job(store, "/r/new.zarr")  # new progress lands in the new table
    store.record_progress(job, 1, blocks_done=1, blocks_total=4, voxels_done=10,
                          voxels_total=40, elapsed_s=0.5, voxels_per_second=20.0)
    assert [p["voxels_done"] for p in store.throughput(job)] == [10]
    assert JobStore(path).throughput(1) == points  # opened again: nothing changes


def test_fresh_database_history_through_record_progress(tmp_path) -> None:
    store = JobStore(tmp_path / "fresh.sqlite")
    job = new_job(store, "/r/out.zarr")
    assert store.throughput(job) == []
    for i in range(1, 6):
        store.record_progress(job, 1, blocks_done=i, blocks_total=5, voxels_done=100 * i,
                              voxels_total=500, elapsed_s=0.1 * i, voxels_per_second=1000.0)
    points = store.throughput(job)
    assert 2 <= len(points) <= 5 and points[-1]["blocks_done"] == 5
    assert points[-1]["average"] == 1000.0


def test_nvidia_smi_lines() -> None:
    assert parse_gpu_line("0, NVIDIA H100 80GB HBM3, 81559, 1024, 37") == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * 2**20,
        "memory_used_bytes": 1024 * 2**20, "utilization_percent": 37.0,
    }
    assert parse_gpu_line("1, Some GPU, 16000, 3, [N/A]")["utilization_percent"] is None
    assert parse_gpu_line("garbage") is None
    assert parse_gpu_line("x, name, a, b, c") is None
