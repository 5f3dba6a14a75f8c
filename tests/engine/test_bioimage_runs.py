"""bioimage.io packages run by the engine equal the spec's operations applied by hand around
onnxruntime on the whole volume (MONAI's sliding_window_inference, the same blending), and
a resumed run takes its statistics from the ledger instead of reading the volume again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support import bioimage_packages as bp
from support.engine_ref import write_volume

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.engine.workers.base import TRACE_ENV
from znni.model.bioimage_package import halo_min_window
from znni.model.loading import load_model

pytest.importorskip("torch")
pytest.importorskip("monai")
pytest.importorskip("bioimageio.spec")

WINDOW, OVERLAP = (12, 16, 16), 0.5
SPATIAL = ["z", "y", "x"]

# (id, preprocessing, postprocessing): every kind of op, fixed and dataset statistics
CASES = [
    ("scale_linear+sigmoid",
     [{"id": "scale_linear", "kwargs": {"axis": "channel", "gain": [0.01, 0.02],
                                        "offset": [-1.0, 0.5]}}],
     [{"id": "sigmoid"}]),
    ("scale_range_per_channel+clip",
     [{"id": "scale_range", "kwargs": {"axes": SPATIAL, "min_percentile": 1.5,
                                       "max_percentile": 99.2}},
      {"id": "clip", "kwargs": {"min": 0.0, "max": 1.0}}],
     [{"id": "clip", "kwargs": {"min": -0.5, "max": 0.5}}]),
    ("zero_mean_unit_variance_joint+binarize",
     [{"id": "zero_mean_unit_variance", "kwargs": {"eps": 1e-5}}],
     [{"id": "binarize", "kwargs": {"axis": "channel", "threshold": [0.0, 0.1]}}]),
    ("zero_mean_unit_variance_per_channel+softmax",
     [{"id": "zero_mean_unit_variance", "kwargs": {"axes": ["batch", *SPATIAL]}}],
     [{"id": "softmax", "kwargs": {"axis": "channel"}}]),
    ("fixed_zero_mean_unit_variance+ensure_dtype",
     [{"id": "fixed_zero_mean_unit_variance",
       "kwargs": {"axis": "channel", "mean": [120.0, 130.0], "std": [60.0, 70.0]}}],
     [{"id": "scale_linear", "kwargs": {"gain": 10.0}},
      {"id": "ensure_dtype", "kwargs": {"dtype": "int16"}}]),
    ("clip_percentiles+scale_range_joint",
     [{"id": "clip", "kwargs": {"min_percentile": 5.0, "max_percentile": 95.0,
                                "axes": ["channel", *SPATIAL]}},
      {"id": "scale_range", "kwargs": {"min_percentile": 0.0, "max_percentile": 100.0}}],
     []),
]


@pytest.fixture(scope="module")
def onnx(tmp_path_factory) -> Path:
    return bp.export_onnx(tmp_path_factory.mktemp("bio-onnx") / "tiny.onnx")


@pytest.fixture(scope="module")
def volumes(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bio-vol")
    rng = np.random.default_rng(7)
    u8 = rng.integers(0, 256, (2, 20, 30, 26)).astype(np.uint8)
    f32 = (rng.normal(50, 20, (2, 20, 30, 26)) * np.array([1, 3]).reshape(2, 1, 1, 1)
           ).astype(np.float32)
    return {"uint8": (u8, write_volume(tmp / "u8.zarr", u8, 3, (1, 8, 16, 16))),
            "float32": (f32, write_volume(tmp / "f32.zarr", f32, 2, (1, 8, 16, 16))),
            "tmp": tmp}


def _run(pkg: Path, inp: str, out: Path, **kw) -> np.ndarray:
    job = SegmentJob(load_model(pkg), inp, str(out), window=WINDOW, overlap=OVERLAP,
                     chunks=(8, 16, 16), block=(8, 16, 16), **kw)
    segment(job)
    return zarr.open_array(str(out))[...]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_package_output_equals_the_spec_by_hand(onnx, volumes, tmp_path, case, dtype) -> None:
    name, pre, post = case
    pkg = bp.build(tmp_path / "pkg", onnx, pre, post)
    vol, inp = volumes[dtype]
    ours = _run(pkg, inp, tmp_path / "out.zarr")
    ref = bp.windowed_reference(onnx, vol, pre, post, WINDOW, OVERLAP)
    assert ours.shape == ref.shape == (2, 20, 30, 26)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    if name.endswith("binarize"):  # a threshold on a blended output: both values occur
        assert set(np.unique(ours)) == {0.0, 1.0}


def test_statistics_and_channel_names_recorded(onnx, volumes, tmp_path) -> None:
    pre = CASES[1][1]
    pkg = bp.build(tmp_path / "pkg", onnx, pre, [], pack="zip")
    vol, inp = volumes["uint8"]
    out = tmp_path / "out.zarr"
    job = SegmentJob(load_model(pkg), inp, str(out), window=WINDOW, overlap=OVERLAP,
                     output_format="ome-zarr")
    segment(job)
    attrs = zarr.open_group(str(out)).attrs.asdict()
    record = attrs["znni"]["package"]
    assert record["name"] == "tiny-unet" and record["cite"][0]["doi"].startswith("10.1007")
    assert record["channel_names"] == ["fg", "boundary"]
    assert [c["label"] for c in attrs["ome"]["omero"]["channels"]] == ["fg", "boundary"]
    lower = [float(np.percentile(vol[c], 1.5)) for c in range(2)]
    assert record["preprocessing"][0]["lower"] == pytest.approx(lower, abs=0)
    header, _ = read_ledger(Location.parse(out), ctx=StoreContext())
    assert header is not None
    assert header["parts"]["statistics"]["percentile:1.5:channel"] == lower


def test_overwrite_computes_the_statistics_again(onnx, tmp_path) -> None:
    pre = [{"id": "zero_mean_unit_variance", "kwargs": {"axes": ["batch", *SPATIAL]}}]
    pkg = bp.build(tmp_path / "pkg", onnx, pre, [])
    vol = np.random.default_rng(8).normal(10, 2, (2, 12, 16, 16)).astype(np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (1, 12, 16, 16))
    out = tmp_path / "out.zarr"

    def recorded_mean() -> list[float]:
        return zarr.open_array(str(out)).attrs["znni"]["package"]["preprocessing"][0]["mean"]

    _run(pkg, inp, out)
    assert recorded_mean() == pytest.approx(vol.reshape(2, -1).mean(axis=1), rel=1e-6)
    zarr.open_array(inp)[...] = vol + 5  # new values, same shape and dtype
    _run(pkg, inp, out, overwrite=True)
    assert recorded_mean() == pytest.approx(vol.reshape(2, -1).mean(axis=1) + 5, rel=1e-6)


def test_halo_needs_enough_overlap(onnx, volumes, tmp_path) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, [], [], halo=3)
    model = load_model(pkg)
    assert model.halo == (0, 3, 3) and model.min_window == (8, 8, 8)
    job = SegmentJob(model, volumes["uint8"][1], str(tmp_path / "o.zarr"), window=(12, 16, 16),
                     overlap=0.25)
    with pytest.raises(ValueError, match=r"halo of 3 voxels on axis y.*--overlap 0\.375"):
        segment(job)
    assert not (tmp_path / "o.zarr").exists()
    # the planner's grid starts where neighbours share 6 voxels: 22 - int(22 * 0.75) = 6
    assert halo_min_window(model, 0.25, (20, 30, 26)).min_window == (8, 22, 22)
    assert halo_min_window(model, 0.25, (20, 16, 20)).min_window == (8, 16, 20)  # one window
    planned = SegmentJob(model, volumes["uint8"][1], str(tmp_path / "p.zarr"), overlap=0.25)
    segment(planned)  # the planner's window: neighbours share at least 2 * halo voxels
    window = zarr.open_array(str(tmp_path / "p.zarr")).attrs["znni"]["window"]["window"]
    for w, n in zip(window[1:], (30, 26), strict=True):
        assert w >= n or w - int(w * 0.75) >= 6


def test_window_grid_follows_the_package_step(onnx, volumes, tmp_path) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, [], [], size={"min": 12, "step": 4})
    model = load_model(pkg)
    assert model.min_window == (12, 12, 12) and model.size_factor == (4, 4, 4)
    job = SegmentJob(model, volumes["uint8"][1], str(tmp_path / "o.zarr"), window=(14, 16, 16))
    with pytest.raises(ValueError, match="not on the grid"):
        segment(job)
    planned = SegmentJob(model, volumes["uint8"][1], str(tmp_path / "p.zarr"))
    segment(planned)
    window = zarr.open_array(str(tmp_path / "p.zarr")).attrs["znni"]["window"]["window"]
    assert all(w >= 12 and (w - 12) % 4 == 0 for w in window)


def test_format_04_package_per_dataset_statistics(onnx, volumes, tmp_path) -> None:
    """0.4's zero_mean_unit_variance mode per_dataset over zyx: per channel, over the whole
    volume (the library converts it to 0.5's axes batch, z, y, x)."""
    pre04 = [{"name": "zero_mean_unit_variance",
              "kwargs": {"mode": "per_dataset", "axes": "zyx"}}]
    pre = [{"id": "zero_mean_unit_variance", "kwargs": {"axes": ["batch", *SPATIAL]}}]
    post = [{"id": "sigmoid"}]
    pkg = bp.build_v04(tmp_path / "pkg04", onnx, pre04, [{"name": "sigmoid"}], pre, post)
    model = load_model(pkg)
    assert model.package is not None and model.package["format_version"].startswith("0.5")
    vol, inp = volumes["float32"]
    ours = _run(pkg, inp, tmp_path / "out.zarr")
    ref = bp.windowed_reference(onnx, vol, pre, post, WINDOW, OVERLAP)
    assert np.abs(ours - ref).max() <= 1e-4


@pytest.mark.slow
def test_local_dask_cluster_equals_local_run(onnx, volumes, tmp_path) -> None:
    """The resolved processing travels to Dask workers inside the picklable block spec."""
    _, pre, post = CASES[1]
    pkg = bp.build(tmp_path / "pkg", onnx, pre, post)
    _, inp = volumes["float32"]
    local = _run(pkg, inp, tmp_path / "local.zarr")
    dask = _run(pkg, inp, tmp_path / "dask.zarr", scheduler="local:2")
    assert np.array_equal(local, dask)


@pytest.mark.slow
def test_sigkill_then_resume_reuses_the_statistics(onnx, volumes, tmp_path,
                                                    monkeypatch) -> None:
    pre = CASES[1][1]
    pkg = bp.build(tmp_path / "pkg", onnx, pre, [{"id": "sigmoid"}])
    vol, inp = volumes["float32"]
    out, trace = tmp_path / "killed.zarr", tmp_path / "trace"
    cmd = [sys.executable, "-m", "znni.cli", "segment", str(pkg), inp, str(out), "--window",
           "12,16,16", "--overlap", str(OVERLAP), "--chunks", "8,16,16", "--block", "8,16,16",
           "--quiet"]
    proc = subprocess.Popen(cmd, env={**os.environ, TRACE_ENV: str(trace)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if trace.exists() and len(trace.read_text().splitlines()) >= 3:
            proc.kill()
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode != 0, "the run finished before it was killed"

    def no_second_pass(*args, **kwargs):
        raise AssertionError("the resumed run read the volume for its statistics again")

    monkeypatch.setattr("znni.engine.compute.statistics.compute_statistics", no_second_pass)
    ours = _run(pkg, inp, out)
    ref = bp.windowed_reference(onnx, vol, pre, [{"id": "sigmoid"}], WINDOW, OVERLAP)
    assert np.abs(ours - ref).max() <= 1e-4
