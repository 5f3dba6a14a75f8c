"""The job API's `precision`: a name it does not know, or a reduced precision off the GPU,
gets a 422 whose `detail` is one sentence in the API's words; nothing is stored."""

from __future__ import annotations

import pytest

OK = {"network": "tiny", "input": "small.zarr", "output": "new.zarr"}


@pytest.mark.parametrize("changes, words", [
    ({"precision": "fp64"}, ("precision",)),
    ({"precision": "fp16", "device": "cpu"}, ("precision fp16 needs device gpu",)),
    ({"precision": "bf16", "device": "cpu"}, ("precision bf16 applies to ONNX graph models",)),
    ({"precision": "fp16"}, ("precision fp16 needs device gpu",)),  # device auto
])
def test_a_bad_precision_is_refused(server, changes, words) -> None:
    with server.client() as client:
        before = client.get("/v1/jobs").json()["total"]
        r = client.post("/v1/jobs", json={**OK, **changes})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert isinstance(detail, str) and all(w in detail for w in words), detail
        assert "--" not in detail  # the API's field names, not the CLI's flags
        assert client.get("/v1/jobs").json()["total"] == before
