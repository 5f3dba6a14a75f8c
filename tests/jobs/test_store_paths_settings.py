"""The job service's parts that need no running server: paths, the SQLite store, settings."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from support.server_util import claim_all, commit_then_die, new_job

from znni.jobs.paths import confine, relative_to_root
from znni.jobs.settings import Settings
from znni.jobs.store import JobStore, OutputBusyError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "a.zarr").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "root" / "out_link")
    os.symlink(tmp_path / "root" / "a.zarr", tmp_path / "root" / "in_link")
    return (tmp_path / "root").resolve()


@pytest.mark.parametrize(
    ("path", "word"),
    [
        ("", "non-empty"),
        ("/abs/x", "absolute"),
        ("~/x", "absolute"),
        ("a/../../x", "'..'"),
        ("..", "'..'"),
        ("out_link/x.zarr", "outside"),
        ("out_link", "outside"),
        (".", "data root"),
        ("x\x00y", "NUL"),
        ("C:/x", "absolute"),
    ],
)
def test_confine_refuses(root: Path, path: str, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        confine(root, path, "input")


def test_confine_accepts_paths_inside_including_inner_symlinks(root: Path) -> None:
    assert confine(root, "a.zarr", "input", must_exist=True) == root / "a.zarr"
    assert confine(root, "in_link", "input", must_exist=True) == root / "a.zarr"
    assert confine(root, "new/deeper/out.zarr", "output") == root / "new/deeper/out.zarr"
    with pytest.raises(ValueError, match="does not exist"):
        confine(root, "b.zarr", "input", must_exist=True)
    assert relative_to_root(root, f"input {root}/a.zarr is bad") == "input a.zarr is bad"


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZNNI_TOKEN", "abc")
    monkeypatch.setenv("ZNNI_PORT", "9001")
    s = Settings(data_root=tmp_path, models=tmp_path)
    assert (s.token, s.port, s.host) == ("abc", 9001, "127.0.0.1")
    assert Settings(token="flag", models=tmp_path).token == "flag"  # a flag beats the variable
    monkeypatch.setenv("ZNNI_TOKEN", "  ")
    assert Settings().token is None
    with pytest.raises(ValueError, match="data root"):
        Settings(data_root=tmp_path / "missing", models=tmp_path).resolved()


def test_store_lifecycle(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    a = new_job(store, "/r/a")
    b = new_job(store, "/r/b")
    with pytest.raises(OutputBusyError, match=f"job {a}"):
        new_job(store, "/r/a")
    claimed = store.claim(slot=0)
    assert claimed is not None and claimed.id == a and claimed.status == "running"
    assert claimed.attempts == 1
    assert not store.record_progress(
        a,
        1,
        blocks_done=1,
        blocks_total=4,
        voxels_done=10,
        voxels_total=40,
        elapsed_s=0.5,
        voxels_per_second=20.0,
    )
    assert store.request_cancel(a).status == "running"  # type: ignore[union-attr]
    assert store.record_progress(
        a,
        1,
        blocks_done=2,
        blocks_total=4,
        voxels_done=20,
        voxels_total=40,
        elapsed_s=1.0,
        voxels_per_second=20.0,
    )
    store.finish(a, "cancelled")
    assert store.request_cancel(b).status == "cancelled"  # type: ignore[union-attr]
    assert store.claim(slot=0) is None  # nothing queued
    assert store.counts_by_status() == {"cancelled": 2}
    assert [e["blocks_done"] for e in store.ledger(a)] == [1, 2]
    assert store.voxel_totals() == (20, 0.0)
    jobs, total = store.list(status="cancelled", limit=1)
    assert total == 2 and [j.id for j in jobs] == [a]


def test_store_resumes_the_slots_running_job_first(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    a, b = new_job(store, "/r/a"), new_job(store, "/r/b")
    assert store.claim(slot=1).id == a  # type: ignore[union-attr]
    # the worker of slot 1 died; its successor takes the interrupted job before queued ones
    again = store.claim(slot=1)
    assert again is not None and again.id == a and again.attempts == 2
    assert store.claim(slot=0).id == b  # type: ignore[union-attr]


def test_store_transaction_rolls_back_entirely(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    a = new_job(store, "/r/a")
    with pytest.raises(sqlite3.IntegrityError), store._write() as con:
        con.execute("UPDATE jobs SET blocks_done = 7 WHERE id = ?", (a,))
        con.execute("UPDATE jobs SET status = 'bogus' WHERE id = ?", (a,))  # CHECK fails
    assert store.get(a).blocks_done == 0  # type: ignore[union-attr]


def test_concurrent_claims_from_processes_never_share_a_job(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite"
    store = JobStore(db)
    ids = [new_job(store, f"/r/{i}") for i in range(60)]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=claim_all, args=(str(db), s, queue)) for s in range(3)]
    for p in procs:
        p.start()
    claimed = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    flat = [i for got in claimed for i in got]
    assert sorted(flat) == ids  # every job exactly once
    assert store.counts_by_status() == {"succeeded": 60}


def test_jobs_of_slots_beyond_the_worker_count_are_requeued(tmp_path: Path) -> None:
    from znni.jobs.worker import WorkerPool

    store = JobStore(tmp_path / "jobs.sqlite")
    a, b = new_job(store, "/r/a"), new_job(store, "/r/b")
    store.claim(slot=0)
    store.claim(slot=3)  # a server that ran 4 workers died; the new one runs 1
    pool = WorkerPool(Settings(db=tmp_path / "jobs.sqlite", workers=1))
    pool._recover_orphaned_slots()
    assert store.get(a).status == "running"  # type: ignore[union-attr] - slot 0 resumes it
    job_b = store.get(b)
    assert job_b is not None and job_b.status == "queued" and job_b.worker_slot is None


def test_store_threads_share_one_write_lock_per_file_and_every_commit_lands(
    tmp_path: Path,
) -> None:
    (tmp_path / "db").mkdir()
    os.symlink(tmp_path / "db", tmp_path / "link")
    stores = [JobStore(tmp_path / "db" / "jobs.sqlite"), JobStore(tmp_path / "link/jobs.sqlite")]
    assert stores[0]._write_lock is stores[1]._write_lock  # one file, one lock
    assert JobStore(tmp_path / "other.sqlite")._write_lock is not stores[0]._write_lock
    ids: list[int] = []
    modes: list[int] = []

    def submit(t: int) -> None:
        store = stores[t % 2]
        modes.append(store._connection().execute("PRAGMA synchronous").fetchone()[0])
        for i in range(25):
            ids.append(new_job(store, f"/r/{t}-{i}"))

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert modes == [2] * 4  # synchronous=FULL: a commit is on disk before it returns
    assert len(set(ids)) == 100
    with sqlite3.connect(tmp_path / "db" / "jobs.sqlite") as con:
        assert sorted(r[0] for r in con.execute("SELECT id FROM jobs")) == sorted(ids)


def test_store_killed_mid_transaction_keeps_every_commit_and_nothing_else(
    tmp_path: Path,
) -> None:
    db = tmp_path / "jobs.sqlite"
    JobStore(db)
    proc = multiprocessing.get_context("spawn").Process(target=commit_then_die, args=(str(db), 7))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -9
    store = JobStore(db)  # a new connection: it sees only what was committed
    assert store.counts_by_status() == {"queued": 7}
    assert [j.output_path for j in store.list()[0]] == [f"/r/{i}" for i in range(7)]
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
