"""The dashboard over plain HTTP: its files and headers, and the /v1 routes it reads
(throughput history, block map, machine) after a real job on a real server."""

from __future__ import annotations

import os
import re

import pytest
from support.server_util import wait_job

JOB = {"network": "tiny", "input": "small.zarr", "chunks": [4, 4, 4], "block": [4, 8, 4]}
ASSETS = {
    "app.js": "text/javascript",
    "style.css": "text/css",
    "favicon.svg": "image/svg+xml",
}


@pytest.fixture(scope="module")
def done_job(server) -> dict:
    """A finished job of 24 blocks on this module's server."""
    with server.client() as client:
        r = client.post("/v1/jobs", json={**JOB, "output": "dash/http.zarr"})
        assert r.status_code == 201, r.text
        return wait_job(client, r.json()["id"], ("succeeded",))


def test_page_has_a_strict_csp_and_no_job_data(server, done_job) -> None:
    with server.client() as client:
        r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    for rule in ("script-src 'self'", "style-src 'self'", "object-src 'none'",
                 "base-uri 'none'", "frame-ancestors 'none'", "default-src 'none'"):
        assert rule in csp
    assert "unsafe" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    html = r.text
    assert done_job["output"] not in html and "small.zarr" not in html
    assert re.search(r"<script(?![^>]*\ssrc=)", html) is None, "inline script"
    assert "<style" not in html and re.search(r"<[^>]*\s(style|on[a-z]+)=", html) is None


def test_static_files_have_their_types_and_the_csp(server) -> None:
    with server.client() as client:
        for name, kind in ASSETS.items():
            r = client.get(f"/static/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"].startswith(kind), (name, r.headers["content-type"])
            assert "script-src 'self'" in r.headers["content-security-policy"]
        for bad in ("app.py", "../pages.py", "..%2Fpages.py", "nothing.js", ".hidden.js"):
            r = client.get(f"/static/{bad}")
            assert r.status_code == 404, bad
            assert "def " not in r.text


def test_every_module_the_page_imports_is_served(server) -> None:
    """app.js and the modules it imports, transitively, as the browser will ask for them."""
    seen: set[str] = set()
    todo = ["app.js"]
    with server.client() as client:
        while todo:
            name = todo.pop()
            seen.add(name)
            r = client.get(f"/static/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"].startswith("text/javascript")
            assert "innerHTML" not in r.text and "eval(" not in r.text, name
            for dep in re.findall(r'from "\./([a-z]+\.js)"', r.text):
                if dep not in seen:
                    todo.append(dep)
    assert {"api.js", "jobs.js", "job.js", "chart.js", "blocks.js", "token.js"} <= seen


def test_throughput_history_after_a_job(server, done_job) -> None:
    job_id = done_job["id"]
    with server.client() as client:
        body = client.get(f"/v1/jobs/{job_id}/throughput").json()
        last = client.get(f"/v1/jobs/{job_id}/throughput", params={"last": 1}).json()
        missing = client.get("/v1/jobs/987654/throughput")
        bad = client.get(f"/v1/jobs/{job_id}/throughput", params={"last": 0})
    points = body["points"]
    assert body["job"] == job_id and 1 <= len(points) <= body["max_points"]
    assert points[-1]["blocks_done"] == done_job["progress"]["total"]
    assert points[-1]["voxels_done"] == done_job["progress"]["voxels_total"]
    assert all(a["t"] <= b["t"] for a, b in zip(points, points[1:]))
    assert all(p["rate"] >= 0 and p["average"] > 0 for p in points)
    assert last["points"] == points[-1:]
    assert missing.status_code == 404 and "987654" in missing.json()["detail"]
    assert bad.status_code == 422


def test_block_map_after_a_job(server, done_job) -> None:
    with server.client() as client:
        body = client.get(f"/v1/jobs/{done_job['id']}/blocks").json()
    total = done_job["progress"]["total"]
    assert body["region"] == [[0, 14], [0, 13], [0, 11]]
    assert body["step"] == [4, 8, 4] and body["grid"] == [4, 2, 3]
    assert body["total"] == total == 24 and body["done"] == total
    assert body["state"] == "1" * total


def test_block_map_of_an_roi_job_covers_the_roi(server) -> None:
    roi = [[3, 12], [0, 9], [2, 11]]
    with server.client() as client:
        r = client.post("/v1/jobs", json={**JOB, "output": "dash/roi.zarr", "roi": roi,
                                          "chunks": [3, 5, 4], "block": None})
        assert r.status_code == 201, r.text
        job = wait_job(client, r.json()["id"], ("succeeded",))
        body = client.get(f"/v1/jobs/{job['id']}/blocks").json()
    assert body["region"] == roi
    # the grid is the layout the plan priced and the engine cut (issue 39: a thin remainder
    # merged into its neighbour is one block, drawn as one cell)
    edges = job["plan"]["block_edges"]
    assert body["edges"] == edges and body["grid"] == [len(e) - 1 for e in edges]
    assert body["total"] == body["done"] == job["progress"]["total"]
    assert body["state"] == "1" * body["total"]
    assert all(s % c == 0 for s, c in zip(body["step"], [3, 5, 4]))  # whole chunks


