"""The job API's `precision` int8 and auto and `max_error` on a live server (issue 53): a
measured error above max_error is a 422 whose `detail` is one sentence in the API's words,
nothing stored or written; a job within it runs and its plan and report show the error;
POST /v1/plan says when the error is measured."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from support.server_util import wait_job

pytest.importorskip("torch")
pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.fixture(scope="module")
def int8_site(site: dict, onnx_models) -> dict:
    onnx_models.copy("basicunet", site["models"] / "unet.onnx")
    vol = np.random.default_rng(7).integers(0, 256, size=(32, 48, 40)).astype(np.uint8)
    zarr.create_array(str(site["root"] / "em.zarr"), shape=vol.shape, chunks=(16, 16, 16),
                      dtype="uint8")[...] = vol
    return site


JOB = {"network": "unet", "input": "em.zarr", "window": [16, 32, 32], "scale": 1 / 255,
       "precision": "int8"}


def test_an_error_above_max_error_is_a_422_and_nothing_is_stored(server, int8_site) -> None:
    with server.client() as client:
        before = client.get("/v1/jobs").json()["total"]
        r = client.post("/v1/jobs", json={**JOB, "output": "out/refused.zarr", "max_error": 0})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "int8's largest error is" in detail and "above max_error 0" in detail, detail
        assert "--" not in detail and "\n" not in detail
        assert client.get("/v1/jobs").json()["total"] == before
        bad = client.post("/v1/jobs", json={**JOB, "output": "out/x.zarr", "max_error": -1})
        assert bad.status_code == 422
    assert not (int8_site["root"] / "out" / "refused.zarr").exists()


def test_an_int8_job_runs_and_shows_its_error(server, int8_site) -> None:
    with server.client() as client:
        r = client.post("/v1/jobs", json={**JOB, "output": "out/int8.zarr", "max_error": 1})
        assert r.status_code == 201, r.text
        assert r.json()["parameters"]["max_error"] == 1
        done = wait_job(client, r.json()["id"], ("succeeded",), timeout_s=300)
        plan = client.post("/v1/plan", json={"network": "unet", "window": [16, 32, 32],
                                              "precision": "int8"}).json()["plan"]
    int8 = done["plan"]["int8"]
    assert done["plan"]["precision"] == "int8" and int8["held_out_windows"] >= 1
    assert 0 <= int8["mean_error"] <= int8["max_error"] <= 1 and int8["cached"]  # checked
    # at submission, found in the cache by the worker
    assert done["report"]["plan"]["int8"]["digest"] == int8["digest"]
    record = zarr.open_array(str(int8_site["root"] / "out" / "int8.zarr"), mode="r").attrs
    assert record["znni"]["int8"]["digest"] == int8["digest"]
    assert plan["precision"] == "int8" and "when a job is submitted" in plan["precision_note"]
