"""Agglomeration through the job server, against the real server and the engine: a job on
existing affinities (`POST /v1/agglomerate`) and a segment job's agglomeration stage write
what `agglomerate()` called directly writes; each stage reports its blocks and ETA; a
cancelled job resumes; bad requests get a 422 of one sentence with nothing stored or
written."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.agglomerate_ref import smooth_affinities
from support.server_util import (
    TINY_IN_CHANNELS,
    TINY_INPUT,
    TINY_LAYERS,
    Server,
    tiny_params,
    wait_job,
)

from znni.engine.agglomerate.job import AgglomerateJob
from znni.engine.agglomerate.run import agglomerate
from znni.engine.location import Location

AFFS = "agg/affs.zarr"  # (3, 32, 32, 32) float32 in (3, 16, 16, 16) chunks
LONG = "agg/long.zarr"  # (3, 16, 32, 32): 256 blocks of 4^3 a stage, time to cancel
AGG_STAGES = ["fragments", "faces", "agglomerate"]
# a tiny network writing 3 channels in (0, 1): affinities
AFFS_NET = [*TINY_LAYERS[:3], {"kind": "conv", "out_channels": 3, "kernel": [2, 2, 3]},
            {"kind": "sigmoid"}]


def _write_affinities(path: Path, shape: tuple[int, int, int], seed: int) -> None:
    array = zarr.create_array(str(path), shape=(3, *shape), chunks=(3, 16, 16, 16),
                              dtype="float32")
    array[...] = smooth_affinities(shape, seed)


@pytest.fixture(scope="module")
def volumes(site: dict) -> dict:
    """Affinities, two-channel "affinities", and a network that writes affinities."""
    root = site["root"]
    _write_affinities(root / AFFS, (32, 32, 32), 0)
    _write_affinities(root / LONG, (16, 32, 32), 1)
    two = zarr.create_array(str(root / "agg/two.zarr"), shape=(2, 16, 16, 16),
                            chunks=(2, 16, 16, 16), dtype="float32")
    two[...] = 0.5
    params = tiny_params(3)
    rng = np.random.default_rng(4)
    params["3.weight"] = (rng.standard_normal((3, 3, 2, 2, 3)) / 3).astype(np.float32)
    params["3.bias"] = np.zeros(3, np.float32)
    spec = {"name": "affs3", "in_channels": TINY_IN_CHANNELS, "weights": "affs3.npz",
            "input": TINY_INPUT, "layers": AFFS_NET}
    (site["models"] / "affs3.json").write_text(json.dumps(spec))
    np.savez(site["models"] / "affs3.npz", **params)
    return {"root": root}


def direct(affinities: Path, thresholds: tuple[float, ...], block: tuple[int, int, int],
           where: Path) -> tuple[list[np.ndarray], list[str]]:
    """What the engine writes for the same affinities, thresholds and block, and the names
    of the stages it ran."""
    outputs = tuple(Location.parse(str(where / f"direct-{i}.zarr"), "output")
                    for i in range(len(thresholds)))
    report = agglomerate(AgglomerateJob(Location.parse(str(affinities), "affinities"), outputs,
                                        thresholds, block=block))
    return ([zarr.open_array(o.url, mode="r")[...] for o in outputs],
            [s.name for s in report.stages])


def _names(job: dict) -> list[str]:
    return [s["name"] for s in job["stages"]]


def _all_done(job: dict) -> None:
    for s in job["stages"]:
        assert s["status"] == "done", s
        assert s["progress"]["done"] == s["progress"]["total"] >= 1, s
        assert s["eta_s"] is None


def test_agglomeration_job_equals_the_engine(server, volumes: dict, tmp_path: Path) -> None:  # noqa: ANN001
    body = {"affinities": AFFS, "output": "agg/seg-{threshold}.zarr", "thresholds": [0.3, 0.6],
            "block": [16, 16, 16]}
    with server.client() as client:
        r = client.post("/v1/agglomerate", json=body)
        assert r.status_code == 201, r.text
        queued = r.json()
        done = wait_job(client, queued["id"], ("succeeded",))
    assert queued["kind"] == "agglomerate" and queued["network"] is None
    assert queued["input"] == AFFS and queued["output"] == "agg/seg-{threshold}.zarr"
    assert _names(queued) == [*AGG_STAGES, "relabel 0.3", "relabel 0.6"]
    assert {s["status"] for s in queued["stages"]} == {"pending"}
    _all_done(done)
    assert [s["progress"]["total"] for s in done["stages"][:2]] == [8, 8]  # 2^3 blocks of 16^3
    report = done["report"]
    assert report["outputs"] == ["agg/seg-0.3.zarr", "agg/seg-0.6.zarr"]
    assert report["segments"][0] > report["segments"][1] > 1  # a higher threshold merges more
    expected, engine_stages = direct(volumes["root"] / AFFS, (0.3, 0.6), (16, 16, 16), tmp_path)
    assert _names(queued) == _names(done) == engine_stages  # the job's stages are the engine's
    for name, want in zip(report["outputs"], expected, strict=True):
        got = zarr.open_array(str(volumes["root"] / name), mode="r")
        assert got.shape == (1, 32, 32, 32) and got.dtype == np.uint64
        np.testing.assert_array_equal(got[...], want)


def test_segment_job_with_an_agglomeration_stage(server, volumes: dict, tmp_path: Path) -> None:  # noqa: ANN001
    body = {"network": "affs3", "input": "small.zarr", "output": "sa/affs.zarr",
            "chunks": [4, 4, 4], "block": [4, 8, 4],
            "agglomerate": {"output": "sa/seg-{threshold}.zarr", "thresholds": [0.4, 0.6],
                            "block": [8, 8, 8]}}
    with server.client() as client:
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        assert _names(r.json()) == ["network", *AGG_STAGES, "relabel 0.4", "relabel 0.6"]
        job = wait_job(client, r.json()["id"], ("succeeded",))
    _all_done(job)
    network = job["stages"][0]
    assert network["progress"]["total"] == job["report"]["blocks_total"] > 1
    assert network["progress"]["voxels_done"] == 14 * 13 * 11
    outputs = job["report"]["agglomerate"]["outputs"]
    assert outputs == ["sa/seg-0.4.zarr", "sa/seg-0.6.zarr"]
    # each stage's seconds are recorded (their sum is the job's: test_eta, with set values)
    assert all(s["elapsed_s"] is not None for s in job["stages"]) and job["elapsed_s"] is not None
    wanted, _ = direct(volumes["root"] / "sa/affs.zarr", (0.4, 0.6), (8, 8, 8), tmp_path)
    for name, want in zip(outputs, wanted, strict=True):
        got = zarr.open_array(str(volumes["root"] / name), mode="r")[...]
        assert got.shape == (1, 14, 13, 11) and got.dtype == np.uint64
        np.testing.assert_array_equal(got, want)


def test_stage_progress_cancel_and_resume(server, volumes: dict, tmp_path: Path) -> None:  # noqa: ANN001
    """A running stage shows its blocks and ETA; cancelled, it keeps its blocks, and the same
    job again resumes from them to the engine's labels."""
    body = {"affinities": LONG, "output": "agg/long-seg.zarr", "block": [4, 4, 4]}
    with server.client() as client:
        job_id = client.post("/v1/agglomerate", json=body).json()["id"]
        running = wait_job(client, job_id, ("succeeded",), min_done=3)
        client.post(f"/v1/jobs/{job_id}/cancel")
        cancelled = wait_job(client, job_id, ("cancelled",))
        again = client.post("/v1/agglomerate", json=body)
        assert again.status_code == 201, again.text
        final = wait_job(client, again.json()["id"], ("succeeded",))
    fragments = running["stages"][0]
    assert fragments["status"] == "running" and fragments["progress"]["total"] == 256
    assert fragments["progress"]["done"] >= 3 and fragments["eta_s"] is not None
    assert running["eta_s"] == fragments["eta_s"]
    assert [s["status"] for s in running["stages"][2:]] == ["pending", "pending"]
    stopped = cancelled["stages"][0]
    kept = stopped["progress"]["done"]
    assert stopped["status"] == "stopped" and 3 <= kept < 256
    assert final["report"]["stages"][0]["blocks_computed"] == 256 - kept
    _all_done(final)
    want = direct(volumes["root"] / LONG, (0.5,), (4, 4, 4), tmp_path)[0][0]
    got = zarr.open_array(str(volumes["root"] / "agg/long-seg.zarr"), mode="r")[...]
    np.testing.assert_array_equal(got, want)


