"""The status poll: its cached JSON follows every change of the job's row, its short ASGI
path answers exactly as the FastAPI route, and a rewritten input volume is seen at once
(the engine caches opened arrays by their metadata)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from support.server_util import new_job, wait_job, write_volume

from znni.api.views import JobJsonCache
from znni.jobs.store import JobStore


def rewrite_volume(path: Path, shape: tuple[int, ...]) -> None:
    """(Re)write a float32 array at `path`, replacing whatever array was there."""
    write_volume(path, shape, seed=4, chunks=shape, overwrite=True)


def queued_job(store: JobStore, output: str) -> int:
    return new_job(store, output, input_path="/r/in.zarr", border="zero")


def test_cached_body_follows_the_row(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    cache = JobJsonCache(Path("/r"))
    a = queued_job(store, "/r/out/a.zarr")
    first = cache.body(store.get_row(a))
    assert cache.body(store.get_row(a)) is first  # unchanged row: the same bytes again
    body = json.loads(first)
    assert body["status"] == "queued" and body["input"] == "in.zarr"
    assert body["output"] == "out/a.zarr" and body["parameters"] == {"border": "zero"}
    assert body["eta_s"] is None and body["progress"]["total"] == 0
    store.claim(slot=0)
    store.record_progress(
        a,
        1,
        blocks_done=1,
        blocks_total=4,
        voxels_done=10,
        voxels_total=40,
        elapsed_s=0.5,
        voxels_per_second=20.0,
    )
    body = json.loads(cache.body(store.get_row(a)))
    assert body["status"] == "running" and body["attempts"] == 1
    assert body["progress"] == {"done": 1, "total": 4, "voxels_done": 10, "voxels_total": 40}
    assert body["eta_s"] == 1.5  # (40 - 10) voxels at 20 voxels/s
    store.request_cancel(a)
    assert json.loads(cache.body(store.get_row(a)))["cancel_requested"] is True
    store.finish(a, "cancelled")
    body = json.loads(cache.body(store.get_row(a)))
    assert body["status"] == "cancelled" and body["eta_s"] is None
    assert body["finished_at"] is not None


def test_cache_keeps_at_most_its_entries_and_stays_right(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    cache = JobJsonCache(Path("/r"), entries=2)
    ids = [queued_job(store, f"/r/out/{i}.zarr") for i in range(3)]
    for _ in range(2):
        for i, job_id in enumerate(ids):
            body = json.loads(cache.body(store.get_row(job_id)))
            assert body["id"] == job_id and body["output"] == f"out/{i}.zarr"
    assert len(cache._bodies) == 2


def test_poll_equals_the_listed_job_and_404s(server) -> None:
    """The poll's own JSON (cached bytes) equals FastAPI's serialisation in GET /v1/jobs."""
    with server.client() as client:
        r = client.post(
            "/v1/jobs",
            json={"network": "tiny", "input": "small.zarr", "output": "out/poll-cache.zarr"},
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        done = wait_job(client, job_id, ("succeeded",))
        assert done["progress"]["done"] == done["progress"]["total"] >= 1
        assert done["report"] is not None
        polled = client.get(f"/v1/jobs/{job_id}")
        listed = client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]
        missing = client.get("/v1/jobs/999999")
    assert polled.headers["content-type"] == "application/json"
    assert polled.json() == next(j for j in listed if j["id"] == job_id)
    assert missing.status_code == 404 and "999999" in missing.json()["detail"]


def test_rewritten_input_is_validated_again(server, site) -> None:
    path = site["root"] / "rewritten.zarr"
    body = {"network": "tiny", "input": "rewritten.zarr"}
    with server.client() as client:
        rewrite_volume(path, (2, 9, 9, 9))
        ok = client.post("/v1/jobs", json={**body, "output": "out/rw-1.zarr"})
        assert ok.status_code == 201, ok.text
        client.post(f"/v1/jobs/{ok.json()['id']}/cancel")
        rewrite_volume(path, (3, 9, 9, 9))  # now 3 channels
        refused = client.post("/v1/jobs", json={**body, "output": "out/rw-2.zarr"})
        assert refused.status_code == 422
        assert "3 channels" in refused.json()["detail"]
        rewrite_volume(path, (2, 9, 9, 10))
        roi = [[0, 9], [0, 9], [0, 10]]  # inside only the new shape
        again = client.post("/v1/jobs", json={**body, "output": "out/rw-3.zarr", "roi": roi})
        assert again.status_code == 201, again.text
        client.post(f"/v1/jobs/{again.json()['id']}/cancel")


def submit_and_finish(client: httpx.Client, output: str) -> int:
    r = client.post("/v1/jobs", json={"network": "tiny", "input": "small.zarr", "output": output})
    assert r.status_code == 201, r.text
    wait_job(client, r.json()["id"], ("succeeded",))
    return int(r.json()["id"])


def test_short_path_answers_exactly_as_the_route(server) -> None:
    """A zero-padded id goes through FastAPI's route; the plain poll takes the short path.
    Same status, bytes and content type. A query string goes to the route too, which takes
    none."""
    with server.client() as client:
        job_id = submit_and_finish(client, "out/poll-short.zarr")
        short = client.get(f"/v1/jobs/{job_id}")
        via_route = client.get(f"/v1/jobs/000{job_id}")
        assert via_route.status_code == short.status_code == 200
        assert via_route.content == short.content
        assert via_route.headers["content-type"] == short.headers["content-type"]
        queried = client.get(f"/v1/jobs/{job_id}?x=1")
        assert queried.status_code == 422 and "'x'" in queried.json()["detail"]
        assert client.get("/v1/jobs/0").status_code == 422
        assert client.get("/v1/jobs/999999999999999999").status_code == 404
        before = count_2xx(client.get("/metrics").text)
        for _ in range(5):
            assert client.get(f"/v1/jobs/{job_id}").status_code == 200
        assert count_2xx(client.get("/metrics").text) == before + 6  # 5 polls, 1 /metrics
        big = client.request("GET", f"/v1/jobs/{job_id}", content=b"x" * (65 * 1024))
        assert big.status_code == 413  # the body limit still comes first


def count_2xx(metrics: str) -> int:
    found = re.search(r'^znni_http_responses_total\{code="2xx"\} (\d+)$', metrics, re.MULTILINE)
    assert found is not None
    return int(found.group(1))


@pytest.mark.parametrize(
    ("headers", "word"),
    [
        ({}, "missing"),
        ({"Authorization": "Bearer wrong"}, "wrong"),
        ({"Authorization": "Basic czNjcmV0"}, "missing"),
        ({"Authorization": "Bearer s3cret0"}, "wrong"),
        ({"Authorization": "Bearer"}, "missing"),
    ],
)
def test_short_path_needs_the_token(token_server, headers, word) -> None:
    with token_server.client() as client:
        job_id = submit_and_finish(client, f"out/poll-token-{word}-{len(headers)}.zarr")
        good = client.get(f"/v1/jobs/{job_id}")
    assert good.status_code == 200 and good.json()["id"] == job_id
    r = httpx.get(f"{token_server.url}/v1/jobs/{job_id}", headers=headers)
    assert r.status_code == 401, r.text
    assert word in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
