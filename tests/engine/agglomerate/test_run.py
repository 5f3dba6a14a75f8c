"""`znni agglomerate` on real Zarr arrays: the result of the whole command equals the
in-memory block-by-block reference and whole-volume waterz, for any --block; uint8
affinities and boundary maps are read as documented; bad input is one sentence, exit 2,
nothing written; a rerun resumes; several thresholds write one output each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.agglomerate_ref import blockwise, smooth_affinities

from znni.cli import main
from znni.engine.agglomerate.job import AgglomerateJob
from znni.engine.agglomerate.run import agglomerate
from znni.engine.location import Location

SHAPE = (20, 24, 28)


def write(path: Path, values: np.ndarray, chunks: tuple[int, ...] | None = None) -> str:
    chunks = chunks or tuple(min(8, s) for s in values.shape)
    arr = zarr.create_array(str(path), shape=values.shape, chunks=chunks, dtype=values.dtype)
    arr[...] = values
    return str(path)


def labels(path: Path | str) -> np.ndarray:
    out = np.asarray(zarr.open_array(str(path), mode="r")[...])
    assert out.dtype == np.uint64 and out.shape[0] == 1
    return out[0]


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = np.unique(np.stack([a.ravel(), b.ravel()]), axis=1)
    return pairs.shape[1] == len(np.unique(a)) == len(np.unique(b))


@pytest.fixture
def affs(tmp_path: Path) -> tuple[np.ndarray, str]:
    values = smooth_affinities(SHAPE, 11)
    return values, write(tmp_path / "affs.zarr", values, (3, 8, 8, 8))


def test_the_command_equals_the_reference_and_waterz(tmp_path: Path, affs) -> None:
    values, path = affs
    out = tmp_path / "seg-{threshold}.zarr"
    assert main(["agglomerate", path, str(out), "--threshold", "0.4,0.6", "--block",
                 "8,9,10", "--quiet"]) == 0
    _, _, expected = blockwise(values, (20, 24, 28), [0.4, 0.6])
    waterz = pytest.importorskip("waterz")
    for t, reference in zip(("0.4", "0.6"), expected, strict=True):
        ours = labels(tmp_path / f"seg-{t}.zarr")
        assert np.array_equal(ours, reference)
        assert same_partition(ours, next(waterz.agglomerate(values, [float(t)])).copy())
        assert ours.max() < 2**53
    record = zarr.open_array(str(tmp_path / "seg-0.4.zarr")).attrs["znni"]
    assert record["threshold"] == 0.4 and record["tool"] == "znni agglomerate"


def test_any_block_shape_writes_the_same_labels(tmp_path: Path, affs) -> None:
    _, path = affs
    for name, block in (("a", "20,24,28"), ("b", "7,5,13"), ("c", "3,24,4")):
        assert main(["agglomerate", path, str(tmp_path / f"{name}.zarr"), "--block", block,
                     "--quiet"]) == 0
    a = labels(tmp_path / "a.zarr")
    assert np.array_equal(a, labels(tmp_path / "b.zarr"))
    assert np.array_equal(a, labels(tmp_path / "c.zarr"))


def test_uint8_affinities_are_read_as_value_over_255(tmp_path: Path, affs) -> None:
    values, _ = affs
    stored = np.rint(values * 255).astype(np.uint8)
    path = write(tmp_path / "u8.zarr", stored, (3, 8, 8, 8))
    assert main(["agglomerate", path, str(tmp_path / "out.zarr"), "--quiet"]) == 0
    _, _, (expected,) = blockwise((stored / np.float32(255)).astype(np.float32), SHAPE, [0.5])
    assert np.array_equal(labels(tmp_path / "out.zarr"), expected)


@pytest.mark.parametrize("with_channel", [False, True])
def test_a_boundary_map_becomes_affinities(tmp_path: Path, with_channel: bool) -> None:
    boundary = smooth_affinities(SHAPE, 12)[0]
    boundary[:, 11:13, :] = 1.0  # a wall
    stored = boundary[None] if with_channel else boundary
    path = write(tmp_path / "b.zarr", stored.astype(np.float32))
    assert main(["agglomerate", path, str(tmp_path / "out.zarr"), "--block", "10,10,10",
                 "--quiet"]) == 0
    derived = np.zeros((3, *SHAPE), np.float32)  # edge (v, v - e_c): 1 - max(b(v), b(v - e_c))
    for c in range(3):
        here = [slice(None)] * 3
        here[c] = slice(1, None)
        below = [slice(None)] * 3
        below[c] = slice(0, -1)
        derived[(c, *here)] = 1 - np.maximum(boundary[tuple(here)], boundary[tuple(below)])
    _, _, (expected,) = blockwise(derived, SHAPE, [0.5])
    out = labels(tmp_path / "out.zarr")
    assert np.array_equal(out, expected)
    assert not out[:, 11:13].any()  # every edge of a wall voxel is 0: background
    assert len(np.intersect1d(out[:, :11], out[:, 13:])) == 0  # nothing crosses the wall


@pytest.mark.parametrize("case", ["two channels", "four channels", "bool dtype", "int16",
                                  "threshold above 1", "threshold text", "no placeholder",
                                  "different run"])
def test_bad_input_is_one_sentence_and_writes_nothing(tmp_path: Path, affs, case: str,
                                                      capsys: pytest.CaptureFixture) -> None:
    values, path = affs
    out, threshold = tmp_path / "out.zarr", "0.5"
    if case == "two channels":
        path = write(tmp_path / "two.zarr", values[:2])
    elif case == "four channels":
        path = write(tmp_path / "four.zarr", np.concatenate([values, values[:1]]))
    elif case == "bool dtype":
        path = write(tmp_path / "bool.zarr", values > 0.5)
    elif case == "int16":
        path = write(tmp_path / "i16.zarr", (values * 100).astype(np.int16))
    elif case == "threshold above 1":
        threshold = "0.3,1.5"
        out = tmp_path / "out-{threshold}.zarr"
    elif case == "threshold text":
        threshold = "half"
    elif case == "no placeholder":
        threshold = "0.3,0.5"
    elif case == "different run":
        assert main(["agglomerate", path, str(out), "--threshold", "0.3", "--quiet"]) == 0
        before = labels(out).copy()
        capsys.readouterr()
        assert main(["agglomerate", path, str(out), "--threshold", "0.6", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "different job" in err and "threshold" in err
        assert np.array_equal(labels(out), before)  # nothing lost
        return
    assert main(["agglomerate", path, str(out), "--threshold", threshold, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("znni agglomerate: error: ") and err.count("\n") == 0, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if p.suffix == ".zarr" and "out" not in p.name)


def test_a_rerun_of_a_finished_job_computes_nothing(tmp_path: Path, affs) -> None:
    _, path = affs
    job = AgglomerateJob(Location.parse(path), (Location.parse(str(tmp_path / "o.zarr")),),
                         (0.5,), block=(8, 8, 8))
    first = agglomerate(job)
    again = agglomerate(job)
    assert [s.blocks_computed for s in again.stages] == [0, 0, 1, 0]
    assert first.segments == again.segments
    assert first.fragments == again.fragments > first.basins > first.segments[0]


def test_a_new_threshold_reuses_the_fragments_and_graph(tmp_path: Path, affs) -> None:
    _, path = affs
    base = ["agglomerate", path, "--block", "8,8,8", "--quiet",
            "--work-dir", str(tmp_path / "work")]
    assert main([*base[:2], str(tmp_path / "a.zarr"), *base[2:], "--threshold", "0.4"]) == 0
    job = AgglomerateJob(Location.parse(path), (Location.parse(str(tmp_path / "b.zarr")),),
                         (0.55,), block=(8, 8, 8), work=Location.parse(str(tmp_path / "work")))
    report = agglomerate(job)
    assert [s.blocks_computed for s in report.stages[:2]] == [0, 0]
    assert labels(tmp_path / "b.zarr").any()


def test_roi_and_mask(tmp_path: Path, affs) -> None:
    values, path = affs
    mask = np.ones(SHAPE, np.uint8)
    mask[:, :, 20:] = 0
    mpath = write(tmp_path / "mask.zarr", mask)
    assert main(["agglomerate", path, str(tmp_path / "out.zarr"), "--roi", "2:18,:,3:",
                 "--mask", mpath, "--block", "6,7,8", "--quiet"]) == 0
    out = labels(tmp_path / "out.zarr")
    assert not out[:2].any() and not out[18:].any() and not out[:, :, :3].any()
    assert not out[:, :, 20:].any() and out[2:18, :, 3:20].all()
    from znni.engine.geometry import Box

    _, _, (expected,) = blockwise(values, (16, 24, 25), [0.5], mask=mask.astype(bool),
                                  region=Box((2, 0, 3), (18, 24, 28)))
    assert np.array_equal(out, expected)


def test_the_summary_names_each_output(tmp_path: Path, affs) -> None:
    _, path = affs
    run = subprocess.run([sys.executable, "-m", "znni.cli", "agglomerate", path,
                          str(tmp_path / "s-{threshold}.zarr"), "--threshold", "0.3,0.7"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "s-0.3.zarr: threshold 0.3" in run.stderr and "s-0.7.zarr" in run.stderr
    assert (tmp_path / "s-all.zarr.agglomerate" / "graph.sqlite").exists()
    # the global step, which runs long on large graphs, says what it is doing
    for line in ("agglomerate: joining the region graphs of 1 blocks", "basin edges among",
                 "agglomerate 0.3: ", "agglomerate 0.7: "):
        assert line in run.stderr, run.stderr
