"""OME-Zarr options in job submissions, against the real server: output_format and pyramid
write an OME-Zarr image whose level 0 equals a plain run, level picks a level of an OME
input, and bad values are refused (422 with one sentence) with nothing stored or written."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr
from ome_zarr.format import FormatV05
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader
from ome_zarr.writer import write_image
from support.naive import close
from support.server_util import reference, wait_job

CHUNKED = {"chunks": [4, 4, 4], "block": [4, 8, 4]}


@pytest.fixture(scope="module")
def ome_input(site: dict) -> dict:
    """A (c, z, y, x) OME-Zarr image written by ome-zarr-py: level 1 halves y and x."""
    x = np.random.default_rng(11).standard_normal((2, 14, 16, 12)).astype(np.float32)
    group = zarr.open_group(str(site["root"] / "img.ome.zarr"), mode="w", zarr_format=3)
    axes = [{"name": "c", "type": "channel"},
            *({"name": a, "type": "space", "unit": "nanometer"} for a in "zyx")]
    transforms = [[{"type": "scale", "scale": [1.0, 30.0, 4.0 * 2**k, 4.0 * 2**k]}]
                  for k in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coordinate_transformations is deprecated upstream
        write_image(x, group, fmt=FormatV05(), axes=axes, scale_factors=[{"y": 2, "x": 2}],
                    coordinate_transformations=transforms,
                    storage_options={"chunks": (2, 8, 8, 8)})
    level1 = np.asarray(zarr.open_group(str(site["root"] / "img.ome.zarr"), mode="r")["s1"])
    return {"level0": x, "level1": level1}


def submit(client, **body) -> dict:  # noqa: ANN001
    r = client.post("/v1/jobs", json={"network": "tiny", **body})
    assert r.status_code == 201, r.text
    return wait_job(client, r.json()["id"], ("succeeded",))


def test_ome_output_with_pyramid_equals_a_plain_run(server, site: dict) -> None:  # noqa: ANN001
    with server.client() as client:
        plain = submit(client, input="small.zarr", output="ome/plain.zarr", **CHUNKED)
        ome = submit(client, input="small.zarr", output="ome/out.ome.zarr",
                     output_format="ome-zarr", pyramid=1, **CHUNKED)
    assert plain["parameters"]["output_format"] is None
    assert ome["parameters"]["output_format"] == "ome-zarr" and ome["parameters"]["pyramid"] == 1
    root = site["root"] / "ome"
    group = zarr.open_group(str(root / "out.ome.zarr"), mode="r")
    datasets = group.attrs["ome"]["multiscales"][0]["datasets"]
    assert [d["path"] for d in datasets] == ["0", "1"]
    level0 = np.asarray(group["0"][...])
    np.testing.assert_array_equal(level0, zarr.open_array(str(root / "plain.zarr"), mode="r")[...])
    assert close(level0, reference(site["small"], site["params"], "reflect"))
    assert group["1"].shape == (2, 7, 7, 6)  # isotropic: z, y and x halve
    nodes = list(Reader(parse_url(str(root / "out.ome.zarr")))())  # ome-zarr-py reads it back
    assert len(nodes[0].data) == 2
    np.testing.assert_array_equal(np.asarray(nodes[0].data[0]), level0)


def test_level_of_an_ome_input(server, site: dict, ome_input: dict) -> None:  # noqa: ANN001
    with server.client() as client:
        job = submit(client, input="img.ome.zarr", output="ome/level1.zarr", level=1,
                     output_format="zarr", **CHUNKED)
    assert job["input"] == "img.ome.zarr/s1" and job["parameters"]["level"] == 1
    got = zarr.open_array(str(site["root"] / "ome/level1.zarr"), mode="r")
    assert got.shape == (2, 14, 8, 6)
    assert close(got[...], reference(ome_input["level1"], site["params"], "reflect"))
    assert got.attrs["znni"]["level"] == 1 and got.attrs["znni"]["voxel_size"] == [30.0, 8.0, 8.0]


BAD = [
    ({"pyramid": -1}, "pyramid"),
    ({"output_format": "n5"}, "output_format"),
    ({"output_format": "ome-zarr", "pyramid": 40}, "pyramid 40 asks for more levels"),
    ({"output_format": "zarr", "pyramid": 2}, "pyramid applies to OME-Zarr outputs"),
    ({"level": 1}, "level applies to OME-Zarr image groups, and input small.zarr is not one"),
    ({"input": "img.ome.zarr", "level": 2}, "img.ome.zarr has levels 0 to 1; there is no level 2"),
    ({"level": -1}, "level"),
    ({"level": True}, "level"),
]


@pytest.mark.parametrize(("fields", "words"), BAD)
def test_bad_ome_fields_are_refused_and_nothing_is_stored(
    server, site: dict, ome_input: dict, fields: dict, words: str  # noqa: ANN001
) -> None:
    out = site["root"] / "ome" / "refused.zarr"
    with server.client() as client:
        before = client.get("/v1/jobs").json()["total"]
        body = {"input": "small.zarr", "output": "ome/refused.zarr", **fields}
        r = client.post("/v1/jobs", json={"network": "tiny", **body})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert words in detail and str(site["root"]) not in detail, detail
        assert client.get("/v1/jobs").json()["total"] == before
    assert not out.exists()


def test_a_level_whose_metadata_leads_outside_the_root_is_refused(server, site: dict) -> None:  # noqa: ANN001
    """The image's own metadata names the level's array: it is confined like a path."""
    group = zarr.open_group(str(site["root"] / "sly.ome.zarr"), mode="w", zarr_format=3)
    axes = [{"name": "c", "type": "channel"},
            *({"name": a, "type": "space"} for a in "zyx")]
    scale = [{"type": "scale", "scale": [1.0, 1.0, 1.0, 1.0]}]
    group.attrs["ome"] = {"version": "0.5", "multiscales": [{"axes": axes, "datasets": [
        {"path": "s0", "coordinateTransformations": scale},
        {"path": "../../outside/secret.zarr", "coordinateTransformations": scale}]}]}
    with server.client() as client:
        r = client.post("/v1/jobs", json={"network": "tiny", "input": "sly.ome.zarr",
                                          "output": "ome/sly.zarr", "level": 1})
        assert r.status_code == 422, r.text
        assert "level 1 of input 'sly.ome.zarr' names an array outside" in r.json()["detail"]
        assert client.get("/v1/jobs", params={"status": "queued"}).json()["total"] == 0
    assert not (site["root"] / "ome" / "sly.zarr").exists()
