"""The API process freezes its startup heap, so no full GC walks it during a burst."""

from __future__ import annotations

import re


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{name} missing from /metrics"
    return float(found.group(1))


def test_startup_heap_is_frozen_and_gc_is_reported(read_server) -> None:
    with read_server.client() as client:
        text = client.get("/metrics").text
    # FastAPI, pydantic, numpy, zarr and the engine: about 100k objects here; an unfrozen
    # server reports 0
    assert metric(text, "znni_gc_frozen_objects") > 20_000
    for generation in (0, 1, 2):
        assert metric(text, f'python_gc_collections_total{{generation="{generation}"}}') >= 0
