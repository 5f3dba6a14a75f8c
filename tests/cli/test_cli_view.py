"""`znni view`: the neuroglancer link decodes to the expected state (layer types, sources as
neuroglancer spells them, voxel sizes in metres, the output's centre); `--serve` serves the
volumes' real files on 127.0.0.1 with the CORS header for the neuroglancer origin only."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
import zarr
from support.store_runs import child_env

from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.io.precomputed import create_output
from znni.engine.io.stores import zarr_store
from znni.engine.location import Location
from znni.engine.output.viewer import NEUROGLANCER, job_viewer_url

CTX = StoreContext()
ORIGIN = "https://neuroglancer-demo.appspot.com"


def decode(url: str) -> dict[str, Any]:
    """The JSON state of a neuroglancer link, decoded independently of the code under test."""
    head, _, state = url.partition("#!")
    assert head == f"{NEUROGLANCER}/"
    return json.loads(unquote(state))


@pytest.fixture()
def volumes(tmp_path: Path) -> dict[str, str]:
    """A precomputed input (4 x 5 x 40 nm at offset 10, 20, 30) and a 2-channel float
    output of the same grid, and a one-channel uint32 segmentation."""
    inp = f"precomputed://{tmp_path / 'in.pc'}"
    arr = create_output(Location.parse(inp), (1, 8, 10, 12), "uint8", (8, 10, 12), (4.0, 5.0, 40.0),
                        (10, 20, 30), ctx=CTX)
    arr[(slice(None), slice(0, 8), slice(0, 10), slice(0, 12))] = np.ones((1, 8, 10, 12))
    out = f"precomputed://{tmp_path / 'out.pc'}"
    create_output(Location.parse(out), (2, 8, 10, 12), "float32", (4, 5, 6), (4.0, 5.0, 40.0), (10, 20, 30),
                  ctx=CTX)
    seg = f"precomputed://{tmp_path / 'seg.pc'}"
    create_output(Location.parse(seg), (1, 8, 10, 12), "uint32", (4, 5, 6), (4.0, 5.0, 40.0), (10, 20, 30),
                  ctx=CTX, volume_type="segmentation")
    return {"in": inp, "out": out, "seg": seg}


def test_link_for_local_precomputed_names_the_served_urls(volumes: dict, capsys) -> None:  # noqa: ANN001
    assert main(["view", volumes["out"], "--input", volumes["in"]]) == 0
    out, err = capsys.readouterr()
    assert decode(out.strip()) == {
        "layers": [
            {"type": "image", "source": "precomputed://http://127.0.0.1:9017/input",
             "name": "input"},
            {"type": "image", "source": "precomputed://http://127.0.0.1:9017/output",
             "name": "output"}],
        "layout": "4panel",
        "dimensions": {"x": [4e-9, "m"], "y": [5e-9, "m"], "z": [4e-8, "m"]},
        "position": [10 + 6.0, 20 + 5.0, 30 + 4.0],  # offset + size / 2, (x, y, z)
        "selectedLayer": {"layer": "output", "visible": True},
    }
    assert "--serve" in err and err.count("\n") == 1


def test_segmentation_output_is_a_segmentation_layer(volumes: dict, capsys) -> None:  # noqa: ANN001
    assert main(["view", volumes["seg"]]) == 0
    layers = decode(capsys.readouterr().out.strip())["layers"]
    assert layers == [{"type": "segmentation", "name": "output",
                       "source": "precomputed://http://127.0.0.1:9017/output"}]


def test_ome_zarr_labels_image_in_micrometres(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    axes = [{"name": "c", "type": "channel"}] + [
        {"name": a, "type": "space", "unit": "micrometer"} for a in "zyx"]
    ome = {"version": "0.5", "image-label": {}, "multiscales": [{"axes": axes, "datasets": [
        {"path": "0", "coordinateTransformations": [
            {"type": "scale", "scale": [1.0, 0.04, 0.008, 0.008]},
            {"type": "translation", "translation": [0.0, 0.4, 0.0, 0.0]}]}]}]}
    group = zarr.create_group(str(tmp_path / "labels.zarr"), zarr_format=3,
                              attributes={"ome": ome})
    group.create_array("0", shape=(1, 6, 8, 10), chunks=(1, 6, 8, 10), dtype="uint8")
    assert main(["view", str(tmp_path / "labels.zarr")]) == 0
    state = decode(capsys.readouterr().out.strip())
    assert state["layers"] == [{"type": "segmentation", "name": "output",
                                "source": "zarr3://http://127.0.0.1:9017/output"}]
    assert state["dimensions"] == {"x": [pytest.approx(8e-9), "m"],
                                   "y": [pytest.approx(8e-9), "m"],
                                   "z": [pytest.approx(4e-8), "m"]}
    assert state["position"] == pytest.approx([5.0, 4.0, 10.0 + 3.0])


def test_urls_are_given_to_neuroglancer_as_they_are(s3, s3_env, capsys) -> None:  # noqa: ANN001
    prefix = s3.prefix()
    out = f"precomputed://{prefix}/out.pc"
    create_output(Location.parse(out), (2, 4, 4, 4), "uint8", (4, 4, 4), (8.0, 8.0, 8.0),
                  (0, 0, 0), ctx=CTX)
    inp = Location.parse(f"{prefix}/in.zarr")
    zarr.create_array(store=zarr_store(inp, read_only=False, ctx=CTX),
                      shape=(4, 4, 4), dtype="uint8", zarr_format=3)
    assert main(["view", out, "--input", f"{prefix}/in.zarr"]) == 0
    result = capsys.readouterr()
    assert result.err == ""  # nothing local to serve
    state = decode(result.out.strip())
    assert [x["source"] for x in state["layers"]] == [f"zarr3://{prefix}/in.zarr", out]
    assert state["dimensions"]["x"] == [8e-9, "m"]


def test_job_links_only_where_both_paths_are_urls() -> None:
    at = Location.parse
    assert job_viewer_url(at("/data/in.zarr"), at("s3://b/out.zarr")) is None
    assert job_viewer_url(at("s3://b/in.zarr"), at("precomputed://gs://b/out")) is not None
    state = decode(job_viewer_url(at("https://h/in.zarr"), at("precomputed://s3://b/seg"),
                                  labels=True) or "")
    assert state["layers"] == [
        {"type": "image", "source": "zarr://https://h/in.zarr", "name": "input"},
        {"type": "segmentation", "source": "precomputed://s3://b/seg", "name": "output"}]
    assert "dimensions" not in state  # neuroglancer reads them from the sources


def test_serve_serves_files_read_only_with_cors_for_neuroglancer(volumes: dict,
                                                                 tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "znni.cli", "view", volumes["out"],
                             "--input", volumes["in"], "--serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout is not None
        state = decode(proc.stdout.readline().strip())
        source = state["layers"][1]["source"].removeprefix("precomputed://")
        where = urlsplit(source)
        assert where.hostname == "127.0.0.1" and where.path == "/output"

        def get(path: str, origin: str | None = None, method: str = "GET") -> Any:
            conn = http.client.HTTPConnection("127.0.0.1", where.port, timeout=30)
            conn.request(method, path, headers={"Origin": origin} if origin else {})
            r = conn.getresponse()
            return r.status, r.getheader("Access-Control-Allow-Origin"), r.read()

        info = (tmp_path / "out.pc" / "info").read_bytes()
        assert get("/output/info", ORIGIN) == (200, ORIGIN, info)
        assert get("/output/info", "https://evil.example") == (200, None, info)
        assert get("/output/info")[1] is None
        assert get("/input/info", ORIGIN)[:2] == (200, ORIGIN)
        assert get("/output/../in.pc/info")[0] == 404  # nothing outside the volumes
        assert get("/output/")[0] == 404  # no listings
        assert get("/other/info")[0] == 404
        assert get("/output/info", ORIGIN, "PUT")[0] == 501  # read-only
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_view_of_a_path_without_info_is_one_sentence(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["view", f"precomputed://{tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no info file" in err and "\n" not in err
