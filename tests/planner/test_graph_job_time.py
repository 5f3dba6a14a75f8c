"""A graph model's whole-run time (planner/jobtime.graph_job_seconds) by hand, and int8's
settlement added to it once (`with_settling`: a second settlement replaces the first)."""

from __future__ import annotations

import pytest

from znni.planner.jobtime import (
    READ_BYTES_PER_S,
    STARTUP_S,
    WRITE_VALUES_PER_S,
    graph_job_seconds,
    predicted_line,
    with_settling,
)


def test_blocks_reads_and_writes_by_hand() -> None:
    job = graph_job_seconds(12.0, (64, 64, 64), (32, 64, 64), (16, 16, 16), in_channels=1,
                            out_channels=2, in_bytes=1, out_dtype="float32")
    assert job["blocks"] == 2 and job["windows_s"] == 12.0
    read_s = 48 * 80 * 80 / READ_BYTES_PER_S
    write_s = 32 * 64 * 64 * 2 / WRITE_VALUES_PER_S["float32"]
    assert job["block_read_s"] == pytest.approx(read_s)
    assert job["block_write_s"] == pytest.approx(write_s)
    assert job["io_total_s"] == pytest.approx(2 * (read_s + write_s))
    assert job["total_s"] == pytest.approx(STARTUP_S + 12.0 + job["io_s"])


def test_settling_is_added_once_and_named_in_the_line() -> None:
    job = graph_job_seconds(10.0, (32, 32, 32), (32, 32, 32), (8, 8, 8), in_channels=1,
                            out_channels=1, in_bytes=1, out_dtype="uint8")
    once = with_settling(job, 3.0)
    assert once["total_s"] == pytest.approx(job["total_s"] + 3.0)
    again = with_settling(once, 1.0)  # settled anew: replaces, never adds up
    assert again["total_s"] == pytest.approx(job["total_s"] + 1.0)
    line = predicted_line({"job_seconds": again}, measured_s=14.0)
    assert line is not None and "1.0 s of it measured before the sweep" in line
    assert "measured before" not in (predicted_line({"job_seconds": job}, measured_s=1) or "")