def _wait_stage(client, job_id: int, index: int, done: int, timeout_s: float = 120.0) -> None:  # noqa: ANN001
    """Until stage `index` of the job has `done` blocks."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["stages"][index]["progress"]["done"] >= done:
            return
        assert job["status"] in ("queued", "running"), job
        time.sleep(0.05)
    raise AssertionError(f"stage {index} of job {job_id} did not reach {done} blocks")


def test_killed_in_the_agglomeration_stage_resumes_after_restart(site: dict, volumes: dict,
                                                                  tmp_path: Path) -> None:
    """SIGKILL while an overwrite job agglomerates: restarted, it runs the network's stage
    again (all done) and resumes its agglomeration from the ledgers, to the engine's labels."""
    body = {"network": "affs3", "input": "small.zarr", "output": "kill/affs.zarr",
            "overwrite": True, "agglomerate": {"output": "kill/seg.zarr", "block": [2, 2, 2]}}
    server = Server(site["root"], site["models"], tmp_path / "jobs.sqlite").start()
    try:
        with server.client() as client:
            job_id = client.post("/v1/jobs", json=body).json()["id"]
            _wait_stage(client, job_id, 1, 3)  # fragments: 7 * 7 * 6 blocks of 2^3
        server.kill()
        server.start()  # same database
        with server.client() as client:
            final = wait_job(client, job_id, ("succeeded",))
    finally:
        server.stop()
    assert final["attempts"] == 2
    _all_done(final)
    fragments = final["report"]["agglomerate"]["stages"][0]
    assert fragments["blocks_computed"] < fragments["blocks_total"] == 7 * 7 * 6
    want = direct(volumes["root"] / "kill/affs.zarr", (0.5,), (2, 2, 2), tmp_path)[0][0]
    got = zarr.open_array(str(volumes["root"] / "kill/seg.zarr"), mode="r")[...]
    np.testing.assert_array_equal(got, want)


