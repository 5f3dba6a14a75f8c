"""Job workers compute at a lower CPU priority than the API process that answers requests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.server_util import Server, children_of, wait_job

from znni.cli import main
from znni.jobs.settings import Settings


def worker_pids(server_pid: int) -> list[int]:
    """The server's spawned worker processes (not multiprocessing's resource tracker)."""
    pids = []
    for pid in children_of(server_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            pids.append(pid)
    return pids


def thread_nices(pid: int) -> dict[int, int]:
    """Niceness of every thread of `pid` (field 19 of /proc/PID/task/TID/stat)."""
    out = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(stat.parent.name)] = int(fields[16])  # fields[0] is field 3 (state)
    return out


def test_workers_run_at_the_configured_niceness(site, tmp_path) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    expected = max(own, 7)  # raised to 7, never lowered below what it inherited
    server = Server(
        site["root"], site["models"], tmp_path / "jobs.sqlite", extra=["--worker-nice", "7"]
    ).start()
    try:
        with server.client() as client:
            job = client.post(
                "/v1/jobs",
                json={"network": "tiny", "input": "small.zarr", "output": "nice/out.zarr"},
            ).json()
            wait_job(client, job["id"], ("succeeded",))  # the engine's threads have started
        assert server.proc is not None
        workers = worker_pids(server.proc.pid)
        assert len(workers) == 1, workers
        assert os.getpriority(os.PRIO_PROCESS, workers[0]) == expected
        nices = thread_nices(workers[0])
        assert len(nices) >= 2 and set(nices.values()) == {expected}, nices  # every thread
        # the API process keeps its priority: it is the one that must preempt compute
        assert set(thread_nices(server.proc.pid).values()) == {own}
    finally:
        server.stop()
    assert "nice 7" in server.log() or own > 7


def test_worker_nice_default_and_bounds(tmp_path, capsys) -> None:
    assert Settings().worker_nice == 10
    code = main(["serve", "--worker-nice", "20", "--data-root", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "worker_nice" in err and "19" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["-1", "20"])
def test_worker_nice_environment_is_validated(monkeypatch, value) -> None:
    monkeypatch.setenv("ZNNI_WORKER_NICE", value)
    with pytest.raises(ValueError, match="worker_nice"):
        Settings()
