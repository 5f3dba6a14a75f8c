"""Test-time flips (`--tta`) through whole runs: windowed equal to MONAI's
sliding_window_inference of the model wrapped in the same flip average, exact graphs equal
to the flip-averaged whole-volume torch run, sequential (MPF) networks equal to the naive
dense reference flip-averaged, the stand-in GPU equal to the CPU, resume after SIGKILL,
the plan's counted cost and the refusals."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_padded, small_network, write_network, write_volume
from support.naive import close, naive_border_pad, naive_fov
from support.store_runs import kill_after_blocks

from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.loading import load_model

torch = pytest.importorskip("torch")
AXES = {"flips": (0, 1, 2), "flips:zx": (0, 2), "flips:y": (1,)}


def _subsets(axes: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [c for k in range(len(axes) + 1) for c in itertools.combinations(axes, k)]


class FlipAverage(torch.nn.Module):
    """nnU-Net's mirroring around any module: the mean of flip(model(flip(x)))."""

    def __init__(self, model: torch.nn.Module, axes: tuple[int, ...]) -> None:
        super().__init__()
        self.model, self.axes = model, axes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        subsets = _subsets(self.axes)
        total = None
        for sub in subsets:
            dims = [2 + a for a in sub]
            y = self.model(torch.flip(x, dims) if dims else x)
            y = torch.flip(y, dims) if dims else y
            total = y if total is None else total + y
        return total / len(subsets)


@pytest.fixture(scope="module")
def volume(tmp_path_factory) -> tuple[np.ndarray, str]:
    vol = np.random.default_rng(8).integers(0, 256, size=(15, 29, 26)).astype(np.uint8)
    tmp = tmp_path_factory.mktemp("tta")
    return vol, write_volume(tmp / "in.zarr", vol, 3, (8, 16, 16))


@pytest.mark.parametrize("tta", ["flips", "flips:zx"])
def test_windowed_equals_monai_of_the_flip_average(tmp_path, volume, capsys, onnx_models,
                                                   tta) -> None:
    monai = pytest.importorskip("monai")
    vol, inp = volume
    model, window = onnx_models.module("unet"), onnx_models.window("unet")
    path = onnx_models.copy("unet", tmp_path / "unet.onnx")
    out = tmp_path / "out.zarr"
    args = ["segment", str(path), inp, str(out), "--window", ",".join(map(str, window)),
            "--overlap", "0.25", "--scale", str(1 / 255), "--chunks", "8,16,16",
            "--block", "8,16,16", "--tta", tta]
    assert main(args) == 0
    count = 2 ** len(AXES[tta])
    assert f"test-time {tta} ({count} passes each)" in capsys.readouterr().err  # the plan line
    got = zarr.open_array(str(out), mode="r")[...]
    x = torch.from_numpy(vol[None, None].astype(np.float32) / 255)
    with torch.no_grad():
        ref = monai.inferers.sliding_window_inference(
            x, window, 3, FlipAverage(model.eval(), AXES[tta]), overlap=0.25,
            mode="gaussian", sigma_scale=0.125)[0].numpy()
        plain = monai.inferers.sliding_window_inference(
            x, window, 3, model.eval(), overlap=0.25, mode="gaussian",
            sigma_scale=0.125)[0].numpy()
    assert close(got, ref)
    assert not close(got, plain)  # the flips changed the output
    record = zarr.open_array(str(out), mode="r").attrs["znni"]
    assert record["tta"] == tta and record["plan"]["flips"] == count


