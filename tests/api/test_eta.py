"""A job's ETA (api/views.py): the plan's whole-run prediction at the start, the measured
rate's by the end, weighted by the fraction done."""

from __future__ import annotations

from dataclasses import replace

import pytest

from znni.api.views import eta_seconds, job_read, predicted_seconds
from znni.jobs import stages as job_stages
from znni.jobs.store import JobRecord


def _record(**kw) -> JobRecord:  # type: ignore[no-untyped-def]
    base = JobRecord(
        id=1, status="running", network="n", network_digest="d", input_path="i",
        output_path="o", parameters={}, plan={"job_seconds": {"total_s": 100.0}}, report=None,
        error=None, blocks_done=0, blocks_total=4, voxels_done=0, voxels_total=1000,
        voxels_per_second=None, elapsed_s=None, cancel_requested=False, attempts=1,
        worker_slot=0, created_at=0.0, started_at=0.0, finished_at=None)
    return replace(base, **kw)


def test_eta_starts_at_the_prediction_and_ends_at_the_measurement() -> None:
    start = _record()
    assert predicted_seconds(start) == 100.0 and eta_seconds(start, 100.0) == 100.0
    # a quarter done in 40 s at 6.25 voxels/s: 120 s to go measured, 60 s by the plan
    quarter = _record(voxels_done=250, voxels_per_second=6.25, elapsed_s=40.0)
    assert eta_seconds(quarter, 100.0) == pytest.approx(0.75 * 60.0 + 0.25 * 120.0)
    # nearly done: the measurement decides, even when the plan's time is long past
    late = _record(voxels_done=990, voxels_per_second=10.0, elapsed_s=150.0)
    assert eta_seconds(late, 100.0) == pytest.approx(0.99 * 1.0)
    # no prediction (an old row): the measured rate alone; neither: unknown
    assert eta_seconds(quarter, None) == pytest.approx(120.0)
    assert eta_seconds(_record(plan=None), None) is None
    assert eta_seconds(_record(status="succeeded"), 100.0) is None
    assert predicted_seconds(_record(plan={"mode": "windowed"})) is None


def test_a_staged_jobs_seconds_are_its_stages_together(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The job's elapsed_s is the sum of its stages' (set values, nothing timed); a stage
    not yet started counts nothing, and none started gives None."""
    stages = [job_stages.stage("network", status="done", elapsed_s=12.5),
              job_stages.stage("fragments", status="done", elapsed_s=3.25),
              job_stages.stage("relabel 0.4")]
    read = job_read(_record(status="succeeded", stages=stages, elapsed_s=99.0), tmp_path)
    assert read.elapsed_s == 15.75
    assert [s.elapsed_s for s in read.stages] == [12.5, 3.25, None]
    none = [job_stages.stage("network"), job_stages.stage("fragments")]
    assert job_read(_record(stages=none), tmp_path).elapsed_s is None
