"""The durable job store: one SQLite file in WAL mode, every change one transaction.

A crash at any moment leaves either the old or the new row, never half of
one: writes run inside `BEGIN IMMEDIATE ... COMMIT`, and with synchronous=FULL
a COMMIT returns only once the WAL is on disk, so an acknowledged submission
survives even a power loss. The engine's own ledger
(next to the output) is the truth about finished blocks; `job_blocks` mirrors
its progress events so the history of a job survives in the database.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from znni.jobs import stages as job_stages
from znni.jobs import throughput

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    status TEXT NOT NULL CHECK (status IN
        ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    network TEXT NOT NULL,
    network_digest TEXT NOT NULL,
    input_path TEXT NOT NULL,
    output_path TEXT NOT NULL,
    parameters TEXT NOT NULL,
    plan TEXT,
    report TEXT,
    error TEXT,
    blocks_done INTEGER NOT NULL DEFAULT 0,
    blocks_total INTEGER NOT NULL DEFAULT 0,
    voxels_done INTEGER NOT NULL DEFAULT 0,
    voxels_total INTEGER NOT NULL DEFAULT 0,
    voxels_per_second REAL,
    elapsed_s REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    worker_slot INTEGER,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, id);
CREATE INDEX IF NOT EXISTS jobs_output ON jobs (output_path, status);
CREATE TABLE IF NOT EXISTS job_blocks (
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    blocks_done INTEGER NOT NULL,
    voxels_done INTEGER NOT NULL,
    elapsed_s REAL NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_blocks_job ON job_blocks (job_id, attempt);
"""

ACTIVE = ("queued", "running")
Rows = list[dict[str, Any]]  # query rows as dicts (a name: JobStore.list hides `list` inside it)

