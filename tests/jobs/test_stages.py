"""A job's stages in the job store (jobs/stages.py): progress events move them along, the
global step shows as running between the block stages, success leaves them all done, and a
database made before the stages gets their columns on opening."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from znni.jobs import stages
from znni.jobs.store import SCHEMA, JobStore


def _event(store: JobStore, job_id: int, stage: str, done: int, total: int) -> None:
    store.record_progress(job_id, 1, blocks_done=done, blocks_total=total,
                          voxels_done=10 * done, voxels_total=10 * total, elapsed_s=1.0,
                          voxels_per_second=10.0, stage=stage)


def _statuses(store: JobStore, job_id: int) -> list[str]:
    record = store.get(job_id)
    assert record is not None and record.stages is not None
    return [s["status"] for s in record.stages]


def test_events_move_the_stages_along(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    names = [stages.NETWORK, *stages.agglomeration_names([0.3, 0.5])]
    assert names == ["network", "fragments", "faces", "agglomerate", "relabel 0.3",
                     "relabel 0.5"]
    job = store.create(network="n", network_digest="d", input_path="/i", output_path="/o",
                       parameters={}, stages=stages.initial(names)).id
    store.claim(0)
    assert _statuses(store, job) == ["pending"] * 6
    _event(store, job, "network", 1, 2)
    assert _statuses(store, job)[:2] == ["running", "pending"]
    _event(store, job, "network", 2, 2)  # its last block: the next stage runs
    assert _statuses(store, job)[:3] == ["done", "running", "pending"]
    _event(store, job, "faces", 4, 4)  # fragments reported nothing (all done before)
    assert _statuses(store, job) == ["done", "done", "done", "running", "pending", "pending"]
    _event(store, job, "relabel 0.3", 1, 3)  # the global step has ended
    record = store.get(job)
    assert record is not None and record.stages is not None
    assert _statuses(store, job) == ["done"] * 4 + ["running", "pending"]
    assert record.stages[3]["done"] == record.stages[3]["total"] == 1
    assert (record.stages[4]["done"], record.stages[4]["total"]) == (1, 3)
    assert (record.blocks_done, record.blocks_total) == (1, 3)  # the row: the latest event
    _event(store, job, "unknown", 1, 1)  # a name the list lacks changes nothing
    assert _statuses(store, job) == ["done"] * 4 + ["running", "pending"]
    final = [stages.stage(n, status="done", done=1, total=1) for n in names]
    store.complete(job, {"x": 1}, stages=final, summary={
        "blocks_total": 3, "voxels_written": 30, "elapsed_s": 2.0, "voxels_per_second": 15.0})
    assert _statuses(store, job) == ["done"] * 6


def test_a_plain_job_has_no_stage_list(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = store.create(network="n", network_digest="d", input_path="/i", output_path="/o",
                       parameters={}).id
    _event(store, job, "network", 1, 2)
    record = store.get(job)
    assert record is not None and record.stages is None and record.kind == "segment"
    assert record.blocks_done == 1


def test_an_older_database_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)  # the jobs table as it was before the stages
    con.execute("INSERT INTO jobs (status, network, network_digest, input_path, output_path,"
                " parameters, created_at) VALUES ('succeeded', 'n', 'd', '/i', '/o', '{}', 0)")
    con.commit()
    con.close()
    store = JobStore(path)
    record = store.get(1)
    assert record is not None and record.kind == "segment" and record.stages is None
    JobStore(path)  # opened again: nothing left to add
    columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(jobs)")]
    assert columns.count("kind") == columns.count("stages") == 1
