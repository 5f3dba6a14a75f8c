"""Volumes on gs:// against a real GCS-API server (fake-gcs-server on 127.0.0.1):
OME-Zarr with a pyramid, the object ledger, Dask workers, and how gcsfs's errors are read."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.store_runs import (
    dask_reads_and_writes,
    ledger_start_forgets_earlier_runs,
    local_job,
    ome_pyramid_run,
)

from znni.engine.context import StoreContext
from znni.engine.io.stores import is_transient, options_for, refusal, zarr_store
from znni.engine.job import SegmentJob
from znni.engine.location import Location

CTX = StoreContext()  # store options (none) and caches for this module's calls


@pytest.fixture()
def case(tmp_path: Path) -> tuple[SegmentJob, np.ndarray]:
    """A local job (network, uint8 volume) and its local output."""
    return local_job(tmp_path, 22)


@pytest.mark.usefixtures("gcs_env")
def test_ome_zarr_output_with_pyramid_on_gs_equals_the_local_one(gcs, case, tmp_path) -> None:  # noqa: ANN001
    there, report = ome_pyramid_run(gcs, *case, tmp_path)
    assert report.blocks_computed == report.blocks_total >= 8
    attrs = zarr.open_group(store=zarr_store(there.output_path, read_only=True, ctx=CTX),
                            mode="r").attrs
    assert attrs["znni"]["input"] == str(there.input_path)


@pytest.mark.usefixtures("gcs_env")
def test_object_ledger_start_forgets_earlier_runs(gcs) -> None:  # noqa: ANN001
    ledger_start_forgets_earlier_runs(gcs)


@pytest.mark.slow
@pytest.mark.usefixtures("gcs_env")
def test_dask_local_cluster_reads_and_writes_gs(gcs, case, monkeypatch) -> None:  # noqa: ANN001
    """Workers open the store themselves, with the job's --storage-option values (the
    endpoint is not in their environment)."""
    dask_reads_and_writes(gcs, *case, monkeypatch, "STORAGE_EMULATOR_HOST")


def test_gcsfs_errors_are_classified() -> None:
    """gcsfs raises HttpError with the HTTP code for 5xx/429/401 and a plain OSError
    "Forbidden: ..." (two lines) for 403: retried, or refused in one sentence."""
    HttpError = pytest.importorskip("gcsfs.retry", reason="gs:// needs gcsfs").HttpError

    assert is_transient(HttpError({"code": 503, "message": "backend error"}))
    assert is_transient(HttpError({"code": 429, "message": "rate limit"}))
    assert not is_transient(HttpError({"code": 401, "message": "Invalid Credentials"}))
    forbidden = OSError("Forbidden: https://storage.googleapis.com/b/o\nno access")
    assert not is_transient(forbidden)
    for e in (forbidden, HttpError({"code": 401, "message": "Invalid Credentials"})):
        text = str(refusal(e, Location.parse("gs://b/in.zarr"), "input", ctx=CTX))
        assert "refused access" in text and "GOOGLE_APPLICATION_CREDENTIALS" in text
        assert "\n" not in text


def test_emulator_endpoints_default_to_anonymous_credentials(monkeypatch) -> None:  # noqa: ANN001
    """At an emulator (STORAGE_EMULATOR_HOST) gs:// is anonymous; at Google it is not."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert options_for(Location.parse("gs://b/x.zarr"), CTX)["token"] == "anon"
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    assert options_for(Location.parse("gs://b/x.zarr"), CTX) == {}
    from znni.engine.io.gcs import is_emulator

    assert not is_emulator({"endpoint_url": "https://storage.googleapis.com"})
    assert is_emulator({"endpoint_url": "http://127.0.0.1:4443"})


def test_gcs_request_tries_sets_how_often_gcsfs_tries_each_request(monkeypatch) -> None:  # noqa: ANN001
    """ZNNI_GCS_REQUEST_TRIES=2: a client at an endpoint answering 503 asks it twice, then
    raises the 503; unset, the client keeps gcsfs's own retrying request (6 tries)."""
    HttpError = pytest.importorskip("gcsfs.retry", reason="gs:// needs gcsfs").HttpError
    from gcsfs.core import GCSFileSystem

    from znni.engine.io.gcs import set_request_tries

    asked: list[str] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        fs = GCSFileSystem(endpoint_url=endpoint, token="anon", skip_instance_cache=True)
        monkeypatch.delenv("ZNNI_GCS_REQUEST_TRIES", raising=False)
        set_request_tries(fs)
        assert "_request" not in vars(fs)  # gcsfs's own
        monkeypatch.setenv("ZNNI_GCS_REQUEST_TRIES", "2")
        set_request_tries(fs)
        with pytest.raises(HttpError) as e:
            fs.cat_file("znni-test/x")
        assert e.value.code == 503 and len(asked) == 2
    finally:
        server.shutdown()
        server.server_close()


def test_emulator_restart_drops_an_upload_its_kill_cut_short(gcs) -> None:  # noqa: ANN001
    """The emulator keeps an object as a file plus an xattr; a SIGKILL between the two left
    a file that made every later listing of the bucket a 404 (read as "no such bucket"),
    which failed the gs:// tests after the restart test. The restart drops such files."""
    prefix = gcs.prefix()
    gcs.fs().pipe(f"{prefix.split('://')[1]}/whole", b"kept")
    cut = gcs.data_dir / "root" / prefix.split("://")[1] / "cut-short"
    cut.write_bytes(b"no metadata: the kill came before it")
    gcs.restart()
    assert gcs.keys_under(prefix) == [f"{prefix.split('/', 3)[3]}/whole"]
    assert not cut.exists()
