"""Job rows as API bodies: `job_read` (a `JobRead`) and `JobJsonCache` for the status poll.

A poll is the hottest request of a job server: clients ask again and again while the
row changes once per finished block. Decoding the row, building the pydantic model
and serialising it took about a third of a poll's CPU in the API process, so the
JSON body of each job's latest row is kept and sent again while the row is the same.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from znni.api.schemas import JobRead, Progress, StageRead
from znni.engine.location import TENSORSTORE_DRIVERS as DRIVERS
from znni.engine.location import Location
from znni.engine.output.viewer import job_viewer_url
from znni.jobs import stages as job_stages
from znni.jobs.agglomeration import KIND as AGGLOMERATE
from znni.jobs.agglomeration import THRESHOLD_FIELD
from znni.jobs.store import JobRecord

JSON_CACHE_ENTRIES = 1024  # jobs whose latest poll body is kept (~2 kB each)


def predicted_seconds(record: JobRecord) -> float | None:
    """The whole run's predicted seconds in the job's stored plan (planner/jobtime.py)."""
    job = (record.plan or {}).get("job_seconds") or {}
    total = job.get("total_s")
    return float(total) if isinstance(total, int | float) else None


def eta_seconds(record: JobRecord, predicted: float | None) -> float | None:
    """A running job's seconds to go: the prediction less the time spent until blocks are
    done, then more and more the measured rate's (weighted by the fraction done), so the
    ETA starts at the prediction and ends at the measurement."""
    if record.status != "running":
        return None
    return _eta(record.voxels_done, record.voxels_total, record.voxels_per_second,
                record.elapsed_s, predicted)


def _eta(voxels_done: int, voxels_total: int, rate: float | None, elapsed_s: float | None,
         predicted: float | None) -> float | None:
    """A running job's or stage's seconds to go (`eta_seconds`)."""
    measured = (voxels_total - voxels_done) / rate if rate and rate > 0 else None
    planned = None if predicted is None else max(0.0, predicted - (elapsed_s or 0.0))
    if measured is None or planned is None:
        known = measured if measured is not None else planned
        return None if known is None else max(0.0, known)
    done = voxels_done / max(voxels_total, 1)
    return max(0.0, (1.0 - done) * planned + done * measured)


def stage_reads(record: JobRecord, predicted: float | None) -> list[StageRead]:
    """The job's stages: its stored list, or a plain segment job's one, from its row."""
    stored = record.stages
    if stored is None:
        status = ("done" if record.status == "succeeded" else
                  "pending" if record.started_at is None else "running")
        stored = [job_stages.stage(
            job_stages.NETWORK, status=status, done=record.blocks_done,
            total=record.blocks_total, voxels_done=record.voxels_done,
            voxels_total=record.voxels_total, elapsed_s=record.elapsed_s,
            voxels_per_second=record.voxels_per_second)]
    return [_stage_read(s, record.status, predicted if s["name"] == job_stages.NETWORK
                        else None) for s in stored]


def _stage_read(stage: dict[str, Any], job_status: str, predicted: float | None) -> StageRead:
    running = stage["status"] == "running"
    status = "stopped" if running and job_status != "running" else stage["status"]
    eta = None if status != "running" else _eta(
        stage["voxels_done"], stage["voxels_total"], stage["voxels_per_second"],
        stage["elapsed_s"], predicted)
    return StageRead(
        name=stage["name"], status=status,  # type: ignore[arg-type]  # pydantic checks it
        progress=Progress(done=stage["done"], total=stage["total"],
                          voxels_done=stage["voxels_done"], voxels_total=stage["voxels_total"]),
        voxels_per_second=stage["voxels_per_second"], elapsed_s=stage["elapsed_s"], eta_s=eta)


def job_read(record: JobRecord, data_root: Path) -> JobRead:
    """The API view of a job: paths relative to the data root, progress, stages and ETA."""
    rate = record.voxels_per_second
    predicted = predicted_seconds(record)
    stages = stage_reads(record, predicted)
    eta, elapsed = eta_seconds(record, predicted), record.elapsed_s
    if record.stages is not None:  # the running stage's ETA, the stages' seconds together
        eta = next((s.eta_s for s in stages if s.status == "running"), None)
        seconds = [s.elapsed_s for s in stages if s.elapsed_s is not None]
        elapsed = sum(seconds) if seconds else None
    agglomeration = record.kind == AGGLOMERATE
    return JobRead(
        id=record.id,
        status=record.status,  # type: ignore[arg-type]  # a str: pydantic checks it is a JobStatus
        kind=record.kind,  # type: ignore[arg-type]  # a str: pydantic checks it
        network=None if agglomeration else record.network,
        input=_relative(record.input_path, data_root),
        output=_relative(record.output_path, data_root),
        parameters=record.parameters,
        progress=Progress(
            done=record.blocks_done,
            total=record.blocks_total,
            voxels_done=record.voxels_done,
            voxels_total=record.voxels_total,
        ),
        stages=stages,
        voxels_per_second=rate,
        eta_s=eta,
        predicted_s=predicted,
        elapsed_s=elapsed,
        error=record.error,
        plan=record.plan,
        report=record.report,
        cancel_requested=record.cancel_requested,
        attempts=record.attempts,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        viewer_url=None if THRESHOLD_FIELD in record.output_path else job_viewer_url(
            Location.parse(record.input_path, "input"),
            Location.parse(record.output_path, "output"),
            labels=agglomeration or bool(record.parameters.get("labels"))),
    )


def _relative(path: str, root: Path) -> str:
    """`path` relative to the data root. Stored paths are resolved and normalised by
    `confine`, so a string prefix test is exact (pathlib took ~30 us per call, per poll)."""
    prefix = str(root).rstrip("/") + "/"
    driver, sep, location = path.partition("://")  # precomputed:// and n5:// volumes
    if sep and driver in DRIVERS and location.startswith(prefix):
        return f"{driver}://{_relative(location, root)}"
    return path[len(prefix) :] if path.startswith(prefix) and len(path) > len(prefix) else path


class JobJsonCache:
    """The JSON body of `job_read` for each job's latest row, rebuilt when the row changes.

    The key is the whole row: every field of the body (the ETA included) is a function
    of the row and the data root, so an equal row gives the same bytes.
    """

    def __init__(self, data_root: Path, entries: int = JSON_CACHE_ENTRIES) -> None:
        self.data_root = data_root
        self.entries = entries
        self._bodies: OrderedDict[int, tuple[tuple[Any, ...], bytes]] = OrderedDict()  # row, body
        self._lock = threading.Lock()

    def body(self, row: sqlite3.Row) -> bytes:
        values = tuple(row)
        job_id = int(row["id"])
        with self._lock:
            cached = self._bodies.get(job_id)
        if cached is not None and cached[0] == values:
            return cached[1]
        body = job_read(JobRecord.from_row(row), self.data_root).model_dump_json().encode()
        with self._lock:
            self._bodies[job_id] = (values, body)
            self._bodies.move_to_end(job_id)
            while len(self._bodies) > self.entries:
                self._bodies.popitem(last=False)
        return body
