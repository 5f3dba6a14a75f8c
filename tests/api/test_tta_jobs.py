"""The job API's `tta` (test-time flips) on a live server: a job with flips equals the dense
reference flip-averaged and records them; a bad value gets a 422 whose `detail` is one
sentence in the API's words, and nothing is stored."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_padded
from support.naive import close, naive_border_pad, naive_fov
from support.server_util import TINY_INPUT, TINY_LAYERS, refused_detail, wait_job

OK = {"network": "tiny", "input": "small.zarr", "output": "out/tta.zarr"}


def _flip_averaged(params: dict, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The tiny network's dense output (support/engine_ref.py) flip-averaged over `axes`."""
    fov = naive_fov(TINY_LAYERS)
    lo = tuple((f - 1) // 2 for f in fov)
    hi = tuple(f - 1 - a for f, a in zip(fov, lo, strict=True))
    padded = naive_border_pad(x, lo, hi, "reflect").astype(np.float32)
    padded = padded * np.float32(TINY_INPUT["scale"]) + np.float32(TINY_INPUT["shift"])
    subsets = [c for k in range(len(axes) + 1) for c in itertools.combinations(axes, k)]
    total = 0
    for sub in subsets:
        ax = tuple(1 + a for a in sub)
        total = total + np.flip(dense_padded(TINY_LAYERS, params, np.flip(padded, ax).copy()), ax)
    return total / len(subsets)


def test_a_job_with_flips_equals_the_flip_averaged_reference(server, site) -> None:
    with server.client() as client:
        r = client.post("/v1/jobs", json={**OK, "tta": "flips:xz", "chunks": [8, 8, 8],
                                            "block": [8, 8, 8]})
        assert r.status_code == 201, r.text
        assert r.json()["parameters"]["tta"] == "flips:xz"
        done = wait_job(client, r.json()["id"], ("succeeded",))
    assert done["report"]["blocks_computed"] > 1
    out = zarr.open_array(str(site["root"] / "out/tta.zarr"), mode="r")
    assert out.attrs["znni"]["tta"] == "flips:zx"  # its recorded form
    x = zarr.open_array(str(site["root"] / "small.zarr"), mode="r")[...]
    assert close(out[...], _flip_averaged(site["params"], x, (0, 2)))
    assert not close(out[...], _flip_averaged(site["params"], x, ()))


@pytest.mark.parametrize("value, words", [
    ("mirror", ("tta",)), ("flips:q", ("tta",)), ("flips:zz", ("tta 'flips:zz' is not one of",)),
    ("", ("tta",)), (8, ("tta",)),
])
def test_a_bad_value_is_refused(server, value, words) -> None:
    with server.client() as client:
        detail = refused_detail(client, {**OK, "output": "out/never.zarr", "tta": value}, words)
    assert "--" not in detail  # the API's field names, not the CLI's flags
