"""A job's stages in the job store: the network's, then an agglomeration's (docs/design.md,
"HTTP API"), each with its blocks done and total, voxels, seconds and rate.

A plain segment job has one stage, its row's progress columns themselves (`stages` stays
NULL). A job with an agglomeration keeps its list as JSON in `jobs.stages`, written inside
the transaction of each progress event: the event's stage takes the event's numbers, the
stages before it are done, and a stage whose last block is done hands over to the next one
(so the global step between the faces and the relabelling, which reports no blocks, shows
as running while it runs).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

# the engine's stage names (engine/agglomerate/run.py; tests/api/test_agglomerate_jobs.py
# compares them with an engine run's report)
NETWORK = "network"
FRAGMENTS = "fragments"  # watershed basins and each block's inner edges
FACES = "faces"  # the edges and links across each block's lower faces
GLOBAL_STEP = "agglomerate"  # the one global step: basins joined, agglomerated per threshold
STATUSES = ("pending", "running", "done")
# columns added to the jobs table (a database made before them gets them on opening)
COLUMNS = {"kind": "TEXT NOT NULL DEFAULT 'segment'", "stages": "TEXT"}


def relabel_name(threshold: float) -> str:
    """The engine's name of a threshold's relabelling stage (engine/agglomerate/run.py)."""
    return f"relabel {float(threshold):g}"


def agglomeration_names(thresholds: list[float]) -> list[str]:
    return [FRAGMENTS, FACES, GLOBAL_STEP, *(relabel_name(t) for t in thresholds)]


def initial(names: list[str]) -> list[dict[str, Any]]:
    """Every stage pending, nothing counted (the global step is one step)."""
    return [stage(n, total=1 if n == GLOBAL_STEP else 0) for n in names]


def stage(name: str, *, status: str = "pending", done: int = 0, total: int = 0,
          voxels_done: int = 0, voxels_total: int = 0, elapsed_s: float | None = None,
          voxels_per_second: float | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "done": done, "total": total,
            "voxels_done": voxels_done, "voxels_total": voxels_total, "elapsed_s": elapsed_s,
            "voxels_per_second": voxels_per_second}


def advance(stages: list[dict[str, Any]], name: str, event: dict[str, Any]
            ) -> list[dict[str, Any]]:
    """The list after a progress event of stage `name` (`event`: stage() fields); a name
    not in the list leaves it as it is."""
    index = next((i for i, s in enumerate(stages) if s["name"] == name), None)
    if index is None:
        return stages
    out = [dict(s) for s in stages]
    for earlier in out[:index]:
        if earlier["status"] != "done":
            earlier.update(status="done", done=max(earlier["done"], earlier["total"]),
                           voxels_done=max(earlier["voxels_done"], earlier["voxels_total"]))
    current = out[index]
    current.update(event)
    finished = current["total"] > 0 and current["done"] >= current["total"]
    current["status"] = "done" if finished else "running"
    if finished and index + 1 < len(out) and out[index + 1]["status"] == "pending":
        out[index + 1]["status"] = "running"
    return out


def record(con: sqlite3.Connection, job_id: int, name: str, event: dict[str, Any]) -> None:
    """Apply one progress event to the job's stored stages (inside the caller's
    transaction); nothing for a job without a stage list."""
    row = con.execute("SELECT stages FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or row[0] is None:
        return
    stages = advance(json.loads(row[0]), name, event)
    con.execute("UPDATE jobs SET stages = ? WHERE id = ?", (json.dumps(stages), job_id))


def add_columns(con: sqlite3.Connection) -> None:
    """Give a jobs table made before the stages their columns (inside a write transaction:
    two processes opening an old file add them once)."""
    have = {str(r[1]) for r in con.execute("PRAGMA table_info(jobs)").fetchall()}
    for column, declaration in COLUMNS.items():
        if column not in have:
            con.execute(f"ALTER TABLE jobs ADD COLUMN {column} {declaration}")


def missing_columns(con: sqlite3.Connection) -> bool:
    have = {str(r[1]) for r in con.execute("PRAGMA table_info(jobs)").fetchall()}
    return not set(COLUMNS) <= have
