"""ONNX models in a live server's models directory: listed with their mode, run as jobs whose
output equals MONAI's sliding_window_inference, and every bad windowed or ONNX-only field
refused with a 422 before anything is stored or written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.naive import close
from support.server_util import wait_job

torch = pytest.importorskip("torch")
monai = pytest.importorskip("monai")
pytest.importorskip("onnxruntime")
from monai.inferers import sliding_window_inference  # noqa: E402

EXPORT_WINDOW = (16, 32, 32)
VOLUME = (19, 41, 36)


@pytest.fixture(scope="module")
def onnx_site(site: dict, onnx_models) -> dict:
    """The U-Net (windowed), a conv chain (exact) and a name defined twice, in the models dir;
    a single-channel uint8 volume under the data root."""
    models, root = site["models"], site["root"]
    assert onnx_models.window("basicunet") == EXPORT_WINDOW
    unet = onnx_models.module("basicunet")
    onnx_models.copy("basicunet", models / "unet.onnx")
    onnx_models.copy("chain", models / "chain.onnx")
    shutil.copy(models / "tiny.json", models / "dup.json")
    shutil.copy(models / "chain.onnx", models / "dup.onnx")
    vol = np.random.default_rng(5).integers(0, 256, size=VOLUME).astype(np.uint8)
    zarr.create_array(str(root / "em.zarr"), shape=VOLUME, chunks=(8, 16, 16), dtype="uint8")[
        ...
    ] = vol
    return {**site, "unet": unet, "em": vol}


def test_networks_list_onnx_models_with_their_mode(server, onnx_site) -> None:
    with server.client() as client:
        nets = {n["name"]: n for n in client.get("/v1/networks").json()["networks"]}
        one = client.get("/v1/networks/unet").json()
        dup = client.get("/v1/networks/dup")
    unet = nets["unet"]
    assert unet == one
    assert unet["mode"] == "windowed" and unet["size_factor"] == [16, 16, 16]
    assert unet["min_window"] == [16, 16, 16] and unet["fixed_window"] is None
    assert unet["in_channels"] == 1 and unet["out_channels"] == 2
    assert unet["context"] is None and "fov" not in unet and len(unet["digest"]) == 64
    chain = nets["chain"]
    assert chain["mode"] == "exact" and chain["fov"] == [3, 3, 3]
    assert [layer["kind"] for layer in chain["layers"]] == ["conv", "relu"]
    tiny = nets["tiny"]  # a JSON spec keeps every field it had, with mode "exact"
    assert set(tiny) == {
        "name", "mode", "in_channels", "out_channels", "fov", "pool_product", "layers", "digest"
    }
    assert tiny["mode"] == "exact" and tiny["pool_product"] == [2, 2, 1]
    assert "dup" not in nets and "broken" not in nets
    assert dup.status_code == 422
    assert "dup.json" in dup.json()["detail"] and "dup.onnx" in dup.json()["detail"]


def _monai(model: torch.nn.Module, vol: np.ndarray, window, overlap: float, blend: str):
    x = torch.from_numpy(vol[None, None].astype(np.float32) / 255)
    with torch.no_grad():
        out = sliding_window_inference(
            x, window, 3, model.eval(), overlap=overlap, mode=blend, sigma_scale=0.125
        )
    return out[0].numpy()


def test_windowed_job_equals_monai_sliding_window(server, onnx_site) -> None:
    body = {
        "network": "unet", "input": "em.zarr", "output": "out/unet.zarr", "chunks": [8, 16, 16],
        "block": [8, 32, 16],
        "window": [16, 32, 32], "overlap": 0.5, "blend": "constant", "scale": 1 / 255,
    }
    with server.client() as client:
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        params = r.json()["parameters"]
        assert params["window"] == [16, 32, 32] and params["blend"] == "constant"
        assert params["scale"] == 1 / 255 and params["output_name"] is None
        done = wait_job(client, r.json()["id"], ("succeeded",), timeout_s=300)
    # no planner's plan: the run's summary is stored when the run has made it, with its
    # whole-run prediction, where the job's ETA starts (issue 39)
    assert done["plan"]["mode"] == "windowed" and done["plan"]["window"] == [16, 32, 32]
    assert done["predicted_s"] > 0
    assert done["predicted_s"] == pytest.approx(done["plan"]["job_seconds"]["total_s"])
    ran = done["report"]["plan"]
    assert ran["mode"] == "windowed" and ran["window"] == [16, 32, 32] and ran["overlap"] == 0.5
    assert done["progress"]["done"] == done["progress"]["total"] > 1
    got = zarr.open_array(str(onnx_site["root"] / "out/unet.zarr"), mode="r")[...]
    ref = _monai(onnx_site["unet"], onnx_site["em"], (16, 32, 32), 0.5, "constant")
    assert close(got, ref), float(np.max(np.abs(got - ref)))


def test_exact_onnx_chain_runs_with_scale(server, onnx_site) -> None:
    body = {"network": "chain", "input": "em.zarr", "output": "out/chain.zarr", "scale": 0.5}
    with server.client() as client:
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        done = wait_job(client, r.json()["id"], ("succeeded",))
    assert done["plan"]["algorithm"] and done["report"]["blocks_computed"] >= 1
    assert done["predicted_s"] > 0
    assert done["predicted_s"] == pytest.approx(done["plan"]["job_seconds"]["total_s"])


UNET = {"network": "unet", "input": "em.zarr", "output": "out/never.zarr"}
TINY = {"network": "tiny", "input": "small.zarr", "output": "out/never.zarr"}

BAD: list[tuple[str, dict, tuple[str, ...]]] = [
    ("window off the grid", {**UNET, "window": [16, 32, 30]}, ("window", "(16, 16, 16)")),
    ("window below the minimum", {**UNET, "window": [8, 16, 16]}, ("window", "(16, 16, 16)")),
    ("window on an exact network", {**TINY, "window": [8, 8, 8]}, ("window", "exact mode")),
    ("overlap on an exact network", {**TINY, "overlap": 0.5}, ("overlap", "exact mode")),
    ("overlap of 1", {**UNET, "overlap": 1.0}, ("overlap",)),
    ("negative overlap", {**UNET, "overlap": -0.1}, ("overlap",)),
    ("unknown blend", {**UNET, "blend": "median"}, ("blend",)),
    ("scale on a JSON spec", {**TINY, "scale": 2.0}, ("scale", "ONNX models only")),
    ("shift on a JSON spec", {**TINY, "shift": 1.0}, ("shift", "ONNX models only")),
    ("output_name on a JSON spec", {**TINY, "output_name": "y"}, ("output_name", "ONNX")),
    ("unknown ONNX output", {**UNET, "output_name": "nope"}, ("no output 'nope'",)),
    ("wrong channel count", {**UNET, "input": "small.zarr"}, ("channel",)),
    (
        "window beyond the memory budget",
        {**UNET, "window": [512, 512, 512], "memory_limit_bytes": 2**26},
        ("window", "budget"),
    ),
    ("name defined twice", {**UNET, "network": "dup"}, ("dup.json", "dup.onnx")),
]


def _listing(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize("body, words", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_windowed_fields_are_refused(server, onnx_site, body, words) -> None:
    root = onnx_site["root"]
    before = _listing(root)
    with server.client() as client:
        total = client.get("/v1/jobs").json()["total"]
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "--" not in detail  # API fields, not CLI flags
        for word in words:
            assert word.lower() in detail.lower(), f"{detail!r} lacks {word!r}"
        assert client.get("/v1/jobs").json()["total"] == total  # nothing stored
    assert _listing(root) == before  # nothing written


def test_plan_for_a_windowed_model(server, onnx_site) -> None:
    with server.client() as client:
        r = client.post("/v1/plan", json={"network": "unet", "memory_limit_bytes": 2**30})
        assert r.status_code == 200, r.text
        plan = r.json()["plan"]
        exact = client.post("/v1/plan", json={"network": "tiny", "device": "cpu"}).json()["plan"]
        r = client.post("/v1/plan", json={"network": "unet", "memory_limit_bytes": 2**30,
                                          "input": "em.zarr", "overlap": 0.5,
                                          "roi": [[0, 16], [None, None], [None, None]]})
        assert r.status_code == 200, r.text
        em = r.json()["plan"]
    assert em["region"] == [16, *VOLUME[1:]] and em["region_given"] and em["overlap"] == 0.5
    assert not plan["region_given"] and plan["region"] == [512, 512, 512]
    assert em["passes"] >= 1 and all(w % 16 == 0 for w in em["window"])
    job = em["job_seconds"]  # the region's windows, plus start-up and unhidden reads/writes
    assert job["windows_s"] == pytest.approx(em["predicted_seconds"])
    assert em["predicted_job_seconds"] == pytest.approx(
        job["startup_s"] + job["windows_s"] + job["io_s"])
    assert "predicted_job_seconds" not in plan  # no input: no region's run to predict
    assert em["window"][0] == 16 and em["window"] != plan["window"]  # chosen for 16x41x36
    with server.client() as client:
        given = client.post("/v1/plan", json={"network": "unet", "input": "em.zarr",
                                              "window": [16, 32, 32]}).json()["plan"]
        off = client.post("/v1/plan", json={"network": "unet", "window": [16, 30, 32]})
        seq = client.post("/v1/plan", json={"network": "tiny", "window": [16, 32, 32]})
    assert given["window"] == [16, 32, 32] and given["window_given"] and not em["window_given"]
    assert off.status_code == 422 and "grid" in off.json()["detail"]
    assert seq.status_code == 422 and "ONNX graph models" in seq.json()["detail"]
    assert plan["mode"] == "windowed" and plan["size_factor"] == [16, 16, 16]
    assert all(w % 16 == 0 and w >= 16 for w in plan["window"])
    assert 0 < plan["window_peak_bytes"] <= plan["memory_budget_bytes"] < 2**30
    assert "normalises" in plan["reason"] or "pads" in plan["reason"]
    assert exact["mode"] == "exact" and exact["algorithm"] == "cpu"
    json.dumps(plan)


def test_plan_for_a_graph_model_is_for_the_device_asked(server, onnx_site) -> None:
    """A graph model's plan is for where its job would run (as `znni plan --machine`): the
    server's profile (znni-paper) has a GPU, so gpu and auto plan the GPU, cpu the CPU."""
    from znni.planner.machine import MachineProfile

    assert MachineProfile.load("znni-paper").gpu is not None
    got = {}
    with server.client() as client:
        for device in ("cpu", "gpu", "auto"):
            r = client.post("/v1/plan", json={"network": "unet", "device": device,
                                              "input": "em.zarr"})
            assert r.status_code == 200, r.text
            got[device] = r.json()["plan"]
    assert [got[d]["device"] for d in ("cpu", "gpu", "auto")] == ["cpu", "gpu", "gpu"]
    assert "device_cap_bytes" in got["gpu"] and "device_cap_bytes" not in got["cpu"]
