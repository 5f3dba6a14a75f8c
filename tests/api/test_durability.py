"""Cancel, SIGKILL and SIGTERM mid-job: finished blocks are kept and the result is exact."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr
from support.naive import close, naive_dense, naive_fov
from support.server_util import TINY_INPUT, TINY_LAYERS, Server, children_of, pid_alive, wait_job

BIG = "big.zarr"
BIG_SHAPE = (2, 20, 20, 32)  # 400 blocks of (2, 4, 4): long enough to interrupt
JOB = {"network": "tiny", "input": BIG, "chunks": [2, 4, 4], "block": [2, 4, 4]}


@pytest.fixture(scope="module")
def big(site: dict) -> np.ndarray:
    from support.server_util import write_volume

    return write_volume(site["root"] / BIG, BIG_SHAPE, seed=7, chunks=(2, 8, 8, 8))


@pytest.fixture(scope="module")
def uninterrupted(server, site, big) -> np.ndarray:
    """The same job run once without interruption, checked on a box against brute force."""
    with server.client() as client:
        r = client.post("/v1/jobs", json={**JOB, "output": "ref/big.zarr"})
        assert r.status_code == 201, r.text
        wait_job(client, r.json()["id"], ("succeeded",))
    out = zarr.open_array(str(site["root"] / "ref/big.zarr"), mode="r")[...]
    # brute force on an interior box that crosses block borders (no border handling needed)
    fov = naive_fov(TINY_LAYERS)
    lo = np.array([5, 6, 3])
    size = np.array([6, 5, 6])
    start = lo - (np.array(fov) - 1) // 2
    window = big[
        :,
        start[0] : start[0] + size[0] + fov[0] - 1,
        start[1] : start[1] + size[1] + fov[1] - 1,
        start[2] : start[2] + size[2] + fov[2] - 1,
    ]
    window = window * np.float32(TINY_INPUT["scale"]) + np.float32(TINY_INPUT["shift"])
    ref = naive_dense(TINY_LAYERS, site["params"], window)
    got = out[:, lo[0] : lo[0] + size[0], lo[1] : lo[1] + size[1], lo[2] : lo[2] + size[2]]
    assert close(got, ref), float(np.max(np.abs(got - ref)))
    return out


def read(site: dict, path: str) -> np.ndarray:
    return zarr.open_array(str(site["root"] / path), mode="r")[...]


def test_cancel_mid_job_keeps_blocks_and_resubmit_resumes(server, site, uninterrupted) -> None:
    with server.client() as client:
        job_id = client.post("/v1/jobs", json={**JOB, "output": "cancel/big.zarr"}).json()["id"]
        wait_job(client, job_id, ("succeeded",), min_done=3)
        r = client.post(f"/v1/jobs/{job_id}/cancel")
        assert r.status_code == 200 and r.json()["cancel_requested"] is True
        job = wait_job(client, job_id, ("cancelled",))
        done, total = job["progress"]["done"], job["progress"]["total"]
        assert 3 <= done < total  # stopped within a block of the request, not at the end
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200  # idempotent
        # the same job again resumes from the finished blocks (no overwrite needed)
        again = client.post("/v1/jobs", json={**JOB, "output": "cancel/big.zarr"})
        assert again.status_code == 201, again.text
        final = wait_job(client, again.json()["id"], ("succeeded",))
    assert final["report"]["blocks_computed"] == total - done
    assert close(read(site, "cancel/big.zarr"), uninterrupted)


def test_cancel_queued_job_never_runs(server, site) -> None:
    with server.client() as client:
        first = client.post("/v1/jobs", json={**JOB, "output": "q/first.zarr"}).json()["id"]
        second = client.post("/v1/jobs", json={**JOB, "output": "q/second.zarr"}).json()["id"]
        r = client.post(f"/v1/jobs/{second}/cancel")
        assert r.json()["status"] == "cancelled"  # still queued behind `first`: cancelled now
        client.post(f"/v1/jobs/{first}/cancel")
        wait_job(client, first, ("cancelled", "succeeded"))
        assert client.get(f"/v1/jobs/{second}").json()["attempts"] == 0
    assert not (site["root"] / "q/second.zarr").exists()


def test_sigkill_mid_job_then_restart_finishes_exactly(site, big, uninterrupted, tmp_path) -> None:
    server = Server(site["root"], site["models"], tmp_path / "jobs.sqlite").start()
    try:
        with server.client() as client:
            job_id = client.post("/v1/jobs", json={**JOB, "output": "kill/big.zarr"}).json()["id"]
            before = wait_job(client, job_id, ("succeeded",), min_done=5)
            assert before["status"] == "running"
        workers = children_of(server.proc.pid)
        assert workers, "the server runs its jobs in a child process"
        server.kill()
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(p) for p in workers), "orphaned worker kept running"
        server.start()  # same database
        with server.client() as client:
            resumed = client.get(f"/v1/jobs/{job_id}").json()
            assert resumed["status"] in ("running", "succeeded")
            final = wait_job(client, job_id, ("succeeded",))
    finally:
        server.stop()
    assert final["attempts"] == 2
    assert final["report"]["blocks_computed"] < final["progress"]["total"]
    assert close(read(site, "kill/big.zarr"), uninterrupted)
    assert '"event": "job.resumed"' in server.log()


def test_sigterm_requeues_running_job_and_restart_finishes(site, big, uninterrupted, tmp_path):
    server = Server(site["root"], site["models"], tmp_path / "jobs.sqlite").start()
    try:
        with server.client() as client:
            job_id = client.post("/v1/jobs", json={**JOB, "output": "term/big.zarr"}).json()["id"]
            wait_job(client, job_id, ("succeeded",), min_done=3)
        server.stop()  # graceful: the worker stops after its block, the job goes back to queued
        server.start()
        with server.client() as client:
            final = wait_job(client, job_id, ("succeeded",))
    finally:
        server.stop()
    assert '"event": "job.requeued"' in server.log()
    assert final["attempts"] == 2
    assert final["report"]["blocks_computed"] < final["progress"]["total"]
    assert close(read(site, "term/big.zarr"), uninterrupted)
