"""Exact mode for a valid U-Net exported to ONNX: equal to one torch run over the whole
border-extended volume, whatever the blocks and tiles; ROI, resume, refusals."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume
from support.naive import close
from support.onnx_models import valid_unet

from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.job import SegmentCancelled, SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.loading import load_model
from znni.model.onnx_model import OnnxModel

CTX = StoreContext()  # store options (none) and caches for this module's calls

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("exact")
    net = valid_unet()
    path = tmp / "valid.onnx"
    torch.onnx.export(net, (torch.zeros(1, 1, 12, 24, 24),), path, input_names=["x"],
                      dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    model = load_model(path, scale=1 / 255)
    assert isinstance(model, OnnxModel) and model.mode == "exact"
    assert model.size_factor == (1, 2, 2)
    vol = np.random.default_rng(6).integers(0, 256, size=(13, 29, 22)).astype(np.uint8)
    inp = write_volume(tmp / "in.zarr", vol, 3, (5, 8, 8))
    return {"tmp": tmp, "net": net, "path": path, "model": model, "vol": vol, "inp": inp}


def _whole_run(setup: dict, border: str) -> np.ndarray:
    """One torch run over the volume extended by the context (and up to the grid)."""
    model, vol = setup["model"], setup["vol"]
    lo = [c // 2 for c in model.context]
    pads = []
    for a in range(3):
        n = vol.shape[a] + model.context[a]
        m, f = model.min_window[a], model.size_factor[a]
        n += (-(n - m)) % f
        pads.append((lo[a], n - vol.shape[a] - lo[a]))
    mode = "reflect" if border == "reflect" else "constant"
    x = np.pad(vol.astype(np.float32) / 255, pads, mode=mode)
    with torch.no_grad():
        y = setup["net"](torch.from_numpy(x[None, None])).numpy()[0]
    return y[:, : vol.shape[0], : vol.shape[1], : vol.shape[2]]


@pytest.mark.parametrize("border", ["reflect", "zero"])
@pytest.mark.parametrize("block, tile", [((5, 8, 8), None), ((10, 16, 24), (9, 22, 20))])
def test_exact_equals_one_whole_volume_run(setup, border, block, tile) -> None:
    out = setup["tmp"] / f"o_{border}_{block[0]}.zarr"
    job = SegmentJob(setup["model"], setup["inp"], str(out), border=border, chunks=(5, 8, 8),
                     block=block, window=tile)
    segment(job)
    assert close(zarr.open_array(str(out))[...], _whole_run(setup, border))


def test_default_blocks_run_the_fewest_tiles(setup) -> None:
    """Without --block, blocks take the extent whose blocks run the fewest tiles
    (tiles.exact_block_shape; issue 39), the run reports it, its whole-run prediction
    counts those tiles, and the output is the whole-volume run's."""
    from znni.engine.compute.tiles import block_tiles, exact_block_shape
    from znni.engine.geometry import Box

    out = setup["tmp"] / "o_default_blocks.zarr"
    job = SegmentJob(setup["model"], setup["inp"], str(out), chunks=(5, 8, 8))
    report = segment(job)
    assert close(zarr.open_array(str(out))[...], _whole_run(setup, "reflect"))
    plan = report.plan
    tile = tuple(plan["tile"])
    region = Box((0, 0, 0), setup["vol"].shape)
    assert tuple(plan["block_shape"]) == exact_block_shape(setup["model"], tile, (5, 8, 8),
                                                           region)
    ran = block_tiles(setup["model"], tile, tuple(plan["block_shape"]), region)
    one_block_s = region.size / plan["predicted_voxels_per_second"]  # `passes` tiles
    assert plan["job_seconds"]["windows_s"] == pytest.approx(one_block_s * ran / plan["passes"])


def test_roi_resume_and_the_plan(setup, capsys) -> None:
    out = setup["tmp"] / "roi.zarr"
    job = SegmentJob(setup["model"], setup["inp"], str(out), roi=((2, 11), (3, 27), (None, None)),
                     chunks=(5, 8, 8), block=(5, 8, 8))
    cancel = threading.Event()
    with pytest.raises(SegmentCancelled):
        segment(job, cancel=cancel, progress=lambda ev: ev.blocks_done >= 2 and cancel.set())
    report = segment(job)
    assert report.plan["mode"] == "exact" and 0 < report.blocks_computed < report.blocks_total
    got = zarr.open_array(str(out))[...]
    assert close(got[:, 2:11, 3:27], _whole_run(setup, "reflect")[:, 2:11, 3:27])
    assert main(["plan", str(setup["path"]), "--json"]) == 0
    assert '"mode": "exact"' in capsys.readouterr().out


def test_cli_run_prints_the_exact_plan(setup, capsys) -> None:
    """`znni segment` of a valid graph says which tiles it ran (it once failed with a
    KeyError while printing the summary, after the output was written)."""
    out = setup["tmp"] / "cli.zarr"
    args = ["segment", str(setup["path"]), setup["inp"], str(out), "--scale", str(1 / 255)]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "plan: exact tiles " in err and "Traceback" not in err
    assert close(zarr.open_array(str(out))[...], _whole_run(setup, "reflect"))


def test_tile_off_the_grid_is_refused(setup, capsys) -> None:
    out = setup["tmp"] / "never.zarr"
    args = ["segment", str(setup["path"]), setup["inp"], str(out), "--window", "9,22,21"]
    assert main(args) == 2
    assert "not on the grid" in capsys.readouterr().err
    assert not Path(out).exists()


@pytest.mark.slow
def test_dask_cluster_equals_the_whole_run(setup) -> None:
    out = setup["tmp"] / "dask.zarr"
    job = SegmentJob(setup["model"], setup["inp"], str(out), chunks=(5, 8, 8),
                     block=(5, 16, 8), scheduler="local:2")
    report = segment(job)
    assert report.blocks_computed == report.blocks_total > 1
    assert close(zarr.open_array(str(out))[...], _whole_run(setup, "reflect"))


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_computes_only_the_rest(setup) -> None:
    """Killed with SIGKILL after a few blocks landed: the rerun computes each unfinished
    block once, none of the recorded ones, and the result equals the whole-volume run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from znni.engine.io.ledger import read_ledger
    from znni.engine.workers.base import TRACE_ENV

    tmp = setup["tmp"]
    out, trace1, trace2 = tmp / "killed.zarr", tmp / "trace1", tmp / "trace2"
    cmd = [sys.executable, "-m", "znni.cli", "segment", str(setup["path"]), setup["inp"],
           str(out), "--scale", str(1 / 255), "--chunks", "5,8,8", "--block", "5,8,8",
           "--quiet"]
    env = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env={**env, TRACE_ENV: str(trace1)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_ledger(Location.parse(out), ctx=CTX)[1]) >= 4:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    _, done = read_ledger(Location.parse(out), ctx=CTX)
    total = 3 * 4 * 3  # blocks of 5x8x8 over 13x29x22
    assert 4 <= len(done) < total
    assert subprocess.run(cmd, env={**env, TRACE_ENV: str(trace2)}).returncode == 0
    again = [line.split()[1] for line in trace2.read_text().splitlines()]
    assert not set(again) & done and len(again) == len(set(again)) == total - len(done)
    assert len(read_ledger(Location.parse(out), ctx=CTX)[1]) == total
    assert close(zarr.open_array(str(out))[...], _whole_run(setup, "reflect"))