def test_block_map_of_a_queued_job_is_409(server, site) -> None:
    from support.server_util import write_volume

    write_volume(site["root"] / "slow.zarr", (2, 40, 40, 64), seed=5, chunks=(2, 8, 8, 8))
    slow = {**JOB, "input": "slow.zarr", "chunks": [2, 4, 4], "block": [2, 4, 4]}
    with server.client() as client:
        first = client.post("/v1/jobs", json={**slow, "output": "dash/slow1.zarr"}).json()["id"]
        second = client.post("/v1/jobs", json={**slow, "output": "dash/slow2.zarr"}).json()["id"]
        r = client.get(f"/v1/jobs/{second}/blocks")
        wait_job(client, first, ("succeeded",), min_done=2)
        partial = client.get(f"/v1/jobs/{first}/blocks").json()
        for job_id in (second, first):
            client.post(f"/v1/jobs/{job_id}/cancel")
        cancelled = wait_job(client, first, ("cancelled", "succeeded"))
        final = client.get(f"/v1/jobs/{first}/blocks").json()
    assert r.status_code == 409 and "not started" in r.json()["detail"]
    assert partial["grid"] == [20, 10, 16] and partial["done"] >= 2
    assert partial["state"].count("1") == partial["done"]
    assert final["done"] == cancelled["progress"]["done"] == final["state"].count("1")
    assert final["state"].startswith("1" * final["done"])  # blocks run in grid order


def test_machine(server) -> None:
    with server.client() as client:
        m = client.get("/v1/machine").json()
    assert m["cores"] >= 1 and m["workers"] == 1 and m["workers_alive"] == 1
    assert m["memory_total_bytes"] > m["memory_available_bytes"] > 0
    assert m["server_rss_bytes"] > 0 and m["workers_rss_bytes"] > 0
    assert isinstance(m["gpus"], list)
    assert m["jobs_queued"] >= 0 and m["jobs_running"] >= 0


def test_new_routes_need_the_token(token_server) -> None:
    import httpx

    for path in ("/v1/machine", "/v1/jobs/1/throughput", "/v1/jobs/1/blocks"):
        r = httpx.get(f"{token_server.url}{path}")
        assert r.status_code == 401, path
    page = httpx.get(f"{token_server.url}/")
    assert page.status_code == 200  # the page itself holds nothing; its script asks for the token


def test_windowed_job_has_a_block_map_and_a_history(server, site, onnx_models) -> None:
    """An ONNX U-Net run in overlapping windows: its blocks are on the same chunk grid."""
    import numpy as np
    import zarr

    onnx_models.copy("basicunet", site["models"] / "dash-unet.onnx")
    shape = (19, 41, 36)
    vol = np.random.default_rng(9).integers(0, 256, size=shape).astype(np.uint8)
    zarr.create_array(str(site["root"] / "dash-em.zarr"), shape=shape, chunks=(8, 16, 16),
                      dtype="uint8")[...] = vol
    job = {"network": "dash-unet", "input": "dash-em.zarr", "output": "dash/unet.zarr",
           "window": [16, 32, 32], "chunks": [8, 16, 16], "block": [16, 32, 32],
           "scale": 1 / 255}
    with server.client() as client:
        r = client.post("/v1/jobs", json=job)
        assert r.status_code == 201, r.text
        done = wait_job(client, r.json()["id"], ("succeeded",), timeout_s=300)
        blocks = client.get(f"/v1/jobs/{done['id']}/blocks").json()
        history = client.get(f"/v1/jobs/{done['id']}/throughput").json()
    assert done["report"]["plan"]["mode"] == "windowed"
    assert blocks["region"] == [[0, 19], [0, 41], [0, 36]] and blocks["step"] == [16, 32, 32]
    assert blocks["total"] == blocks["done"] == done["progress"]["total"] == 2 * 2 * 2
    assert history["points"][-1]["blocks_done"] == 8


def test_history_survives_a_server_restart(site, tmp_path) -> None:
    from support.server_util import Server

    server = Server(site["root"], site["models"], tmp_path / "jobs.sqlite").start()
    try:
        with server.client() as client:
            r = client.post("/v1/jobs", json={**JOB, "output": "dash/restart.zarr"})
            job_id = wait_job(client, r.json()["id"], ("succeeded",))["id"]
            before = client.get(f"/v1/jobs/{job_id}/throughput").json()
        server.stop()
        server.start()
        with server.client() as client:
            after = client.get(f"/v1/jobs/{job_id}/throughput").json()
    finally:
        server.stop()
    assert before["points"] and after == before


def test_machine_lists_the_gpus_nvidia_smi_reports(site, tmp_path, monkeypatch) -> None:
    """No GPU here: a stand-in `nvidia-smi` first on the server's PATH answers the query the
    way the real one does (CSV, no header, no units)."""
    from support.server_util import Server

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 81559, 2048, 37'\n"
                   "echo '1, NVIDIA H100 80GB HBM3, 81559, 0, [N/A]'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    server = Server(site["root"], site["models"], tmp_path / "jobs.sqlite").start()
    try:
        with server.client() as client:
            gpus = client.get("/v1/machine").json()["gpus"]
    finally:
        server.stop()
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["memory_used_bytes"] == 2048 * 2**20
    assert gpus[0]["utilization_percent"] == 37.0 and gpus[1]["utilization_percent"] is None
