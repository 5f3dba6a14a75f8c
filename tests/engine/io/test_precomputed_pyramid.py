"""`--pyramid N` on precomputed outputs, on real stores (TensorStore on local paths and the
local S3 server): scales 1..N in the same volume's `info` with the resolution, size, chunk
size and voxel offset neuroglancer expects, each scale equal to the OME-Zarr run's level of
the same job (float means and labels' nearest), a SIGKILLed run resumed to the same scales,
and an existing output of another depth refused with one sentence, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume
from support.precomputed_util import kvstore
from support.store_runs import (
    BLOCK,
    WAIT_S,
    child_env,
    kill_after_blocks,
    refused,
    segment_cmd,
)
from support.trace_gate import TraceGate

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import check_and_plan, segment
from znni.model.network import load_network
from znni.primitives.backends import make_backend

ts = pytest.importorskip("tensorstore")

CTX = StoreContext()
SCALE = 1 / 255
VOL_SHAPE = (10, 26, 22)  # (z, y, x)
NM = [40.0, 5.0, 4.0]  # (z, y, x): y, x halve until they reach 32 nm, z stays
AT = [120.0, 15.0, 12.0]  # 3 voxels along each axis: scale k's offset is 3 // factor
OPTS = dict(chunks=(4, 6, 6), block=(4, 6, 6), memory_limit_bytes=2**28)  # 6: footprints cross


def write_ome_input(path: Path, vol: np.ndarray) -> str:
    """A one-level NGFF 0.5 image of `vol` (z, y, x) at NM nanometres, translated by AT."""
    axes = [{"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"]
    transforms = [{"type": "scale", "scale": NM}, {"type": "translation", "translation": AT}]
    ome = {"version": "0.5", "multiscales": [{"axes": axes, "datasets": [
        {"path": "0", "coordinateTransformations": transforms}]}]}
    group = zarr.create_group(str(path), zarr_format=3, attributes={"ome": ome})
    group.create_array("0", shape=vol.shape, chunks=(5, 8, 8), dtype=vol.dtype)[...] = vol
    return str(path)


def scales_of(kv: dict[str, Any]) -> tuple[list[np.ndarray], dict[str, Any]]:
    """((C, Z, Y, X) values of every scale, the info), read by TensorStore alone."""
    info = json.loads(bytes(ts.KvStore.open(kv).result().read("info").result().value))
    values = []
    for k in range(len(info["scales"])):
        t = ts.open({"driver": "neuroglancer_precomputed", "kvstore": kv,
                     "scale_index": k}).result()
        values.append(np.asarray(t.read().result()).transpose())  # (X, Y, Z, C) -> (C, Z, Y, X)
    return values, info


def ome_levels(path: Path) -> list[np.ndarray]:
    group = zarr.open_group(str(path), mode="r")
    paths = [d["path"] for d in group.attrs["ome"]["multiscales"][0]["datasets"]]
    return [np.asarray(group[p][...]) for p in paths]


@pytest.fixture()
def case(tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(21)
    net = load_network(write_network(tmp_path, *small_network(rng), scale=SCALE))
    vol = rng.integers(0, 256, size=VOL_SHAPE).astype(np.uint8)
    return {"net": net, "input": write_ome_input(tmp_path / "in.ome.zarr", vol)}


def run(case: dict[str, Any], out: str, **kw: Any) -> Any:
    job = SegmentJob(case["net"], case["input"], out, **{**OPTS, **kw})
    return segment(job, backend=make_backend("reference"))


def test_scales_equal_the_ome_levels_with_neuroglancer_geometry(case: dict,
                                                                tmp_path: Path) -> None:
    run(case, str(tmp_path / "out.ome.zarr"), pyramid=2)
    out = tmp_path / "out.pc"
    report = run(case, f"precomputed://{out}", pyramid=2)
    assert report.blocks_computed == report.blocks_total
    got, info = scales_of(kvstore(str(out)))
    want = ome_levels(tmp_path / "out.ome.zarr")
    assert [a.shape for a in got] == [a.shape for a in want] == [
        (2, 10, 26, 22), (2, 10, 13, 11), (2, 10, 7, 6)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)  # bitwise: the same builder over the same level 0
    assert [s["resolution"] for s in info["scales"]] == [
        [4.0, 5.0, 40.0], [8.0, 10.0, 40.0], [16.0, 20.0, 40.0]]
    assert [s["size"] for s in info["scales"]] == [[22, 26, 10], [11, 13, 10], [6, 7, 10]]
    assert [s["voxel_offset"] for s in info["scales"]] == [[3, 3, 3], [1, 1, 3], [0, 0, 3]]
    assert [s["chunk_sizes"] for s in info["scales"]] == [[[6, 6, 4]], [[6, 6, 4]],
                                                         [[6, 6, 4]]]
    done = read_ledger(Location.parse(f"precomputed://{out}"), ctx=CTX)[1]
    assert info["type"] == "image" and len(done) == report.blocks_total
    again = run(case, f"precomputed://{out}")  # no --pyramid: the output's own depth; all done
    assert again.blocks_computed == 0


def test_labels_scales_equal_the_ome_labels_levels(case: dict, tmp_path: Path) -> None:
    run(case, str(tmp_path / "out.ome.zarr"), pyramid=2, labels="argmax")
    out = tmp_path / "seg.pc"
    run(case, f"precomputed://{out}", pyramid=2, labels="argmax")
    got, info = scales_of(kvstore(str(out)))
    want = ome_levels(tmp_path / "out.ome.zarr")
    assert info["type"] == "segmentation" and info["data_type"] == "uint8"
    assert len(got) == len(want) == 3
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert set(np.unique(got[0])) == {0, 1}
    np.testing.assert_array_equal(got[2], got[0][:, :, ::4, ::4])  # nearest, never a mean
    again = run(case, f"precomputed://{out}", labels="argmax")  # a segmentation output resumes
    assert again.blocks_computed == 0


def test_an_existing_output_of_another_depth_is_refused(case: dict, tmp_path: Path) -> None:
    out = tmp_path / "out.pc"
    run(case, f"precomputed://{out}", pyramid=1)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    for kw, match in ((dict(pyramid=2), "has 1 pyramid levels .* this run writes 2"),
                      (dict(pyramid=0), "has 1 pyramid levels .* give --pyramid 1"),
                      (dict(pyramid=9), "asks for more levels")):
        with pytest.raises(ValueError, match=match):
            check_and_plan(SegmentJob(case["net"], case["input"], f"precomputed://{out}",
                                      overwrite=True, **{**OPTS, **kw}))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    plain = tmp_path / "plain.pc"  # written without --pyramid: one scale
    run(case, f"precomputed://{plain}")
    assert len(scales_of(kvstore(str(plain)))[1]["scales"]) == 1
    with pytest.raises(ValueError, match="has 0 pyramid levels"):
        check_and_plan(SegmentJob(case["net"], case["input"], f"precomputed://{plain}",
                                  pyramid=1, **OPTS))
    info = json.loads((out / "info").read_text())  # a scale 1 that is not this run's level 1
    info["scales"][1]["voxel_offset"] = [0, 0, 0]
    (out / "info").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"scale 1 has voxel_offset \[0, 0, 0\] \(expected "
                                         r"\[1, 1, 3\]\)"):
        check_and_plan(SegmentJob(case["net"], case["input"], f"precomputed://{out}", **OPTS))


def test_a_run_killed_before_it_added_its_scales_adds_them_on_resume(case: dict,
                                                                      tmp_path: Path) -> None:
    """Killed between creating scale 0 and adding scales 1..N, before any block: the
    same command again adds the scales (nothing done lacks them) and equals a clean run."""
    clean, out = tmp_path / "clean.pc", tmp_path / "out.pc"
    run(case, f"precomputed://{clean}", pyramid=2)
    run(case, f"precomputed://{out}", pyramid=2)
    info = json.loads((out / "info").read_text())
    (out / "info").write_text(json.dumps({**info, "scales": info["scales"][:1]}))
    for p in out.iterdir():  # scale 0's chunks and the ledger of the finished blocks: gone
        if p.name != "info":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    report = run(case, f"precomputed://{out}", pyramid=2)
    assert report.blocks_computed == report.blocks_total
    got, got_info = scales_of(kvstore(str(out)))
    want, want_info = scales_of(kvstore(str(clean)))
    assert got_info == want_info
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_cli_refusals_are_one_sentence_and_write_nothing(case: dict, tmp_path: Path) -> None:
    spec = tmp_path / "net.json"
    env = child_env(ZNNI_BACKEND="reference")
    out = tmp_path / "new.pc"
    refused(segment_cmd(spec, case["input"], f"precomputed://{out}", "--pyramid", "9"), env,
            "--pyramid 9 asks for more levels")
    assert not out.exists()
    old = tmp_path / "old.pc"
    run(case, f"precomputed://{old}", pyramid=1, chunks=BLOCK, block=BLOCK)
    before = sorted(p.name for p in old.rglob("*"))
    refused(segment_cmd(spec, case["input"], f"precomputed://{old}", "--pyramid", "2"), env,
            "has 1 pyramid levels", "give --pyramid 1")
    assert sorted(p.name for p in old.rglob("*")) == before


KILL_BLOCK = ("--chunks", "16,18,24", "--block", "16,18,24")  # after segment_cmd's: taken
KILL_SHAPE = (64, 72, 96)  # 4 x 4 x 4 blocks; of 18: the level-2 footprints cross blocks
KILL_TOTAL = 64


def kill_case(tmp_path: Path) -> tuple[Path, str]:
    """A small network and a plain Zarr input of KILL_SHAPE (the run is held mid-way by its
    trace gate, so its blocks need not be slow)."""
    rng = np.random.default_rng(23)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=SCALE)
    vol = rng.integers(0, 256, size=KILL_SHAPE).astype(np.uint8)
    return spec, write_volume(tmp_path / "in.zarr", vol, 3, (16, 16, 16))


@pytest.mark.slow
def test_sigkill_then_resume_leaves_the_scales_of_a_clean_run(tmp_path: Path) -> None:
    spec, inp = kill_case(tmp_path)
    # coarse chunks are written at once, so blocks are recorded as their footprints complete,
    # in many small batches the kill can follow (held 2 s, a run this short records at its end)
    env = child_env(ZNNI_BACKEND="reference", ZNNI_PYRAMID_FLUSH_S="0")
    clean, out = f"precomputed://{tmp_path / 'clean.pc'}", f"precomputed://{tmp_path / 'out.pc'}"
    assert subprocess.run(segment_cmd(spec, inp, clean, "--pyramid", "2", *KILL_BLOCK), env=env,
                          timeout=WAIT_S).returncode == 0
    cmd = segment_cmd(spec, inp, out, "--pyramid", "2", *KILL_BLOCK)
    gate = TraceGate(tmp_path / "gate")  # half the blocks through, then the run held
    try:
        proc = subprocess.Popen(cmd, env={**env, **gate.env()})
        gate.wait_for(proc, KILL_TOTAL // 2)
        gate.hold()
        kill_after_blocks(proc, out, KILL_TOTAL // 3)
    finally:
        gate.close()
    assert KILL_TOTAL // 3 <= len(read_ledger(Location.parse(out), ctx=CTX)[1]) < KILL_TOTAL
    assert subprocess.run(cmd, env=env, timeout=WAIT_S).returncode == 0
    got, info = scales_of(kvstore(str(tmp_path / "out.pc")))
    want, _ = scales_of(kvstore(str(tmp_path / "clean.pc")))
    assert len(info["scales"]) == len(want) == 3
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_s3_scales_equal_the_local_ones(s3, s3_env, case: dict,  # noqa: ANN001
                                        tmp_path: Path) -> None:
    local = tmp_path / "local.pc"
    run(case, f"precomputed://{local}", pyramid=1)
    there = f"{s3.prefix()}/out.pc"
    run(case, f"precomputed://{there}", pyramid=1)
    got, info = scales_of(kvstore(there, s3.endpoint))
    want, want_info = scales_of(kvstore(str(local)))
    assert info["scales"] == want_info["scales"] and len(got) == 2
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(read_ledger(Location.parse(f"precomputed://{there}"), ctx=CTX)[1]) == \
        len(read_ledger(Location.parse(f"precomputed://{local}"), ctx=CTX)[1])


@pytest.mark.slow
def test_dask_workers_write_scale_0_and_the_client_the_scales(case: dict, tmp_path: Path,
                                                              monkeypatch) -> None:  # noqa: ANN001
    pytest.importorskip("distributed")
    monkeypatch.setenv("ZNNI_BACKEND", "reference")
    run(case, f"precomputed://{tmp_path / 'local.pc'}", pyramid=2)
    report = segment(SegmentJob(case["net"], case["input"],
                                f"precomputed://{tmp_path / 'dask.pc'}", scheduler="local:2",
                                pyramid=2, **OPTS))
    assert report.blocks_computed == report.blocks_total
    got, info = scales_of(kvstore(str(tmp_path / "dask.pc")))
    want, want_info = scales_of(kvstore(str(tmp_path / "local.pc")))
    assert info["scales"] == want_info["scales"] and len(got) == 3
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)  # the workers' own backend
