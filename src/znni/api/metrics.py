"""`/metrics` in the Prometheus text exposition format (version 0.0.4), written by hand."""

from __future__ import annotations

import gc
from collections import Counter

from znni.api.schemas import JOB_STATUSES
from znni.jobs.store import JobStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestCounter:
    """HTTP responses by status class, counted in the server process."""

    def __init__(self) -> None:
        self.by_code: Counter[str] = Counter()

    def observe(self, status_code: int) -> None:
        self.by_code[f"{status_code // 100}xx"] += 1


def render(store: JobStore, requests: RequestCounter, workers_alive: int) -> str:
    counts = store.counts_by_status()
    voxels_done, rate = store.voxel_totals()
    lines = [
        "# HELP znni_jobs Jobs in the store by status.",
        "# TYPE znni_jobs gauge",
        *(f'znni_jobs{{status="{s}"}} {counts.get(s, 0)}' for s in JOB_STATUSES),
        "# HELP znni_voxels_computed_total Output voxels finished over all jobs.",
        "# TYPE znni_voxels_computed_total counter",
        f"znni_voxels_computed_total {voxels_done}",
        "# HELP znni_throughput_voxels_per_second Current output voxels/s of running jobs.",
        "# TYPE znni_throughput_voxels_per_second gauge",
        f"znni_throughput_voxels_per_second {rate:.6g}",
        "# HELP znni_workers_alive Job worker processes alive.",
        "# TYPE znni_workers_alive gauge",
        f"znni_workers_alive {workers_alive}",
        "# HELP znni_http_responses_total HTTP responses by status class.",
        "# TYPE znni_http_responses_total counter",
        *(
            f'znni_http_responses_total{{code="{c}"}} {n}'
            for c, n in sorted(requests.by_code.items())
        ),
        *_gc_lines(),
    ]
    return "\n".join(lines) + "\n"


def _gc_lines() -> list[str]:
    """The API process's cyclic GC: a full collection pauses every request (see app.py)."""
    stats = gc.get_stats()
    return [
        "# HELP python_gc_collections_total Cyclic GC runs in the API process by generation.",
        "# TYPE python_gc_collections_total counter",
        *(
            f'python_gc_collections_total{{generation="{g}"}} {s["collections"]}'
            for g, s in enumerate(stats)
        ),
        "# HELP znni_gc_frozen_objects Objects exempted from the cyclic GC at startup.",
        "# TYPE znni_gc_frozen_objects gauge",
        f"znni_gc_frozen_objects {gc.get_freeze_count()}",
    ]
