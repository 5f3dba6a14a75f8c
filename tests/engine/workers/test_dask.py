"""Blocks as tasks on a real Dask LocalCluster: same output as the local run, survives a kill."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.engine.job import SegmentJob
from znni.engine.segment import segment
from znni.engine.workers.base import TRACE_ENV
from znni.model.network import load_network
from znni.primitives.backends import make_backend


@pytest.fixture()
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SegmentJob, np.ndarray]:
    monkeypatch.setenv("ZNNI_BACKEND", "reference")
    rng = np.random.default_rng(21)
    layers, params = small_network(rng)
    net = load_network(write_network(tmp_path, layers, params, scale=1 / 255))
    vol = rng.integers(0, 256, size=(21, 26, 29)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 2, (7, 7, 7))
    local = SegmentJob(network=net, input_path=inp, output_path=str(tmp_path / "local.zarr"),
                       chunks=(7, 9, 10), block=(7, 9, 10))
    report = segment(local, backend=make_backend("reference"))
    assert report.blocks_total >= 8
    ref = dense_volume(layers, params, vol[None], "reflect", 1 / 255)
    out = zarr.open_array(str(local.output_path))[...]
    assert close(out, ref)
    return local, out


@pytest.mark.slow
def test_local_cluster_of_two_workers_equals_local_run(job, tmp_path: Path) -> None:
    local, expected = job
    out = str(tmp_path / "dask.zarr")
    report = segment(SegmentJob(**{**local.__dict__, "output_path": out, "scheduler": "local:2"}))
    assert report.blocks_computed == report.blocks_total
    assert np.array_equal(zarr.open_array(out)[...], expected)


@pytest.mark.slow
def test_worker_killed_mid_run_still_completes(job, tmp_path: Path, monkeypatch) -> None:
    from distributed import LocalCluster

    local, expected = job
    trace = tmp_path / "trace"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    out = str(tmp_path / "dask.zarr")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        nanny = next(iter(cluster.workers.values()))
        victim, pid = nanny.worker_address, nanny.process.pid
        killed: list[str] = []

        def kill_one(ev) -> None:
            # kill a worker process while the scheduler has a block running on it
            if killed or ev.blocks_done < 2:
                return
            state = cluster.scheduler.workers.get(victim)
            running = [ts.key for ts in state.processing] if state is not None else []
            if running:
                killed.extend(running)
                os.kill(pid, signal.SIGKILL)

        job2 = SegmentJob(**{**local.__dict__, "output_path": out,
                             "scheduler": cluster.scheduler_address})
        report = segment(job2, progress=kill_one)
    assert killed, "no block was running on the worker to kill"
    assert report.blocks_computed == report.blocks_total
    computed = {key for _, key in (line.split() for line in trace.read_text().splitlines())}
    assert len(computed) == report.blocks_total  # every block, the killed one included
    assert np.array_equal(zarr.open_array(out)[...], expected)