_WRITE_LOCKS: dict[Path, threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock(path: Path) -> threading.Lock:
    """One lock per database file and process, shared by every `JobStore` on that file.

    Threads of one process queue on it instead of on SQLite's file lock, whose busy
    handler polls with sleeps of 1, 2, 5, 10, ... ms: under a burst of submissions two
    writer threads otherwise sleep on each other. Other processes still meet the file lock.
    """
    with _WRITE_LOCKS_GUARD:
        return _WRITE_LOCKS.setdefault(path, threading.Lock())


@dataclass(frozen=True)
class JobRecord:
    """One row of `jobs`, decoded."""

    id: int
    status: str
    network: str
    network_digest: str
    input_path: str
    output_path: str
    parameters: dict[str, Any]
    plan: dict[str, Any] | None
    report: dict[str, Any] | None
    error: str | None
    blocks_done: int
    blocks_total: int
    voxels_done: int
    voxels_total: int
    voxels_per_second: float | None
    elapsed_s: float | None
    cancel_requested: bool
    attempts: int
    worker_slot: int | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    kind: str = "segment"  # or "agglomerate": an agglomeration of existing affinities
    stages: list[dict[str, Any]] | None = None  # jobs/stages.py; None: the network's alone

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        values = dict(row)
        for key in ("parameters", "plan", "report", "stages"):
            values[key] = json.loads(values[key]) if values[key] is not None else None
        values["cancel_requested"] = bool(values["cancel_requested"])
        return cls(**values)


class JobStore:
    """All reads and writes of the job database; safe to use from several processes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).resolve()
        self._local = threading.local()
        self._write_lock = _write_lock(self.path)
        con = self._connection()
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(SCHEMA + throughput.SCHEMA)  # new tables: fresh and old files
        if job_stages.missing_columns(con):  # new columns: fresh and old files
            with self._write() as w:
                job_stages.add_columns(w)

    def _connection(self) -> sqlite3.Connection:
        """One connection per thread, kept open: opening one per request parses the schema
        again, and closing the last one checkpoints the WAL with fsyncs (milliseconds)."""
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            con.row_factory = sqlite3.Row
            # FULL: a commit is on disk before it returns (NORMAL could lose the last commits
            # on power loss); in WAL mode that is one fsync of the WAL per transaction
            con.execute("PRAGMA synchronous=FULL")
            con.execute("PRAGMA foreign_keys=ON")
            self._local.con = con
        return con

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """Autocommit reads: each statement sees the latest committed state."""
        yield self._connection()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: all of it is committed, or (on any error or crash) none of it."""
        con = self._connection()
        with self._write_lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise

    # -- the API side -------------------------------------------------------------------

    def create(
        self,
        *,
        network: str,
        network_digest: str,
        input_path: str,
        output_path: str,
        parameters: dict[str, Any],
        kind: str = "segment",
        stages: Rows | None = None,
    ) -> JobRecord:
        """Queue a job, unless another active job already writes the same output."""
        with self._write() as con:
            clash = con.execute(
                "SELECT id, status FROM jobs WHERE output_path = ? AND status IN (?, ?)",
                (output_path, *ACTIVE),
            ).fetchone()
            if clash is not None:
                raise OutputBusyError(int(clash["id"]), str(clash["status"]))
            cur = con.execute(
                "INSERT INTO jobs (status, network, network_digest, input_path, output_path,"
                " parameters, created_at, kind, stages) VALUES ('queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                (network, network_digest, input_path, output_path, json.dumps(parameters),
                 time.time(), kind, None if stages is None else json.dumps(stages)),
            )
            job_id = int(cur.lastrowid or 0)
            row = con.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord.from_row(row)

    def get(self, job_id: int) -> JobRecord | None:
        row = self.get_row(job_id)
        return JobRecord.from_row(row) if row is not None else None

    def get_row(self, job_id: int) -> sqlite3.Row | None:
        """The raw row (undecoded): the status poll compares it with the last one it served."""
        with self._read() as con:
            return con.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()

    def list(
        self, status: str | None = None, limit: int = 100, offset: int = 0
    ) -> tuple[list[JobRecord], int]:
        where, args = ("WHERE status = ?", (status,)) if status else ("", ())
        with self._read() as con:
            total = con.execute(f"SELECT COUNT(*) FROM jobs {where}", args).fetchone()[0]
            rows = con.execute(
                f"SELECT * FROM jobs {where} ORDER BY id LIMIT ? OFFSET ?", (*args, limit, offset)
            ).fetchall()
        return [JobRecord.from_row(r) for r in rows], int(total)

    def request_cancel(self, job_id: int) -> JobRecord | None:
        """A queued job is cancelled at once; a running one is flagged for its worker."""
        now = time.time()
        with self._write() as con:
            con.execute("UPDATE jobs SET status = 'cancelled', finished_at = ?, cancel_requested"
                        " = 1 WHERE id = ? AND status = 'queued'", (now, job_id))
            con.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status ="
                        " 'running'", (job_id,))
            row = con.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord.from_row(row) if row is not None else None

    def counts_by_status(self) -> dict[str, int]:
        with self._read() as con:
            rows = con.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def voxel_totals(self) -> tuple[int, float]:
        """(voxels computed over all jobs, current output voxels/s of running jobs)."""
        with self._read() as con:
            done = con.execute("SELECT COALESCE(SUM(voxels_done), 0) FROM jobs").fetchone()[0]
            rate = con.execute(
                "SELECT COALESCE(SUM(voxels_per_second), 0) FROM jobs WHERE status = 'running'"
            ).fetchone()[0]
        return int(done), float(rate)

    # -- the worker side ----------------------------------------------------------------

    def claim(self, slot: int) -> JobRecord | None:
        """Next job for worker `slot`: its own interrupted job first (resume), else the oldest
        queued one. The claim is atomic, so two workers never take one job."""
        now = time.time()
        with self._write() as con:
            row = con.execute(
                "SELECT id FROM jobs WHERE status = 'running' AND worker_slot = ? ORDER BY id",
                (slot,),
            ).fetchone()
            if row is None:
                row = con.execute(
                    "SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1"
                ).fetchone()
            if row is None:
                return None
            con.execute(
                "UPDATE jobs SET status = 'running', worker_slot = ?, attempts = attempts + 1,"
                " started_at = COALESCE(started_at, ?) WHERE id = ?",
                (slot, now, row["id"]),
            )
            claimed = con.execute("SELECT * FROM jobs WHERE id = ?", (row["id"],)).fetchone()
        return JobRecord.from_row(claimed)

    def running_slots(self) -> set[int]:
        with self._read() as con:
            rows = con.execute(
                "SELECT DISTINCT worker_slot FROM jobs WHERE status = 'running'"
            ).fetchall()
        return {int(r[0]) for r in rows if r[0] is not None}

    def requeue_slot(self, slot: int) -> int:
        """Hand the running jobs of a worker slot that no longer exists back to the queue."""
        with self._write() as con:
            cur = con.execute(
                "UPDATE jobs SET status = 'queued', worker_slot = NULL"
                " WHERE status = 'running' AND worker_slot = ?",
                (slot,),
            )
        return int(cur.rowcount)

    def set_plan(self, job_id: int, plan: dict[str, Any]) -> None:
        with self._write() as con:
            con.execute("UPDATE jobs SET plan = ? WHERE id = ?", (json.dumps(plan), job_id))

    def record_progress(
        self,
        job_id: int,
        attempt: int,
        *,
        blocks_done: int,
        blocks_total: int,
        voxels_done: int,
        voxels_total: int,
        elapsed_s: float,
        voxels_per_second: float,
        stage: str | None = None,
    ) -> bool:
        """Store one progress event (its ledger-mirror row and throughput sample too, and
        for a job with stages, its `stage`'s numbers); returns cancel_requested."""
        now = time.time()
        with self._write() as con:
            con.execute(
                "UPDATE jobs SET blocks_done = ?, blocks_total = ?, voxels_done = ?,"
                " voxels_total = ?, elapsed_s = ?, voxels_per_second = ? WHERE id = ?",
                (blocks_done, blocks_total, voxels_done, voxels_total, elapsed_s,
                 voxels_per_second, job_id),
            )
            con.execute(
                "INSERT INTO job_blocks (job_id, attempt, blocks_done, voxels_done, elapsed_s, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, attempt, blocks_done, voxels_done, elapsed_s, now),
            )
            throughput.record(con, job_id, attempt, now, blocks_done=blocks_done,
                              voxels_done=voxels_done, elapsed_s=elapsed_s,
                              average=voxels_per_second)
            if stage is not None:
                job_stages.record(con, job_id, stage, {
                    "done": blocks_done, "total": blocks_total, "voxels_done": voxels_done,
                    "voxels_total": voxels_total, "elapsed_s": elapsed_s,
                    "voxels_per_second": voxels_per_second})
            flag = con.execute(
                "SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()[0]
        return bool(flag)

    def cancel_requested(self, job_id: int) -> bool:
        with self._read() as con:
            row = con.execute(
                "SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        return bool(row and row[0])

    def finish(
        self,
        job_id: int,
        status: str,
        *,
        error: str | None = None,
        report: dict[str, Any] | None = None,
    ) -> None:
        """Move a running job to a final state (or back to 'queued' for a clean shutdown)."""
        now = time.time()
        finished = None if status == "queued" else now
        with self._write() as con:
            con.execute(
                "UPDATE jobs SET status = ?, error = ?, report = COALESCE(?, report),"
                " finished_at = ?, worker_slot = CASE WHEN ? = 'queued' THEN NULL"
                " ELSE worker_slot END WHERE id = ?",
                (status, error, json.dumps(report) if report is not None else None, finished,
                 status, job_id),
            )

    def complete(self, job_id: int, report: dict[str, Any], *,
                 summary: dict[str, Any] | None = None,
                 stages: Rows | None = None) -> None:
        """Success: progress shows everything done, the engine's report is kept. `summary`:
        the last stage's blocks_total, voxels_written, the job's elapsed_s and
        voxels_per_second (default: the SegmentReport `report`'s); `stages`: all done."""
        s = report if summary is None else summary
        with self._write() as con:
            con.execute(
                "UPDATE jobs SET status = 'succeeded', error = NULL, report = ?, finished_at = ?,"
                " blocks_done = ?, blocks_total = ?, voxels_done = MAX(voxels_done, ?),"
                " voxels_total = MAX(voxels_total, ?), elapsed_s = ?, voxels_per_second = ?,"
                " stages = COALESCE(?, stages) WHERE id = ?",
                (json.dumps(report), time.time(), s["blocks_total"], s["blocks_total"],
                 s["voxels_written"], s["voxels_written"], s["elapsed_s"],
                 s["voxels_per_second"], None if stages is None else json.dumps(stages), job_id),
            )

    def ledger(self, job_id: int) -> Rows:
        with self._read() as con:
            rows = con.execute(
                "SELECT attempt, blocks_done, voxels_done, elapsed_s, at FROM job_blocks"
                " WHERE job_id = ? ORDER BY rowid",
                (job_id,),
            ).fetchall()
        return [dict(r) for r in rows]

    def throughput(self, job_id: int) -> Rows:
        """The job's bounded throughput history (`throughput.py`), oldest first."""
        with self._read() as con:
            return throughput.history(con, job_id)


class OutputBusyError(ValueError):
    """Another queued or running job already writes this output."""

    def __init__(self, job_id: int, status: str) -> None:
        super().__init__(f"output is already being written by job {job_id} ({status})")
        self.job_id = job_id