SEGMENT = {"network": "affs3", "input": "small.zarr", "output": "bad/affs.zarr"}
BAD = [
    ("/v1/agglomerate", {"affinities": AFFS, "output": "bad/seg.zarr", "thresholds": [1.5]},
     ("threshold 1.5", "outside [0, 1]")),
    ("/v1/agglomerate", {"affinities": "agg/two.zarr", "output": "bad/seg.zarr"},
     ("affinities agg/two.zarr", "(2, 16, 16, 16)")),
    ("/v1/agglomerate", {"affinities": AFFS, "output": "bad/seg.zarr", "thresholds": [0.2, 0.4]},
     ("{threshold}",)),
    ("/v1/agglomerate", {"affinities": "bad/none.zarr", "output": "bad/seg.zarr"},
     ("affinities", "does not exist")),
    ("/v1/agglomerate", {"affinities": AFFS, "output": "agg/affs.zarr/x"}, ("overlap",)),
    ("/v1/agglomerate", {"affinities": AFFS, "output": "small.zarr"}, ("already exists",)),
    ("/v1/jobs", {**SEGMENT, "agglomerate": {"output": "bad/seg.zarr", "thresholds": [1.5]}},
     ("threshold 1.5", "outside [0, 1]")),
    ("/v1/jobs", {**SEGMENT, "network": "tiny", "agglomerate": {"output": "bad/seg.zarr"}},
     ("network 'tiny' writes 2 channels",)),
    ("/v1/jobs", {**SEGMENT, "agglomerate": {"output": "bad/affs.zarr"}}, ("overlap",)),
    ("/v1/jobs", {**SEGMENT, "agglomerate": {"output": "../outside/seg.zarr"}}, ("'..'",)),
]


@pytest.mark.parametrize("path, body, words", BAD)
def test_bad_agglomerations_are_refused(server, volumes: dict, path: str, body: dict,  # noqa: ANN001
                                        words: tuple[str, ...]) -> None:
    with server.client() as client:
        before = client.get("/v1/jobs").json()["total"]
        r = client.post(path, json=body)
        assert r.status_code == 422, r.text
        assert client.get("/v1/jobs").json()["total"] == before
    detail = r.json()["detail"]
    assert isinstance(detail, str) and all(w in detail for w in words), detail
    assert "\n" not in detail and not re.search(r"[.;]\s+[A-Z]", detail), detail  # one sentence
    assert str(volumes["root"]) not in detail
    assert not (volumes["root"] / "bad").exists()  # nothing written
