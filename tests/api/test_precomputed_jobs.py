"""Jobs on neuroglancer precomputed volumes, against the real server: `precomputed://PATH`
input and output are located as plain paths are (under the data root, or under an allowed
URL prefix), the output equals the Zarr job's, and a location out of the root or a '#'
scale is a 422 sentence with nothing stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from support.server_util import refused_detail, wait_job

ts = pytest.importorskip("tensorstore")


def _write_precomputed(path: Path, vol: np.ndarray) -> None:
    """`vol` (C, Z, Y, X) as a precomputed image written by TensorStore alone."""
    t = ts.open({
        "driver": "neuroglancer_precomputed",
        "kvstore": {"driver": "file", "path": str(path) + "/"},
        "multiscale_metadata": {"type": "image", "data_type": str(vol.dtype),
                                "num_channels": vol.shape[0]},
        "scale_metadata": {"size": list(vol.shape[:0:-1]), "resolution": [4.0, 4.0, 40.0],
                           "voxel_offset": [0, 0, 0], "chunk_size": [8, 8, 8],
                           "encoding": "raw"},
        "create": True, "open": True}).result()
    t[...] = vol.transpose()  # (C, Z, Y, X) -> (X, Y, Z, C)


def _read_precomputed(path: Path) -> np.ndarray:
    t = ts.open({"driver": "neuroglancer_precomputed",
                 "kvstore": {"driver": "file", "path": str(path) + "/"}}).result()
    return np.asarray(t.read().result()).transpose()  # (X, Y, Z, C) -> (C, Z, Y, X)


def test_precomputed_job_equals_the_zarr_job(server, site: dict) -> None:  # noqa: ANN001
    small = zarr.open_array(str(site["root"] / "small.zarr"), mode="r")[...]
    _write_precomputed(site["root"] / "small_pc", small)
    with server.client() as client:
        r = client.post("/v1/jobs", json={"network": "tiny", "input": "small.zarr",
                                          "output": "pc/plain.zarr"})
        wait_job(client, r.json()["id"], ("succeeded",))
        r = client.post("/v1/jobs", json={"network": "tiny", "input": "precomputed://small_pc",
                                          "output": "precomputed://pc/out"})
        assert r.status_code == 201, r.text
        job = wait_job(client, r.json()["id"], ("succeeded",))
    assert job["input"] == "precomputed://small_pc"  # shown relative to the data root
    plain = zarr.open_array(str(site["root"] / "pc/plain.zarr"), mode="r")[...]
    np.testing.assert_allclose(_read_precomputed(site["root"] / "pc/out"), plain, atol=1e-6)


@pytest.mark.parametrize("changes, words", [
    ({"input": "precomputed://../outside"}, ("input",)),
    ({"input": "precomputed://escape/secret.zarr"}, ("input",)),
    ({"input": "precomputed://small_pc#mip=1"}, ("level",)),
    ({"input": "precomputed://nothing_here"}, ("input",)),
    ({"output": "precomputed://s3://bucket/out"}, ("output",)),  # no allowed URL prefix
])
def test_bad_precomputed_locations_are_refused(server, changes, words) -> None:  # noqa: ANN001
    body = {"network": "tiny", "input": "small.zarr", "output": "pc/never", **changes}
    with server.client() as client:
        refused_detail(client, body, words)
