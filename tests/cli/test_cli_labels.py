"""`znni segment --labels/--mask/--skip-empty` and `znni plan` with them through the CLI:
the summary says how many blocks were skipped, the plan shows what changes, bad values are
one line on stderr with exit 2 and nothing written, and a run killed with SIGKILL resumes to
the uninterrupted run's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import slow_network, small_network, write_network, write_volume
from support.store_runs import kill_after_blocks

from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.location import Location

CTX = StoreContext()


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("ZNNI_BACKEND", "reference")
    rng = np.random.default_rng(5)
    layers, params = small_network(rng)  # 2 output channels
    vol = rng.integers(1, 256, size=(16, 16, 16)).astype(np.uint8)
    vol[:, :8] = 0  # y < 8: empty input
    mask = np.ones((8, 8, 8), np.uint8)
    mask[:4] = 0  # z < 8 off (a mask voxel is 2^3 input voxels)
    return dict(tmp=tmp_path, spec=str(write_network(tmp_path, layers, params, scale=1 / 255)),
                inp=write_volume(tmp_path / "in.zarr", vol, 3, (8, 8, 8)),
                mask=write_volume(tmp_path / "mask.zarr", mask, 3, (8, 8, 8)))


def test_segment_says_how_many_blocks_were_skipped(setup: dict, capsys) -> None:
    out = str(setup["tmp"] / "out.zarr")
    rc = main(["segment", setup["spec"], setup["inp"], out, "--chunks", "8,8,8", "--block",
               "8,8,8", "--labels", "threshold:0.5:1", "--mask", setup["mask"], "--skip-empty"])
    assert rc == 0
    err = capsys.readouterr().err
    # 8 blocks: 4 outside the mask (z < 8), 2 more empty (y < 8), 2 computed
    assert "2/8 blocks computed, 6 skipped (outside the mask or empty input)" in err
    got = zarr.open_array(out)
    assert got.shape == (1, 16, 16, 16) and got.dtype == np.uint8
    assert not got[:, :8].any() and not got[:, :, :8].any()


def test_plan_shows_the_output_and_the_blocks_outside_the_mask(setup: dict, capsys) -> None:
    rc = main(["plan", setup["spec"], "--input", setup["inp"], "--chunks", "8,8,8",
               "--machine", "ci-2core", "--labels", "argmax", "--mask", setup["mask"]])
    assert rc == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("output: "))
    assert "1 uint8 channel (labels argmax)" in line
    assert "wholly outside the mask" in line  # how many: the engine's test (one block here)
    rc = main(["plan", setup["spec"], "--input", setup["inp"], "--machine", "ci-2core",
               "--labels", "argmax", "--mask", setup["mask"], "--json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["labels"], plan["output_channels"], plan["output_dtype"]) == ("argmax", 1,
                                                                              "uint8")


def test_segment_predicts_the_labels_it_stores(setup: dict) -> None:
    """The run segment plans for labels times the writes of what it stores (1 uint8
    channel), not the network's 2 float32 channels."""
    from znni.engine.job import SegmentJob
    from znni.engine.segment import check_and_plan
    from znni.model.loading import load_model
    from znni.planner.jobtime import WRITE_VALUES_PER_S

    def planned(labels: str | None) -> dict:
        job = SegmentJob(load_model(setup["spec"]), setup["inp"],
                         str(setup["tmp"] / "o.zarr"), chunks=(8, 8, 8), labels=labels)
        plan = check_and_plan(job)
        assert plan is not None and plan.job_seconds is not None
        return {**plan.job_seconds, "edges": plan.block_edges}

    labels, floats = planned("argmax"), planned(None)
    assert labels["edges"] == floats["edges"]  # the same blocks: only the writes differ
    writes = 16**3 * (1 / WRITE_VALUES_PER_S["uint8"] - 2 / WRITE_VALUES_PER_S["float32"])
    assert labels["io_total_s"] - floats["io_total_s"] == pytest.approx(writes)


