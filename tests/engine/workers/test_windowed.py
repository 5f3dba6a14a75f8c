"""Windowed runs of an ONNX U-Net through the engine: independent of the block layout,
cancelled and resumed, on a real Dask LocalCluster, and killed with SIGKILL mid-run."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume

from znni.engine.job import SegmentCancelled, SegmentJob
from znni.engine.segment import segment
from znni.engine.workers.base import TRACE_ENV
from znni.model.loading import load_model
from znni.model.onnx_model import OnnxModel

torch = pytest.importorskip("torch")
WINDOW = (8, 16, 12)


def _unet_onnx(path: Path) -> Path:
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv3d(1, 4, 3, padding=1)
            self.n = nn.InstanceNorm3d(4, affine=True)
            self.b = nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1))
            self.up = nn.ConvTranspose3d(4, 4, 2, stride=2)
            self.c = nn.Conv3d(8, 2, 1)

        def forward(self, x):
            a = torch.relu(self.n(self.a(x)))
            u = self.up(torch.relu(self.b(nn.functional.max_pool3d(a, 2))))
            return torch.sigmoid(self.c(torch.cat([a, u], 1)))

    torch.manual_seed(3)
    torch.onnx.export(Net().eval(), (torch.zeros(1, 1, *WINDOW),), path, input_names=["x"],
                      dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("windowed")
    model = load_model(_unet_onnx(tmp / "u.onnx"), scale=1 / 255)
    assert isinstance(model, OnnxModel) and model.size_factor == (2, 2, 2)
    vol = np.random.default_rng(4).integers(0, 256, size=(22, 37, 30)).astype(np.uint8)
    inp = write_volume(tmp / "in.zarr", vol, 2, (6, 8, 8))
    job = SegmentJob(model, inp, str(tmp / "whole.zarr"), window=WINDOW, overlap=0.4,
                     chunks=(6, 8, 8), block=(24, 40, 32))
    report = segment(job)
    assert report.blocks_total == 1
    return {"tmp": tmp, "job": job, "expected": zarr.open_array(str(job.output_path))[...]}


def _job(setup: dict, name: str, **changes) -> SegmentJob:
    return SegmentJob(**{**setup["job"].__dict__, "output_path": str(setup["tmp"] / name),
                         **changes})


@pytest.mark.parametrize("block", [(6, 8, 8), (12, 16, 24), (6, 40, 8)])
def test_result_does_not_depend_on_blocks(setup, block) -> None:
    job = _job(setup, f"b{block[0]}_{block[1]}.zarr", block=block)
    segment(job)
    assert np.array_equal(zarr.open_array(str(job.output_path))[...], setup["expected"])


def test_cancelled_run_resumes_to_the_same_result(setup) -> None:
    job = _job(setup, "resume.zarr", block=(6, 8, 8))
    cancel = threading.Event()
    with pytest.raises(SegmentCancelled):
        segment(job, cancel=cancel, progress=lambda ev: ev.blocks_done >= 3 and cancel.set())
    report = segment(job)
    assert 0 < report.blocks_computed < report.blocks_total
    assert np.array_equal(zarr.open_array(str(job.output_path))[...], setup["expected"])


def test_other_window_refused_without_overwrite(setup) -> None:
    job = _job(setup, "whole.zarr", window=(8, 16, 16))
    with pytest.raises(ValueError, match="window differs"):
        segment(job)


@pytest.mark.slow
def test_local_dask_cluster_equals_local_run(setup) -> None:
    job = _job(setup, "dask.zarr", block=(12, 16, 16), scheduler="local:2")
    report = segment(job)
    assert report.blocks_computed == report.blocks_total > 1
    assert np.array_equal(zarr.open_array(str(job.output_path))[...], setup["expected"])


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_completes(setup, monkeypatch) -> None:
    tmp = setup["tmp"]
    out, trace = tmp / "killed.zarr", tmp / "trace"
    model_path = tmp / "u.onnx"
    cmd = [sys.executable, "-m", "znni.cli", "segment", str(model_path),
           str(setup["job"].input_path), str(out), "--window", "8,16,12", "--overlap", "0.4",
           "--scale", str(1 / 255), "--chunks", "6,8,8", "--block", "6,8,8", "--quiet"]
    env = {**__import__("os").environ, TRACE_ENV: str(trace)}
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if trace.exists() and len(trace.read_text().splitlines()) >= 4:
            proc.kill()
            break
        time.sleep(0.01)
    proc.wait()
    first = len(trace.read_text().splitlines())
    assert subprocess.run(cmd, env=env).returncode == 0
    again = len(trace.read_text().splitlines()) - first
    total = 4 * 5 * 4  # blocks of 6x8x8 over 22x37x30
    assert again < total  # only unfinished blocks were computed again
    assert np.array_equal(zarr.open_array(str(out))[...], setup["expected"])


def test_windows_across_blocks_run_once_while_kept(setup, monkeypatch) -> None:
    """Small blocks: every window that straddles blocks is computed once and reused (its
    kept output), with the same result; without keeping, straddlers run again. One window
    per run here (batches: the next test)."""
    import znni.engine.workers.windowed as windowed
    from znni.engine.compute.windows import WindowGrid

    calls = _batched(monkeypatch, 1)
    job = _job(setup, "kept.zarr", block=(6, 8, 8))
    segment(job)
    grid = WindowGrid.for_volume((22, 37, 30), WINDOW, 0.4)
    assert len(calls) == grid.num_windows
    np.testing.assert_allclose(zarr.open_array(str(job.output_path))[...], setup["expected"],
                               rtol=0, atol=1e-6)

    calls.clear()
    monkeypatch.setattr(windowed.WindowedWorker, "_keep", lambda self, start, out: None)
    segment(_job(setup, "unkept.zarr", block=(6, 8, 8)))
    assert len(calls) > grid.num_windows


def _batched(monkeypatch, batch: int) -> list[int]:
    """segment() with the planner's window batch replaced by `batch`; returns the batch size
    of every graph run."""
    import dataclasses

    import znni.engine.segment as seg
    from znni.engine.workers.base import GraphWorker

    sizes: list[int] = []
    real_run, real_spec = GraphWorker.forward, seg._blocks_and_spec
    monkeypatch.setattr(GraphWorker, "forward",
                        lambda self, x: sizes.append(x.shape[0]) or real_run(self, x))
    monkeypatch.setattr(seg, "_blocks_and_spec", lambda job, prep: (
        lambda blocks, spec: (blocks, dataclasses.replace(spec, batch=batch)))(
        *real_spec(job, prep)))
    return sizes


@pytest.mark.parametrize("batch", [2, 3])
def test_batched_windows_equal_single_windows_whatever_the_blocks(setup, monkeypatch,
                                                                  batch) -> None:
    """Windows run `batch` at a time (fixed groups along x): the result matches the one
    window at a time run to float32 rounding, is bit-identical for every block layout,
    and each group runs once while its outputs are kept."""
    from znni.engine.compute.windows import WindowGrid, window_group

    sizes = _batched(monkeypatch, batch)
    results = []
    for block in [(24, 40, 32), (6, 8, 8), (12, 16, 24)]:
        sizes.clear()
        job = _job(setup, f"b{batch}-{block[0]}-{block[2]}.zarr", block=block)
        segment(job)
        results.append(zarr.open_array(str(job.output_path))[...])
        grid = WindowGrid.for_volume((22, 37, 30), WINDOW, 0.4)
        groups = {window_group(grid, s, batch) for s in grid.all_windows()}
        assert sorted(sizes) == sorted(len(g) for g in groups)  # each group once
        assert max(sizes) == batch
    np.testing.assert_allclose(results[0], setup["expected"], rtol=0, atol=1e-6)
    for other in results[1:]:  # a window's batch is fixed by the grid, not by the blocks
        assert np.array_equal(other, results[0])
