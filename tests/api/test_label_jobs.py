"""`labels`, `mask` and `skip_empty` in job submissions, against the real server: the
labelled, masked output equals numpy's argmax of a plain job's output inside the mask and
0 outside, the report counts the skipped blocks, and bad values get a 422 whose `detail` is
one sentence, with nothing stored or written."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from support.server_util import refused_detail, wait_job

BLOCKS = {"chunks": [4, 4, 4], "block": [4, 4, 4]}  # small.zarr (14, 13, 11): 4*4*3 blocks


@pytest.fixture(scope="module")
def mask(site: dict) -> str:
    """A mask at small.zarr's own resolution (14, 13, 11), off for x >= 4."""
    m = np.ones((14, 13, 11), np.uint8)
    m[:, :, 4:] = 0
    zarr.create_array(str(site["root"] / "mask.zarr"), data=m, chunks=(7, 13, 11))
    return "mask.zarr"


def test_labels_and_mask_job_equals_the_plain_job(server, site: dict, mask: str) -> None:  # noqa: ANN001
    with server.client() as client:
        r = client.post("/v1/jobs", json={"network": "tiny", "input": "small.zarr",
                                          "output": "lab/plain.zarr", **BLOCKS})
        plain = wait_job(client, r.json()["id"], ("succeeded",))
        r = client.post("/v1/jobs", json={"network": "tiny", "input": "small.zarr",
                                          "output": "lab/argmax.zarr", "labels": "argmax",
                                          "mask": mask, "skip_empty": 0, **BLOCKS})
        assert r.status_code == 201, r.text
        job = wait_job(client, r.json()["id"], ("succeeded",))
    assert plain["report"]["blocks_skipped"] == 0
    assert job["parameters"]["labels"] == "argmax" and job["parameters"]["mask"] == mask
    assert job["report"]["blocks_skipped"] == 4 * 4 * 2  # x in [4, 11): wholly outside
    assert job["report"]["blocks_computed"] == 4 * 4
    floats = zarr.open_array(str(site["root"] / "lab/plain.zarr"), mode="r")[...]
    got = zarr.open_array(str(site["root"] / "lab/argmax.zarr"), mode="r")[...]
    assert got.shape == (1, 14, 13, 11) and got.dtype == np.uint8
    expect = np.argmax(floats, axis=0)
    expect[:, :, 4:] = 0
    np.testing.assert_array_equal(got[0], expect)


@pytest.mark.parametrize("changes, words", [
    ({"labels": "threshold:x"}, ("needs a number after threshold",)),
    ({"labels": "threshold:0.5:7"}, ("channel 7 is out of range",)),
    ({"labels": "argmax", "dtype": "uint8"}, ("dtype",)),
    ({"mask": "nothing.zarr"}, ("mask",)),
    ({"mask": "../outside/secret.zarr"}, ("mask",)),
    ({"mask": "escape/secret.zarr"}, ("mask",)),
])
def test_bad_label_and_mask_fields_are_refused(server, changes, words) -> None:  # noqa: ANN001
    body = {"network": "tiny", "input": "small.zarr", "output": "lab/never.zarr", **changes}
    with server.client() as client:
        refused_detail(client, body, words)