@pytest.mark.parametrize("extra, words", [
    (["--labels", "threshold"], "needs a number after threshold"),
    (["--labels", "threshold:0.5:9"], "channel 9 is out of range"),
    (["--labels", "argmax", "--dtype", "uint8"], "leave out --dtype uint8"),
    (["--mask", "MISSING"], "does not exist"),
    (["--mask", "BAD"], "does not divide"),
])
def test_bad_values_exit_2_with_one_line_and_write_nothing(setup: dict, capsys, extra,
                                                           words) -> None:
    if "MISSING" in extra:
        extra = ["--mask", str(setup["tmp"] / "no-mask.zarr")]
    if "BAD" in extra:
        extra = ["--mask", write_volume(setup["tmp"] / "bad.zarr", np.ones((5, 8, 8), "u1"), 3,
                                        (5, 8, 8))]
    out = setup["tmp"] / "never.zarr"
    assert main(["segment", setup["spec"], setup["inp"], str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not out.exists()


def _cmd(spec: str, inp: str, out: Path, mask: str) -> list[str]:
    return [sys.executable, "-m", "znni.cli", "segment", spec, inp, str(out), "--chunks",
            "8,10,12", "--block", "8,10,12", "--labels", "argmax", "--mask", mask,
            "--skip-empty", "--quiet"]


@pytest.mark.slow
def test_sigkill_then_resume_keeps_the_same_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    layers, params = slow_network(rng)
    spec = str(write_network(tmp_path, layers, params, scale=1 / 255))
    vol = rng.integers(1, 256, size=(40, 50, 60)).astype(np.uint8)
    vol[:, :, :12] = 0  # the first column of blocks (x) is empty
    mask = np.ones((20, 25, 30), np.uint8)
    mask[:, 20:] = 0  # y >= 40 off
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (16, 16, 16))
    mpath = write_volume(tmp_path / "mask.zarr", mask, 3, (10, 10, 10))
    env = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out.zarr"
    kill_after_blocks(subprocess.Popen(_cmd(spec, inp, out, mpath), env=env), str(out), 60)
    assert 60 <= len(read_ledger(Location.parse(out), ctx=CTX)[1]) < 125
    assert subprocess.run(_cmd(spec, inp, out, mpath), env=env).returncode == 0
    assert len(read_ledger(Location.parse(out), ctx=CTX)[1]) == 125
    clean = tmp_path / "clean.zarr"
    assert subprocess.run(_cmd(spec, inp, clean, mpath), env=env).returncode == 0
    got, want = zarr.open_array(str(out))[...], zarr.open_array(str(clean))[...]
    assert np.array_equal(got, want)
    assert not want[:, :, 40:].any() and not want[:, :, :, :12].any() and want.any()


def test_plan_of_a_graph_model_checks_and_shows_the_output(setup: dict, onnx_models,
                                                           capsys) -> None:
    """`znni plan MODEL.onnx --input` takes --labels and --mask as segment does: checked
    (a bad value is one line, exit 2), shown, and its whole run timed at the stored dtype."""
    model = str(onnx_models.copy("unet", setup["tmp"] / "u.onnx"))
    common = ["plan", model, "--input", setup["inp"], "--memory-limit", "256MiB"]
    capsys.readouterr()  # the model's export
    assert main([*common, "--labels", "argmax", "--mask", setup["mask"], "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["output_channels"], plan["output_dtype"]) == (1, "uint8")
    assert plan["mask"] == setup["mask"] and plan["blocks_outside_mask"] is None
    assert plan["predicted_job_seconds"] > 0
    assert main([*common, "--labels", "argmax", "--mask", setup["mask"]]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("output: "))
    assert "1 uint8 channel (labels argmax)" in line and "outside the mask" in line
    assert main([*common, "--labels", "threshold"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a number after threshold" in err
