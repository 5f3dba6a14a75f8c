"""Volumes on gs:// against a real GCS-API server (fake-gcs-server on 127.0.0.1):
OME-Zarr with a pyramid, the object ledger, Dask workers, and how gcsfs's errors are read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from store_runs import local_job, read_url, upload

from znni.engine.job import SegmentJob
from znni.engine.ledger import ObjectLedger, read_ledger
from znni.engine.segment import segment
from znni.engine.stores import is_transient, options_for, refusal, zarr_store


@pytest.fixture()
def case(tmp_path: Path) -> tuple[SegmentJob, np.ndarray]:
    """A local job (network, uint8 volume) and its local output."""
    return local_job(tmp_path, 22)


@pytest.mark.usefixtures("gcs_env")
def test_ome_zarr_output_with_pyramid_on_gs_equals_the_local_one(gcs, case, tmp_path) -> None:  # noqa: ANN001
    local, vol = case
    prefix = gcs.prefix()
    ome = {"output_format": "ome-zarr", "pyramid": 1}
    here = SegmentJob(**{**local.__dict__, **ome, "output_path": str(tmp_path / "img.ome.zarr")})
    there = SegmentJob(**{**local.__dict__, **ome, "input_path": upload(f"{prefix}/in", vol, 3),
                          "output_path": f"{prefix}/img.ome.zarr"})
    segment(here)
    report = segment(there)
    assert report.blocks_computed == report.blocks_total >= 8
    for level in ("0", "1"):
        expected = zarr.open_array(f"{here.output_path}/{level}")[...]
        assert np.array_equal(read_url(f"{there.output_path}/{level}"), expected)
    attrs = zarr.open_group(store=zarr_store(there.output_path, read_only=True), mode="r").attrs
    assert [d["path"] for d in attrs["ome"]["multiscales"][0]["datasets"]] == ["0", "1"]
    assert attrs["znni"]["input"] == f"{prefix}/in"
    assert read_ledger(there.output_path)[1] == read_ledger(here.output_path)[1]


@pytest.mark.usefixtures("gcs_env")
def test_object_ledger_start_forgets_earlier_runs(gcs) -> None:  # noqa: ANN001
    out = f"{gcs.prefix()}/out.zarr"
    ledger = ObjectLedger(out)
    ledger.start({"network": "a"}, (8, 8, 8))
    ledger.record(["0:8,0:8,0:8", "0:8,0:8,8:16"])
    ledger.record(["0:8,0:8,8:16"])  # recorded twice: still one block
    header, done = read_ledger(out)
    assert header is not None and header["block_shape"] == [8, 8, 8]
    assert done == {"0:8,0:8,0:8", "0:8,0:8,8:16"}
    again = ObjectLedger(out)
    again.start({"network": "b"}, (4, 4, 4))
    header, done = read_ledger(out)
    assert header is not None and header["parts"] == {"network": "b"} and done == set()
    assert len(gcs.keys_under(f"{out}/znni-ledger")) == 1  # stale block objects deleted


@pytest.mark.slow
@pytest.mark.usefixtures("gcs_env")
def test_dask_local_cluster_reads_and_writes_gs(gcs, case, monkeypatch) -> None:  # noqa: ANN001
    """Workers open the store themselves, with the job's --storage-option values (the
    endpoint is not in their environment)."""
    local, vol = case
    prefix = gcs.prefix()
    inp = upload(f"{prefix}/in.zarr", vol)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    job = SegmentJob(**{**local.__dict__, "input_path": inp, "output_path": f"{prefix}/dask.zarr",
                        "scheduler": "local:2", "storage_options": {"endpoint_url": gcs.endpoint}})
    report = segment(job)
    assert report.blocks_computed == report.blocks_total
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    assert np.array_equal(read_url(job.output_path), zarr.open_array(local.output_path)[...])
    assert len(read_ledger(job.output_path)[1]) == report.blocks_total


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
        text = str(refusal(e, "gs://b/in.zarr", "input"))
        assert "refused access" in text and "GOOGLE_APPLICATION_CREDENTIALS" in text
        assert "\n" not in text


def test_emulator_endpoints_default_to_anonymous_credentials(monkeypatch) -> None:  # noqa: ANN001
    """At an emulator (STORAGE_EMULATOR_HOST) gs:// is anonymous; at Google it is not."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert options_for("gs://b/x.zarr")["token"] == "anon"
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    assert options_for("gs://b/x.zarr") == {}
    from znni.engine.store_gcs import is_emulator

    assert not is_emulator({"endpoint_url": "https://storage.googleapis.com"})
    assert is_emulator({"endpoint_url": "http://127.0.0.1:4443"})
