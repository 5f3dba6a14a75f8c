"""`znni segment` with precomputed:// volumes written by TensorStore, locally and on the local
S3 server (moto): the output equals the Zarr run's, a run killed with SIGKILL resumes without
recomputing a finished block, and bad input is one sentence, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from support.engine_ref import slow_network, write_network, write_volume
from support.precomputed_util import kvstore
from support.store_runs import (
    BLOCK,
    SHAPE,
    TOTAL,
    WAIT_S,
    child_env,
    kill_after_blocks,
    refused,
    segment_cmd,
    traced,
)

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.network import load_network
from znni.primitives.backends import make_backend

ts = pytest.importorskip("tensorstore")

CTX = StoreContext()
RES, OFFSET = [8.0, 8.0, 33.0], [64, 0, 7]  # (x, y, z)


def write_precomputed(kv: dict[str, Any], vol: np.ndarray) -> None:
    """`vol` (z, y, x) as a one-channel precomputed image at RES and OFFSET, by TensorStore."""
    t = ts.open({"driver": "neuroglancer_precomputed", "kvstore": kv,
                 "multiscale_metadata": {"type": "image", "data_type": "uint8",
                                         "num_channels": 1},
                 "scale_metadata": {"size": list(vol.shape[::-1]), "resolution": RES,
                                    "voxel_offset": OFFSET, "chunk_size": [16, 16, 16],
                                    "encoding": "raw"},
                 "create": True}).result()
    t[ts.d[:].translate_to[0]][...] = vol.transpose()[..., None]  # (z, y, x) -> (x, y, z, c)


def read_back(kv: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """((C, Z, Y, X) values, scale 0 of the info) of a precomputed output, by TensorStore."""
    t = ts.open({"driver": "neuroglancer_precomputed", "kvstore": kv}).result()
    info = json.loads(bytes(ts.KvStore.open(kv).result().read("info").result().value))
    return np.asarray(t.read().result()).transpose(), info  # (X, Y, Z, C) -> (C, Z, Y, X)


def make_case(tmp_path: Path, seed: int) -> dict[str, Any]:
    """The slow network, a (z, y, x) uint8 volume and its local Zarr run's output."""
    rng = np.random.default_rng(seed)
    spec = write_network(tmp_path, *slow_network(rng), scale=1 / 255)
    vol = rng.integers(0, 256, size=SHAPE).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (16, 16, 16))
    segment(SegmentJob(network=load_network(spec), input_path=inp,
                       output_path=str(tmp_path / "local.zarr"), chunks=BLOCK, block=BLOCK),
            backend=make_backend("reference"))  # as the runs under test (ZNNI_BACKEND)
    return {"spec": spec, "vol": vol, "expected": zarr.open_array(tmp_path / "local.zarr")[...]}


