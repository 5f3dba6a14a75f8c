"""Structured log lines: one JSON object per job event on the `znni.jobs` logger."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

log = logging.getLogger("znni.jobs")


def log_event(
    event: str, job_id: int | None = None, level: int = logging.INFO, **fields: Any
) -> None:
    """E.g. {"event": "job.succeeded", "job": 3, "t": 1732200000.1, "voxels_per_second": ...}."""
    record: dict[str, Any] = {"event": event, "t": round(time.time(), 3)}
    if job_id is not None:
        record["job"] = job_id
    record.update(fields)
    log.log(level, json.dumps(record, default=str, sort_keys=False))
