"""bioimage.io packages in the models directory: NAME.zip and NAME/ folders are listed with
their name, description, citations and channel names, by the catalogue and by a real
`znni serve`; ONNX-only options are refused for them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from support import bioimage_packages as bp
from support.server_util import Server, wait_job

from znni.jobs.catalogue import ModelOptions, NetworkCatalogue, describe

pytest.importorskip("torch")
pytest.importorskip("bioimageio.spec")

POST = [{"id": "sigmoid"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pkg-models")
    onnx = bp.export_onnx(tmp / "tiny.onnx")
    models = tmp / "models"
    models.mkdir()
    bp.build(models / "folder-pkg", onnx, [], POST)
    zipped = bp.build(tmp / "zip-pkg", onnx, [], POST, pack="zip")
    shutil.copyfile(zipped, models / "zipped.zip")
    (models / "not-a-package").mkdir()  # a folder without rdf.yaml is not listed
    return models


def test_catalogue_lists_and_describes_packages(models: Path) -> None:
    cat = NetworkCatalogue(models)
    assert cat.names() == ["folder-pkg", "zipped"]
    for name in cat.names():
        info = describe(name, cat.get(name))
        assert info["mode"] == "windowed" and info["out_channels"] == 2
        assert info["package"]["name"] == "tiny-unet"
        assert info["package"]["description"] == "A tiny 3D U-Net for tests"
        assert info["package"]["cite"][0]["doi"] == "10.1007/978-3-319-24574-4_28"
        assert info["package"]["channel_names"] == ["fg", "boundary"]
    with pytest.raises(ValueError, match="scale apply to bare ONNX models only"):
        cat.get("zipped", ModelOptions(scale=2.0))
    assert NetworkCatalogue(models / "missing").names() == []  # no folder: nothing listed


def test_server_lists_and_runs_packages(models: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    vol = np.random.default_rng(9).integers(0, 256, (2, 12, 20, 18)).astype(np.uint8)
    zarr.create_array(str(root / "em.zarr"), shape=vol.shape, chunks=(1, 8, 16, 16),
                      dtype="uint8")[...] = vol
    server = Server(root, models, tmp_path / "jobs.db").start()
    body = {"network": "zipped", "input": "em.zarr", "output": "out.zarr",
            "window": [12, 16, 16], "overlap": 0.5}
    try:
        with server.client() as client:
            listed = client.get("/v1/networks").json()["networks"]
            one = client.get("/v1/networks/zipped").json()
            r = client.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            wait_job(client, r.json()["id"], ("succeeded",), timeout_s=300)
            scaled = client.post("/v1/jobs", json={**body, "output": "o2.zarr", "scale": 2.0})
    finally:
        server.stop()
    assert sorted(n["name"] for n in listed) == ["folder-pkg", "zipped"]
    assert one["package"]["cite"][0]["text"] == "Ronneberger et al. 2015"
    assert one["package"]["channel_names"] == ["fg", "boundary"]
    got = zarr.open_array(str(root / "out.zarr"), mode="r")[...]
    ref = bp.windowed_reference(models.parent / "tiny.onnx", vol, [], POST, (12, 16, 16), 0.5)
    assert np.abs(got - ref).max() <= 1e-4
    assert scaled.status_code == 422 and "bioimage.io package" in scaled.json()["detail"]
    assert not (root / "o2.zarr").exists()