def kill_then_resume(spec: Path, inp: str, out: str, env: dict[str, str],
                     tmp_path: Path) -> None:
    """SIGKILL a run after a third of its blocks; the rerun computes exactly the rest."""
    trace1, trace2 = tmp_path / "trace1", tmp_path / "trace2"
    cmd = segment_cmd(spec, inp, out)
    kill_after_blocks(subprocess.Popen(cmd, env={**env, "ZNNI_ENGINE_TRACE": str(trace1)}),
                      out, TOTAL // 3)
    _, before = read_ledger(Location.parse(out), ctx=CTX)
    assert TOTAL // 3 <= len(before) < TOTAL and before <= set(traced(trace1))
    run = subprocess.run(cmd, env={**env, "ZNNI_ENGINE_TRACE": str(trace2)}, timeout=WAIT_S)
    assert run.returncode == 0
    again = traced(trace2)
    assert not set(again) & before  # no finished block computed twice
    assert len(again) == len(set(again)) == TOTAL - len(before)
    assert len(read_ledger(Location.parse(out), ctx=CTX)[1]) == TOTAL


@pytest.mark.slow
def test_local_precomputed_killed_then_resumed_equals_the_zarr_run(tmp_path: Path) -> None:
    case = make_case(tmp_path, 5)
    write_precomputed(kvstore(str(tmp_path / "in.pc")), case["vol"])
    out = tmp_path / "out.pc"
    kill_then_resume(case["spec"], f"precomputed://{tmp_path / 'in.pc'}",
                     f"precomputed://{out}", child_env(ZNNI_BACKEND="reference"), tmp_path)
    got, info = read_back(kvstore(str(out)))
    assert np.array_equal(got, case["expected"])
    scale = info["scales"][0]
    assert (scale["resolution"], scale["voxel_offset"]) == (RES, OFFSET)
    assert scale["chunk_sizes"] == [list(BLOCK[::-1])] and info["num_channels"] == 2


@pytest.mark.slow
def test_s3_precomputed_killed_then_resumed_equals_the_zarr_run(
        s3, s3_env, tmp_path: Path) -> None:  # noqa: ANN001
    case = make_case(tmp_path, 6)
    prefix = s3.prefix()
    inp, out = f"{prefix}/in.pc", f"{prefix}/out.pc"
    write_precomputed(kvstore(inp, s3.endpoint), case["vol"])
    env = child_env(**s3.env(), ZNNI_BACKEND="reference")
    refused(segment_cmd(case["spec"], f"precomputed://{prefix}/none.pc", f"precomputed://{out}"),
            env, "has no info file")
    assert s3.keys_under(out) == []
    kill_then_resume(case["spec"], f"precomputed://{inp}", f"precomputed://{out}", env, tmp_path)
    got, info = read_back(kvstore(out, s3.endpoint))
    assert np.array_equal(got, case["expected"])
    assert (info["scales"][0]["resolution"], info["scales"][0]["voxel_offset"]) == (RES, OFFSET)
    keys = s3.keys_under(out)
    assert f"{out[len('s3://znni-test/'):]}/znni-ledger/header.json" in keys  # beside info


def test_bad_precomputed_input_is_one_sentence_and_writes_nothing(tmp_path: Path) -> None:
    from support.engine_ref import small_network, write_network

    spec = write_network(tmp_path, *small_network(np.random.default_rng(1)), scale=1 / 255)
    env = child_env(ZNNI_BACKEND="reference")
    (tmp_path / "noinfo").mkdir()
    vol = np.random.default_rng(2).integers(0, 256, size=(12, 14, 16)).astype(np.uint8)
    write_precomputed(kvstore(str(tmp_path / "in.pc")), vol)
    inp, out = f"precomputed://{tmp_path / 'in.pc'}", tmp_path / "out.pc"
    refused(segment_cmd(spec, f"precomputed://{tmp_path / 'noinfo'}", f"precomputed://{out}"),
            env, "has no info file")
    refused(segment_cmd(spec, inp, f"precomputed://{out}", "--mip", "3"), env, "no scale 3",
            "it has 1")
    refused(segment_cmd(spec, "precomputed://http://127.0.0.1:9/vol", f"precomputed://{out}"),
            env, "could not be read")
    assert not out.exists()
    other = tmp_path / "other.pc"  # an output of 3 channels cannot take this 2-channel job
    ts.open({"driver": "neuroglancer_precomputed", "kvstore": kvstore(str(other)),
             "multiscale_metadata": {"type": "image", "data_type": "float32",
                                     "num_channels": 3},
             "scale_metadata": {"size": [16, 14, 12], "resolution": RES, "chunk_size": [8] * 3,
                                "encoding": "raw"}, "create": True}).result()
    before = sorted(p.name for p in other.rglob("*"))
    refused(segment_cmd(spec, inp, f"precomputed://{other}"), env, "conflicts with this job",
            "num_channels 3 (expected 2)")
    assert sorted(p.name for p in other.rglob("*")) == before
    assert not list(tmp_path.glob("*znni-lock"))  # refused before the lock is taken


def test_gs_precomputed_at_the_emulator_equals_the_zarr_run(
        gcs, gcs_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    # TensorStore's gcs kvstore takes an emulator from TENSORSTORE_GCS_HTTP_URL, not from
    # STORAGE_EMULATOR_HOST (which gcsfs, for the ledger and lease, reads)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", gcs.endpoint)
    case = make_case(tmp_path, 7)
    prefix = gcs.prefix()
    bucket, key = prefix[5:].split("/", 1)
    kv = {"driver": "gcs", "bucket": bucket}
    write_precomputed({**kv, "path": f"{key}/in.pc/"}, case["vol"])
    run = subprocess.run(segment_cmd(case["spec"], f"precomputed://{prefix}/in.pc",
                                     f"precomputed://{prefix}/out.pc"),
                         env=child_env(ZNNI_BACKEND="reference"), timeout=WAIT_S)
    assert run.returncode == 0
    got, info = read_back({**kv, "path": f"{key}/out.pc/"})
    assert np.array_equal(got, case["expected"])
    assert (info["scales"][0]["resolution"], info["scales"][0]["voxel_offset"]) == (RES, OFFSET)
    assert any(n.endswith("znni-ledger") for n in gcs.fs().ls(f"{prefix}/out.pc"))