def _flipped_whole_run(net, model, vol: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The exact graph's reference (tests/engine/workers/test_exact_graph.py's whole run over
    the volume extended by its context, up to the grid), flip-averaged."""
    lo = [c // 2 for c in model.context]
    pads = []
    for a in range(3):
        n = vol.shape[a] + model.context[a]
        n += (-(n - model.min_window[a])) % model.size_factor[a]
        pads.append((lo[a], n - vol.shape[a] - lo[a]))
    x = torch.from_numpy(np.pad(vol.astype(np.float32) / 255, pads, mode="reflect")[None, None])
    with torch.no_grad():
        y = FlipAverage(net, axes)(x).numpy()[0]
    return y[:, : vol.shape[0], : vol.shape[1], : vol.shape[2]]


@pytest.mark.parametrize("tta, block, tile", [("flips", (8, 16, 16), None),
                                              ("flips:y", (8, 32, 16), (9, 22, 20))])
def test_exact_tiles_equal_the_flip_averaged_whole_run(tmp_path, volume, onnx_models, tta,
                                                       block, tile) -> None:
    vol, inp = volume
    model = load_model(onnx_models.path("validunet"), scale=1 / 255)
    assert model.mode == "exact"
    out = tmp_path / "exact.zarr"
    job = SegmentJob(model, inp, str(out), chunks=(8, 16, 16), block=block, window=tile,
                     tta=tta)
    segment(job)
    ref = _flipped_whole_run(onnx_models.module("validunet"), model, vol, AXES[tta])
    assert close(zarr.open_array(str(out), mode="r")[...], ref)


def _naive_flipped(layers: list[dict], params: dict, vol: np.ndarray,
                   axes: tuple[int, ...]) -> np.ndarray:
    """The dense reference (support/engine_ref.py) flip-averaged: every voxel's field-of-view
    window flipped, run, and the outputs averaged (a valid dense output of the flipped
    padded volume, flipped back, is exactly that)."""
    fov = naive_fov(layers)
    lo = tuple((f - 1) // 2 for f in fov)
    hi = tuple(f - 1 - a for f, a in zip(fov, lo, strict=True))
    x = naive_border_pad(vol[None], lo, hi, "reflect").astype(np.float32) / np.float32(255)
    total = 0
    for sub in _subsets(axes):
        ax = tuple(1 + a for a in sub)
        total = total + np.flip(dense_padded(layers, params, np.flip(x, ax).copy()), ax)
    return total / len(_subsets(axes))


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> tuple[Path, list, dict]:
    layers, params = small_network(np.random.default_rng(9))  # maxpool (2, 1, 2): fov (6, 4, 6)
    path = write_network(tmp_path_factory.mktemp("seq"), layers, params, scale=1 / 255)
    return path, layers, params


@pytest.mark.parametrize("tta, block", [("flips", (8, 16, 16)), ("flips:zx", (16, 32, 32))])
def test_sequential_network_equals_the_naive_flip_average(tmp_path, volume, sequential, tta,
                                                          block) -> None:
    vol, inp = volume
    path, layers, params = sequential
    out = tmp_path / "seq.zarr"
    job = SegmentJob(load_model(path), inp, str(out), chunks=(8, 16, 16), block=block, tta=tta)
    segment(job)
    got = zarr.open_array(str(out), mode="r")[...]
    assert close(got, _naive_flipped(layers, params, vol, AXES[tta]))
    assert not close(got, _naive_flipped(layers, params, vol, ()))


@pytest.mark.parametrize("name", ["unet", "validunet"])
def test_standin_gpu_equals_the_cpu(tmp_path, volume, onnx_models, monkeypatch, name) -> None:
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")
    _, inp = volume
    model = load_model(onnx_models.path(name), scale=1 / 255)
    outs = []
    for device in ("cpu", "gpu"):
        out = tmp_path / f"{device}.zarr"
        segment(SegmentJob(model, inp, str(out), chunks=(8, 16, 16), block=(8, 16, 16),
                           window=onnx_models.window(name), device=device, tta="flips:zx"))
        outs.append(zarr.open_array(str(out), mode="r")[...])
    assert close(outs[1], outs[0])


@pytest.mark.parametrize("kind", ["sequential", "windowed"])
def test_resume_after_sigkill_keeps_the_same_output(tmp_path, volume, sequential, onnx_models,
                                                    kind) -> None:
    from znni.engine.io.ledger import read_ledger

    _, inp = volume
    model = [str(sequential[0])] if kind == "sequential" else [
        str(onnx_models.copy("unet", tmp_path / "unet.onnx")), "--window", "8,16,12",
        "--scale", str(1 / 255)]
    whole, out = tmp_path / "whole.zarr", tmp_path / "killed.zarr"
    options = [*model[1:], "--chunks", "8,8,8", "--block", "8,8,8", "--quiet"]

    def cmd(output: Path, tta: str = "flips") -> list[str]:
        return [sys.executable, "-m", "znni.cli", "segment", model[0], inp, str(output),
                *options, "--tta", tta]

    env = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1"}
    assert subprocess.run(cmd(whole), env=env).returncode == 0
    kill_after_blocks(subprocess.Popen(cmd(out), env=env), str(out), 3)
    total = 2 * 4 * 4  # blocks of 8x8x8 over 15x29x26
    assert 3 <= len(read_ledger(Location.parse(out), ctx=StoreContext())[1]) < total
    other = subprocess.run(cmd(out, "flips:z"), env=env, capture_output=True, text=True)
    assert other.returncode == 2 and "(tta differs)" in other.stderr  # another output
    assert subprocess.run(cmd(out), env=env).returncode == 0
    assert np.array_equal(zarr.open_array(str(out))[...], zarr.open_array(str(whole))[...])


def _plan(capsys, *args: str) -> dict:
    capsys.readouterr()  # what came before (an export's messages)
    assert main(["plan", *args, "--machine", "ci-2core", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_counts_the_flips(capsys, tmp_path, volume, onnx_models, sequential) -> None:
    onnx = str(onnx_models.copy("unet", tmp_path / "unet.onnx"))
    plain = _plan(capsys, onnx, "--window", "8,16,12", "--memory-limit", "1GiB")
    flips = _plan(capsys, onnx, "--window", "8,16,12", "--memory-limit", "1GiB",
                  "--tta", "flips")
    assert flips["flips"] == 8 and flips["passes"] == plain["passes"]
    assert 7.0 < flips["predicted_seconds"] / plain["predicted_seconds"] <= 8.0
    # beside the batch: the group's unflipped inputs and its means, (1 + 3 channels) x W
    extra = flips["window_peak_bytes"] - plain["window_peak_bytes"]
    assert extra == flips["batch"] * 4 * (1 + 3) * 8 * 16 * 12
    two = _plan(capsys, onnx, "--window", "8,16,12", "--memory-limit", "1GiB", "--tta", "flips:x")
    assert 1.8 < two["predicted_seconds"] / plain["predicted_seconds"] <= 2.0
    seq = str(sequential[0])
    base = _plan(capsys, seq, "--memory-limit", "1GiB")
    flipped = _plan(capsys, seq, "--memory-limit", "1GiB", "--tta", "flips")
    assert flipped["predicted_patch_s"] == pytest.approx(8 * base["predicted_patch_s"])
    assert flipped["peak_bytes"] > base["peak_bytes"]
    _, inp = volume
    job = _plan(capsys, seq, "--memory-limit", "1GiB", "--input", inp, "--tta", "flips")
    assert job["job_seconds"]["patches_s"] > 0
    assert main(["plan", seq, "--input", inp, "--tta", "flips", "--machine", "ci-2core"]) == 0
    assert "every block's patches" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["flips:q", "mirror", "flips:", "flips:xx"])
def test_bad_values_exit_2_and_write_nothing(tmp_path, volume, sequential, capsys,
                                             value) -> None:
    _, inp = volume
    out = tmp_path / "never.zarr"
    assert main(["segment", str(sequential[0]), inp, str(out), "--tta", value]) == 2
    err = capsys.readouterr().err
    assert f"--tta {value!r} is not one of" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["plan", str(sequential[0]), "--tta", value]) == 2
    assert "is not one of" in capsys.readouterr().err
