"""`POST /v1/plan` with `workers`, `store_bandwidth`, `queue_wait` and `deadline` against
the real server (its `--machine` profile: nodes of it): the same cluster record as
`znni plan --workers --json`, and bad values refused with a 422 whose `detail` says why."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from znni.cli import main

BODY = {"network": "tiny", "device": "cpu", "input": "small.zarr", "chunks": [8, 8, 8]}


def test_cluster_record_as_the_cli_gives_it(read_server, read_site: dict) -> None:  # noqa: ANN001
    with read_server.client() as client:
        r = client.post("/v1/plan", json={**BODY, "workers": 3, "store_bandwidth": "5MB/s",
                                          "queue_wait": "2m"})
        d = client.post("/v1/plan", json={**BODY, "deadline": 3600})
        host = client.post("/v1/plan", json={**BODY, "workers": 2, "placement": "host"})
    assert r.status_code == d.status_code == host.status_code == 200, r.text + d.text
    cluster = r.json()["plan"]["cluster"]
    assert (cluster["workers"], cluster["placement"], cluster["machine"]) == (
        3, "nodes", "znni-paper")
    assert cluster["store_bandwidth_bytes_per_s"] == 5e6 and cluster["queue_wait_s"] == 120
    assert d.json()["plan"]["cluster"]["deadline_workers"] == 1
    assert host.json()["plan"]["cluster"]["placement"] == "host"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", str(read_site["models"] / "tiny.json"), "--device", "cpu",
                     "--machine", "znni-paper", "--input", str(read_site["root"] / "small.zarr"),
                     "--chunks", "8,8,8", "--workers", "3", "--store-bandwidth", "5MB/s",
                     "--queue-wait", "2m", "--json"]) == 0
    cli = json.loads(out.getvalue())["cluster"]
    # each process measures its own planner search (client_s): the rest is the same job
    assert cli["total_s"] - cli["client_s"] == pytest.approx(
        cluster["total_s"] - cluster["client_s"])
    assert {k: cli[k] for k in ("blocks", "read_bytes", "write_bytes", "bottleneck")} == {
        k: cluster[k] for k in ("blocks", "read_bytes", "write_bytes", "bottleneck")}


@pytest.mark.parametrize("changes, words", [
    ({"workers": 2, "store_bandwidth": "fast"}, "store bandwidth 'fast' is not a rate"),
    ({"workers": 2, "deadline": "soon"}, "deadline 'soon' is not a duration"),
    ({"store_bandwidth": "2GB/s"}, "store_bandwidth needs workers"),
    ({"workers": 2, "input": None, "chunks": None}, "need an input"),
    ({"workers": 0}, "workers"),
    ({"workers": 2, "placement": "moon"}, "placement"),
])
def test_bad_cluster_fields_are_refused(read_server, changes: dict, words: str) -> None:  # noqa: ANN001
    with read_server.client() as client:
        r = client.post("/v1/plan", json={**BODY, **changes})
    assert r.status_code == 422, r.text
    assert words in json.dumps(r.json()["detail"])
