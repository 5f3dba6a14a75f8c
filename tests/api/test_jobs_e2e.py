"""A real `znni serve` driven over HTTP: results equal the brute-force dense reference."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from support.naive import close, naive_fov
from support.server_util import TINY_LAYERS, reference, wait_job


def test_submit_poll_success_equals_reference(server, site) -> None:
    with server.client() as client:
        r = client.post(
            "/v1/jobs",
            json={
                "network": "tiny",
                "input": "small.zarr",
                "output": "out/reflect.zarr",
                "chunks": [4, 4, 4],
                "block": [4, 8, 4],
            },
        )
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["status"] == "queued" and job["output"] == "out/reflect.zarr"
        done = wait_job(client, job["id"], ("succeeded",))
        assert done["progress"]["done"] == done["progress"]["total"] > 1  # several blocks
        assert done["progress"]["voxels_done"] == 14 * 13 * 11
        assert done["voxels_per_second"] > 0 and done["error"] is None
        assert done["report"]["blocks_computed"] == done["progress"]["total"]
        listed = client.get("/v1/jobs", params={"status": "succeeded"}).json()
        assert job["id"] in [j["id"] for j in listed["jobs"]]
        metrics = client.get("/metrics").text
    out = zarr.open_array(str(site["root"] / "out/reflect.zarr"), mode="r")[...]
    assert out.shape == (2, 14, 13, 11)
    ref = reference(site["small"], site["params"], "reflect")
    assert close(out, ref), float(np.max(np.abs(out - ref)))
    assert 'znni_jobs{status="succeeded"}' in metrics
    assert "znni_voxels_computed_total" in metrics


def test_zero_border_with_roi_equals_reference(server, site) -> None:
    roi = ((3, 12), (0, 9), (2, 11))
    with server.client() as client:
        r = client.post(
            "/v1/jobs",
            json={
                "network": "tiny",
                "input": "small.zarr",
                "output": "out/zero.zarr",
                "border": "zero",
                "roi": [list(a) for a in roi],
                "chunks": [3, 5, 4],
            },
        )
        assert r.status_code == 201, r.text
        wait_job(client, r.json()["id"], ("succeeded",))
    out = zarr.open_array(str(site["root"] / "out/zero.zarr"), mode="r")[...]
    got = out[:, roi[0][0] : roi[0][1], roi[1][0] : roi[1][1], roi[2][0] : roi[2][1]]
    ref = reference(site["small"], site["params"], "zero", roi)
    assert close(got, ref), float(np.max(np.abs(got - ref)))


def test_networks_and_health(read_server) -> None:
    with read_server.client() as client:
        nets = client.get("/v1/networks").json()["networks"]
        tiny = next(n for n in nets if n["name"] == "tiny")
        assert tiny["fov"] == list(naive_fov(TINY_LAYERS))
        assert tiny["in_channels"] == 2 and tiny["out_channels"] == 2
        assert "broken" not in [n["name"] for n in nets]  # unloadable specs are left out
        one = client.get("/v1/networks/tiny").json()
        assert one["digest"] == tiny["digest"] and len(one["layers"]) == len(TINY_LAYERS)
        health = client.get("/healthz").json()
        assert health == {"status": "ok", "workers_alive": 1, "workers": 1}


def test_plan_for_a_network(read_server) -> None:
    with read_server.client() as client:
        r = client.post("/v1/plan", json={"network": "tiny", "device": "cpu"})
        assert r.status_code == 200, r.text
        plan = r.json()["plan"]
        assert plan["algorithm"] == "cpu"
        fov = naive_fov(TINY_LAYERS)
        out = [n - f + 1 for n, f in zip(plan["input_size"], fov, strict=True)]
        assert out == list(plan["output_size"])  # docs/design.md: a patch of n gives n - fov + 1
        assert len(plan["primitives"]) == len(TINY_LAYERS)
        r = client.post(
            "/v1/plan", json={"network": "tiny", "memory_limit_bytes": 2**20, "device": "cpu"}
        )  # a job's patch pass gets PLAN_FRACTION of its memory limit
        assert r.status_code == 422 and "fits in 786,432 bytes" in r.json()["detail"]


def region_seconds_of(plan: dict, region: tuple[int, int, int]) -> float:
    """The region's time from the plan's fields: whole patches in whole batches, plus the
    first pass's pages (planner.search.region_voxels_per_second)."""
    from znni.planner.costs import FIRST_PASS_S_PER_PEAK_BYTE

    patches = 1
    for r, o in zip(region, plan["output_size"], strict=True):
        patches *= -(-r // o)
    batches = -(-patches // plan["batch"])
    return (batches * plan["predicted_patch_s"]
            + FIRST_PASS_S_PER_PEAK_BYTE * plan["peak_bytes"])


def test_plan_for_an_input_region(read_server, read_site) -> None:
    """POST /v1/plan with `input` (and `roi`) plans for that region, the input located as a
    job's is: a patch no larger than the region, the region's predicted time; an input
    outside the data root, a bad ROI, or a ROI without an input is a 422 sentence."""
    shape = zarr.open_array(str(read_site["root"] / "small.zarr"), mode="r").shape[-3:]
    with read_server.client() as client:
        whole = client.post("/v1/plan", json={"network": "tiny", "device": "cpu"}).json()["plan"]
        r = client.post("/v1/plan", json={"network": "tiny", "device": "cpu",
                                          "input": "small.zarr", "roi": [[0, 4], [1, 5], [None, None]]})
        assert r.status_code == 200, r.text
        plan = r.json()["plan"]
        assert plan["region"] == [4, 4, shape[2]] and "region" not in whole
        assert plan["predicted_seconds"] == pytest.approx(
            region_seconds_of(plan, (4, 4, shape[2])))
        assert all(o <= w for o, w in zip(plan["output_size"], whole["output_size"], strict=True))
        assert plan["output_size"] != whole["output_size"]
        # the whole run as `znni plan --input` predicts it (issue 39): its blocks and stages
        job = plan["job_seconds"]
        assert plan["predicted_job_seconds"] == pytest.approx(job["total_s"])
        assert job["total_s"] > job["patches_s"] > 0 and plan["block_edges"][0][0] == 0
        assert "predicted_job_seconds" not in whole
        flipped = client.post("/v1/plan", json={
            "network": "tiny", "device": "cpu", "input": "small.zarr", "tta": "flips",
            "roi": [[0, 4], [1, 5], [None, None]]}).json()["plan"]
        assert flipped["predicted_patch_s"] == pytest.approx(8 * plan["predicted_patch_s"])
        assert flipped["block_edges"] == plan["block_edges"]  # the same patches, 8 passes each
        assert flipped["job_seconds"]["patches_s"] == pytest.approx(8 * job["patches_s"])
        for body, words in (
            ({"input": "escape/secret.zarr"}, "outside the data root"),
            ({"chunks": [8, 8, 8]}, "need an input"),
            ({"input": "small.zarr", "precision": "bf16"}, "sequential networks are planned"),
            ({"tta": "mirror"}, "tta"),
            ({"input": "small.zarr", "roi": [[0, 999], [None, None], [None, None]]},
             "outside the volume"),
            ({"roi": [[0, 4], [None, None], [None, None]]}, "need an input"),
            ({"input": "nothing-here.zarr"}, "does not exist"),
        ):
            r = client.post("/v1/plan", json={"network": "tiny", "device": "cpu", **body})
            assert r.status_code == 422, (body, r.text)
            assert words in r.json()["detail"], (body, r.json())


def test_preview_of_a_finished_job_is_a_png(server, site) -> None:
    with server.client() as client:
        r = client.post("/v1/jobs", json={"network": "tiny", "input": "small.zarr",
                                          "output": "out/preview.zarr"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_job(client, job_id, ("succeeded",))
        png = client.get(f"/v1/jobs/{job_id}/preview.png", params={"axis": "y", "index": 6})
        assert png.status_code == 200, png.text
        assert png.headers["content-type"] == "image/png"
        assert png.content[:8] == b"\x89PNG\r\n\x1a\n" and len(png.content) > 1000
        bad = client.get(f"/v1/jobs/{job_id}/preview.png", params={"index": 99})
        assert bad.status_code == 422, bad.text
        assert bad.json()["detail"].startswith("z index 99 is outside the output's z range")
        missing = client.get("/v1/jobs/999999/preview.png")
        assert missing.status_code == 404
