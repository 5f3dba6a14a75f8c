"""Each job's throughput over time, bounded: at most `MAX_POINTS` rows per job in SQLite.

The dashboard's chart must survive a reload and a server restart, so the samples live in
the job database, written in the same transaction as the progress event they come from.
A day-long job finishes thousands of blocks, so the history is kept evenly spread over the
job's life instead of growing with it: a new sample becomes a permanent row only when it
is at least (span so far) / MAX_POINTS after the previous permanent one; otherwise it
replaces the last row (the tail), which therefore always holds the latest event. Should
the rows still reach the bound, every other one is dropped (first and last kept).

`rate` is the output voxels/s *now*: an exponential moving average (time constant
`RATE_TAU_S`) of the rate between consecutive events, unlike the engine's run average. It
is normalised by the weight the attempt's life so far can carry (the attempt started
`elapsed_s` before each event), so a job younger than RATE_TAU_S shows its average, not a
value dragged towards zero.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

MAX_POINTS = 240  # per job: a chart's width in points, ~10 kB of JSON
RATE_TAU_S = 10.0  # the moving average's time constant for "voxels/s now"

SCHEMA = """
CREATE TABLE IF NOT EXISTS job_throughput (
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    t REAL NOT NULL,
    blocks_done INTEGER NOT NULL,
    voxels_done INTEGER NOT NULL,
    rate REAL NOT NULL,
    average REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_throughput_job ON job_throughput (job_id, t);
"""

COLUMNS = ("attempt", "t", "blocks_done", "voxels_done", "rate", "average")


def record(
    con: sqlite3.Connection, job_id: int, attempt: int, t: float, *,
    blocks_done: int, voxels_done: int, elapsed_s: float, average: float,
) -> None:
    """Add one progress event to the job's history (inside the caller's transaction)."""
    last = con.execute(
        "SELECT rowid, attempt, t, voxels_done, rate FROM job_throughput WHERE job_id = ?"
        " ORDER BY t DESC, rowid DESC LIMIT 2",
        (job_id,),
    ).fetchall()
    rate = _rate_now(last[0] if last else None, attempt, t, voxels_done, elapsed_s, average)
    values = (attempt, t, blocks_done, voxels_done, rate, average)
    same_run = len(last) == 2 and last[0]["attempt"] == attempt
    if same_run and t - last[1]["t"] < _spacing(con, job_id, t):
        con.execute(
            "UPDATE job_throughput SET attempt = ?, t = ?, blocks_done = ?, voxels_done = ?,"
            " rate = ?, average = ? WHERE rowid = ?",
            (*values, last[0]["rowid"]),
        )
        return
    con.execute(
        "INSERT INTO job_throughput (job_id, attempt, t, blocks_done, voxels_done, rate, average)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (job_id, *values),
    )
    _thin(con, job_id)


def _rate_now(
    prev: Any, attempt: int, t: float, voxels_done: int, elapsed_s: float, average: float
) -> float:
    """The normalised moving average of voxels/s between events, given the previous sample
    (a row); the attempt's average at its first event (a resumed job starts again)."""
    start = t - elapsed_s
    if prev is None or prev["attempt"] != attempt or t <= prev["t"] or prev["t"] <= start:
        return average
    dt = t - prev["t"]
    step = max(0, voxels_done - prev["voxels_done"]) / dt
    carried = float(prev["rate"]) * _weight(prev["t"] - start)  # the unnormalised average
    keep = math.exp(-dt / RATE_TAU_S)
    return ((1.0 - keep) * step + keep * carried) / _weight(t - start)


def _weight(age_s: float) -> float:
    """The total weight of the moving average over an attempt `age_s` old."""
    return max(1.0 - math.exp(-age_s / RATE_TAU_S), 1e-12)


def _spacing(con: sqlite3.Connection, job_id: int, t: float) -> float:
    """The least time between permanent rows: the span so far over the bound."""
    first = con.execute(
        "SELECT MIN(t) FROM job_throughput WHERE job_id = ?", (job_id,)
    ).fetchone()[0]
    return 0.0 if first is None else (t - first) / MAX_POINTS


def _thin(con: sqlite3.Connection, job_id: int) -> None:
    """At the bound, drop every other row (keeping the first and the last)."""
    count = con.execute(
        "SELECT COUNT(*) FROM job_throughput WHERE job_id = ?", (job_id,)
    ).fetchone()[0]
    if count <= MAX_POINTS:
        return
    con.execute(
        "DELETE FROM job_throughput WHERE rowid IN (SELECT rowid FROM (SELECT rowid,"
        " ROW_NUMBER() OVER (ORDER BY t, rowid) AS n FROM job_throughput WHERE job_id = ?)"
        " WHERE n % 2 = 0 AND n < ?)",
        (job_id, count),
    )


def history(con: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    """The job's samples, oldest first; for a job run before this table existed, its
    progress mirror (`job_blocks`) thinned to the same bound."""
    rows = con.execute(
        f"SELECT {', '.join(COLUMNS)} FROM job_throughput WHERE job_id = ? ORDER BY t, rowid",
        (job_id,),
    ).fetchall()
    if rows:
        return [dict(r) for r in rows]
    return _from_mirror(con, job_id)


def _from_mirror(con: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    rows = con.execute(
        "SELECT attempt, at AS t, blocks_done, voxels_done, elapsed_s FROM job_blocks"
        " WHERE job_id = ? ORDER BY rowid",
        (job_id,),
    ).fetchall()
    stride = max(1, math.ceil(len(rows) / MAX_POINTS))
    kept = [*rows[: len(rows) - 1 : stride], *rows[-1:]]
    points: list[dict[str, Any]] = []
    prev: dict[str, Any] | None = None
    for r in kept:
        average = r["voxels_done"] / r["elapsed_s"] if r["elapsed_s"] > 0 else 0.0
        rate = _rate_now(prev, r["attempt"], r["t"], r["voxels_done"], r["elapsed_s"], average)
        prev = {**dict(r), "rate": rate, "average": average}
        points.append({k: prev[k] for k in COLUMNS})
    return points
