"""Volumes in object stores: s3:// in and out against a real S3-API server (moto on
127.0.0.1), OME-Zarr on s3, a read-only http:// input, the object ledger, Dask workers."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume
from support.store_runs import (
    dask_reads_and_writes,
    ledger_start_forgets_earlier_runs,
    local_job,
    ome_pyramid_run,
    read_url,
    upload,
)

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.io.stores import (
    StoreError,
    is_transient,
    masked,
    parse_storage_options,
    retrying,
    zarr_store,
)
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment

CTX = StoreContext()  # store options (none) and caches for this module's calls

pytestmark = pytest.mark.usefixtures("s3_env")


@pytest.fixture()
def case(tmp_path: Path) -> tuple[SegmentJob, np.ndarray]:
    """A local job (network, uint8 volume) and its local output."""
    return local_job(tmp_path, 21)


def test_s3_in_and_out_equals_the_local_run_bit_for_bit(s3, case) -> None:  # noqa: ANN001
    local, vol = case
    prefix = s3.prefix()
    job = SegmentJob(**{**local.__dict__, "input_path": upload(f"{prefix}/in.zarr", vol),
                        "output_path": f"{prefix}/out.zarr"})
    report = segment(job)
    assert report.blocks_computed == report.blocks_total >= 8
    assert np.array_equal(read_url(job.output_path), zarr.open_array(str(local.output_path))[...])
    header, done = read_ledger(job.output_path, ctx=CTX)
    assert header is not None and len(done) == report.blocks_total
    run = header["run"]
    blocks = [k for k in s3.keys_under(f"{prefix}/out.zarr/znni-ledger") if f"/{run}/" in k]
    assert len(blocks) == report.blocks_total  # one object per finished block
    assert segment(job).blocks_computed == 0  # the ledger says everything is done
    prov = zarr.open_array(store=zarr_store(job.output_path, read_only=True, ctx=CTX),
                           mode="r").attrs["znni"]
    assert prov["input"] == f"{prefix}/in.zarr"


def test_ome_zarr_output_with_pyramid_on_s3_equals_the_local_one(s3, case, tmp_path) -> None:  # noqa: ANN001
    ome_pyramid_run(s3, *case, tmp_path)


@pytest.fixture()
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served read-only by http.server on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_read_only_http_input(case, http_root, tmp_path: Path) -> None:  # noqa: ANN001
    local, vol = case
    root, url = http_root
    write_volume(root / "em.zarr", vol, 3, (7, 7, 7))
    job = SegmentJob(**{**local.__dict__, "input_path": f"{url}/em.zarr",
                        "output_path": str(tmp_path / "from-http.zarr")})
    segment(job)
    assert np.array_equal(zarr.open_array(str(job.output_path))[...],
                          zarr.open_array(str(local.output_path))[...])
    with pytest.raises(ValueError, match="does not exist"):
        segment(SegmentJob(**{**job.__dict__, "input_path": f"{url}/missing.zarr"}))


def test_object_ledger_start_forgets_earlier_runs(s3) -> None:  # noqa: ANN001
    ledger_start_forgets_earlier_runs(s3)


def test_storage_options_parse_json_else_text() -> None:
    opts = parse_storage_options(["anon=true", "endpoint_url=http://127.0.0.1:5000",
                                  'client_kwargs={"region_name": "eu-west-1"}', "n=3"])
    assert opts == {"anon": True, "endpoint_url": "http://127.0.0.1:5000",
                    "client_kwargs": {"region_name": "eu-west-1"}, "n": 3}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_storage_options(["anon"])


def test_secret_option_values_are_masked_in_error_sentences() -> None:
    """A client may write a token into a URL of its error (gcsfs's tokeninfo check)."""
    opts = {"token": "ya29.abc/def", "secret": "s3cr3t", "endpoint_url": "http://127.0.0.1:9"}
    text = "GET /tokeninfo?access_token=ya29.abc%2Fdef failed; s3cr3t; at http://127.0.0.1:9"
    out = masked(text, opts)
    assert "ya29" not in out and "s3cr3t" not in out and "http://127.0.0.1:9" in out
    assert out.count("***") == 2
    nested = {"client_kwargs": {"aws_secret_access_key": "abc/xyz"}}
    assert masked("signed with abc/xyz", nested) == "signed with ***"


def test_transient_errors_are_retried_then_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("znni.engine.io.retry.BACKOFF_S", 0.0)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert retrying(flaky, Location.parse("s3://b/x")) == "ok" and len(calls) == 3
    assert not is_transient(PermissionError("denied"))

    def down() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(StoreError, match=r"s3://b/x did not answer after 5 tries"):
        retrying(down, Location.parse("s3://b/x"))
    calls.clear()

    def gcs_down() -> None:  # gcsfs has retried this request itself already
        calls.append(1)
        raise ConnectionRefusedError("refused")

    with pytest.raises(StoreError, match=r"gs://b/x did not answer after 1 try \("):
        retrying(gcs_down, Location.parse("gs://b/x"))
    assert len(calls) == 1
    monkeypatch.setenv("ZNNI_STORE_RETRIES", "3")
    with pytest.raises(StoreError, match=r"gs://b/x did not answer after 3 tries"):
        retrying(gcs_down, Location.parse("gs://b/x"))
    assert len(calls) == 4


@pytest.mark.slow
def test_dask_local_cluster_reads_and_writes_s3(s3, case, monkeypatch) -> None:  # noqa: ANN001
    """Workers open the store themselves, with the job's --storage-option values (the
    endpoint is not in their environment)."""
    dask_reads_and_writes(s3, *case, monkeypatch, "AWS_ENDPOINT_URL")


def test_s3_stores_skip_the_head_before_each_get() -> None:
    """s3fs HEADs every object before a whole-object GET unless max_concurrency is 1; znni
    sets 1 for s3:// by default, and a --storage-option still wins."""
    from znni.engine.context import StoreContext
    from znni.engine.io.stores import context_for, options_for

    plain = StoreContext()
    at = Location.parse
    assert options_for(at("s3://nobucket-defaults/x.zarr"), plain) == {"max_concurrency": 1}
    assert options_for(at("gs://b/x.zarr"), plain) == {}
    assert options_for(at("https://h/x.zarr"), plain) == {}
    given = context_for([at("s3://bucket-with-options/x")], {"max_concurrency": 4, "anon": True})
    assert options_for(at("s3://bucket-with-options/y"), given) == {"max_concurrency": 4,
                                                                    "anon": True}
    assert options_for(at("s3://other-bucket/y"), given) == {"max_concurrency": 1}  # per bucket
    assert options_for(at("s3://bucket-with-options/y"), plain) == {"max_concurrency": 1}
