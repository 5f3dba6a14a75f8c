"""Server jobs on s3:// URLs: only under the operator's --allow-url prefixes (else 422, with
nothing stored), credentials from the server's environment, results equal the reference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import unquote

import numpy as np
import pytest
import zarr
from support.naive import close
from support.server_util import Server, reference, wait_job, write_models

from znni.engine.context import StoreContext
from znni.engine.io.stores import zarr_store
from znni.engine.location import Location

CTX = StoreContext()  # store options (none) and caches for this module's calls

ALLOWED = "s3://znni-test/allowed"


@pytest.fixture(scope="module")
def url_server(s3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: ANN001
    base = tmp_path_factory.mktemp("urls")
    root, models = base / "data", base / "models"
    root.mkdir()
    params = write_models(models)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3.env().items():
            mp.setenv(k, v)  # the server's environment: its only source of credentials
        x = np.random.default_rng(5).standard_normal((2, 14, 13, 11)).astype(np.float32)
        inp = f"{ALLOWED}/{s3.prefix().rsplit('/', 1)[1]}/in.zarr"
        arr = zarr.create_array(store=zarr_store(Location.parse(inp), read_only=False, ctx=CTX),
                                shape=x.shape, chunks=(2, 8, 8, 8), dtype="float32")
        arr[...] = x
        srv = Server(root, models, base / "jobs.sqlite",
                     extra=["--allow-url", ALLOWED, "--allow-url", "s3://znni-test/also",
                            "--machine", "znni-paper"]).start()
        try:
            yield {"server": srv, "input": inp, "x": x, "params": params, "root": root}
        finally:
            srv.stop()


def test_urls_outside_the_allowed_prefixes_are_refused(url_server: dict, s3) -> None:  # noqa: ANN001
    inp = url_server["input"]
    cases = [
        ("s3://znni-test/other/in.zarr", f"{ALLOWED}/x/out.zarr", "outside the URL prefixes"),
        (inp, "s3://znni-test/allowedx/out.zarr", "outside the URL prefixes"),
        (inp, f"{ALLOWED}/../secret/out.zarr", "'..'"),
        (inp, "ftp://znni-test/allowed/out.zarr", "not a path under the data root"),
    ]
    with url_server["server"].client() as client:
        for given_in, given_out, words in cases:
            r = client.post("/v1/jobs", json={"network": "tiny", "input": given_in,
                                              "output": given_out})
            assert r.status_code == 422, r.text
            assert words in r.json()["detail"], r.json()
        assert client.get("/v1/jobs").json()["total"] == 0  # nothing stored
    assert s3.keys_under(f"{ALLOWED}/x") == []


def test_a_job_under_an_allowed_prefix_runs_on_the_store(url_server: dict, s3) -> None:  # noqa: ANN001
    out = f"{ALLOWED}/{s3.prefix().rsplit('/', 1)[1]}/out.zarr"
    with url_server["server"].client() as client:
        r = client.post("/v1/jobs", json={"network": "tiny", "input": url_server["input"],
                                          "output": out, "chunks": [4, 4, 4],
                                          "block": [4, 8, 4]})
        assert r.status_code == 201, r.text
        assert r.json()["output"] == out
        state = json.loads(unquote(r.json()["viewer_url"].split("#!", 1)[1]))  # both are URLs
        assert [(x["type"], x["source"]) for x in state["layers"]] == [
            ("image", f"zarr://{url_server['input']}"), ("image", f"zarr://{out}")]
        done = wait_job(client, r.json()["id"], ("succeeded",))
        assert done["progress"]["done"] == done["progress"]["total"] > 1
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3.env().items():
            mp.setenv(k, v)
        got = zarr.open_array(store=zarr_store(Location.parse(out), read_only=True, ctx=CTX),
                              mode="r")[...]
    ref = reference(url_server["x"], url_server["params"], "reflect")
    assert close(got, ref), float(np.max(np.abs(got - ref)))


def test_allowed_prefixes_are_checked_at_startup() -> None:
    from znni.jobs.settings import Settings

    assert Settings(allow_url=["s3://b/p/"]).allow_url == ("s3://b/p",)
    with pytest.raises(ValueError, match="not an s3://"):
        Settings(allow_url=["file:///etc"])
