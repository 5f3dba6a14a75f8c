"""`znni segment MODEL.onnx` end to end: windowed output equal to MONAI's
sliding_window_inference on MONAI's own U-Nets, an exported nn.Sequential equal to the
JSON spec path, ROI and resume, and every refusal (exit 2, nothing written)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume
from support.naive import close
from support.onnx_models import export

from znni.cli import main

torch = pytest.importorskip("torch")
monai = pytest.importorskip("monai")
pytest.importorskip("onnxruntime")
from monai.inferers import sliding_window_inference  # noqa: E402


def _monai(model, vol: np.ndarray, window, overlap: float, blend: str) -> np.ndarray:
    x = torch.from_numpy(vol[None, None].astype(np.float32) / 255)
    with torch.no_grad():
        out = sliding_window_inference(
            x, window, 3, model.eval(), overlap=overlap, mode=blend, sigma_scale=0.125
        )
    return out[0].numpy()


@pytest.fixture(scope="module")
def volume(tmp_path_factory) -> tuple[np.ndarray, str]:
    rng = np.random.default_rng(5)
    vol = rng.integers(0, 256, size=(19, 41, 36)).astype(np.uint8)
    tmp = tmp_path_factory.mktemp("vol")
    return vol, write_volume(tmp / "in.zarr", vol, 3, (8, 16, 16))


@pytest.mark.parametrize("name, overlap, blend", [
    ("basicunet", 0.25, "gaussian"), ("unet", 0.5, "constant"), ("unet", 0.25, "gaussian"),
])
def test_windowed_equals_monai_sliding_window(tmp_path, volume, capsys, onnx_models, name,
                                              overlap, blend):
    vol, inp = volume
    model, window = onnx_models.module(name), onnx_models.window(name)
    onnx_path = onnx_models.copy(name, tmp_path / f"{name}.onnx")
    out = tmp_path / "out.zarr"
    args = ["segment", str(onnx_path), inp, str(out), "--window", ",".join(map(str, window)),
            "--overlap", str(overlap), "--blend", blend, "--scale", str(1 / 255),
            "--chunks", "8,16,16", "--block", "8,16,16"]
    assert main(args) == 0, capsys.readouterr().err
    got = zarr.open_array(str(out), mode="r")[:]
    ref = _monai(model, vol, window, overlap, blend)
    assert got.shape == ref.shape
    assert close(got, ref)


def test_roi_and_planned_window_and_resume(tmp_path, volume, capsys, onnx_models) -> None:
    vol, inp = volume
    model = onnx_models.module("unet")
    onnx_path = onnx_models.copy("unet", tmp_path / "u.onnx")
    out = tmp_path / "roi.zarr"
    args = ["segment", str(onnx_path), inp, str(out), "--roi", "3:17,5:30,:", "--scale",
            str(1 / 255), "--memory-limit", "256MiB", "--quiet"]
    assert main(args) == 0, capsys.readouterr().err
    header = (out / "znni-ledger.jsonl").read_text().splitlines()[0]
    assert '"mode": "windowed"' in header
    import json

    window = tuple(json.loads(header)["parts"]["window"])
    got = zarr.open_array(str(out), mode="r")[:]
    ref = _monai(model, vol, window, 0.25, "gaussian")
    assert close(got[:, 3:17, 5:30, :], ref[:, 3:17, 5:30, :])
    assert np.all(got[:, :3] == 0)  # outside the ROI nothing is written
    assert main(args) == 0  # a finished run resumes to nothing to do
    assert "0/" not in capsys.readouterr().err


def test_exported_sequential_runs_exactly_like_the_json_spec(tmp_path, volume, capsys) -> None:
    vol, inp = volume
    rng = np.random.default_rng(2)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    mods = []
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            w = params[f"{i}.weight"]
            conv = torch.nn.Conv3d(w.shape[1], w.shape[0], w.shape[2:])
            conv.weight.data = torch.from_numpy(w)
            conv.bias.data = torch.from_numpy(params[f"{i}.bias"])
            mods.append(conv)
        elif layer["kind"] == "maxpool":
            mods.append(torch.nn.MaxPool3d(layer["window"]))
        else:
            mods.append({"relu": torch.nn.ReLU(), "sigmoid": torch.nn.Sigmoid(),
                         "tanh": torch.nn.Tanh()}[layer["kind"]])
    onnx_path = export(torch.nn.Sequential(*mods), tmp_path / "seq.onnx", (24, 24, 24))
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    assert main(["segment", str(spec), inp, str(a), "--quiet"]) == 0
    assert main(["segment", str(onnx_path), inp, str(b), "--scale", str(1 / 255), "--quiet"]) == 0
    assert close(zarr.open_array(str(b))[:], zarr.open_array(str(a))[:])


@pytest.mark.parametrize("extra, words", [
    (["--window", "8,16,13"], "multiple of"),
    (["--window", "8,16,12", "--overlap", "1.0"], "overlap 1.0"),
    (["--output-name", "nope"], "no output 'nope'"),
    (["--weights", "w.npz"], "--weights applies to JSON specs"),
    (["--device", "gpu"], "--device cpu"),  # no CuPy or no CUDA device here
])
def test_bad_onnx_runs_are_refused(tmp_path, volume, capsys, onnx_models, extra, words) -> None:
    _, inp = volume
    onnx_path = onnx_models.copy("unet", tmp_path / "u.onnx")
    out = tmp_path / "never.zarr"
    assert main(["segment", str(onnx_path), inp, str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_window_on_a_json_spec_is_refused(tmp_path, volume, capsys) -> None:
    _, inp = volume
    layers, params = small_network(np.random.default_rng(0))
    spec = write_network(tmp_path, layers, params)
    assert main(["segment", str(spec), inp, str(tmp_path / "o.zarr"), "--window", "8,8,8"]) == 2
    assert "exact (MPF) mode" in capsys.readouterr().err
    assert main(["segment", str(spec), inp, str(tmp_path / "o.zarr"), "--scale", "2"]) == 2
    assert "--scale applies to ONNX models" in capsys.readouterr().err


def test_plan_says_the_mode_and_why(tmp_path, capsys, onnx_models) -> None:
    import json

    onnx_path = onnx_models.copy("basicunet", tmp_path / "b.onnx")
    capsys.readouterr()  # MONAI's BasicUNet prints its features when it is first built
    assert main(["plan", str(onnx_path), "--memory-limit", "1GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mode"] == "windowed" and "pads its input" in plan["reason"]
    assert plan["size_factor"] == [16, 16, 16] and plan["min_window"] == [16, 16, 16]
    assert all(w % 16 == 0 for w in plan["window"])
    assert plan["window_peak_bytes"] <= plan["memory_budget_bytes"]
    assert main(["plan", str(onnx_path)]) == 0
    assert "mode: windowed" in capsys.readouterr().out
    from znni.engine.compute.layout import DEFAULT_BUDGET_FRACTION, PLAN_FRACTION
    from znni.planner.machine import MachineProfile

    assert main(["plan", str(onnx_path), "--machine", "h100-host", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)  # planned for that machine's memory
    memory = MachineProfile.load("h100-host").memory_bytes
    assert other["memory_budget_bytes"] == int(int(memory * DEFAULT_BUDGET_FRACTION)
                                               * PLAN_FRACTION)


def test_plan_for_an_input_is_what_segment_runs(tmp_path, volume, capsys, onnx_models) -> None:
    """`znni plan --input --roi` chooses for that region and budget what `znni segment`
    then runs (window and predicted rate), and prints it; bad volumes get one sentence."""
    import json

    _, inp = volume
    onnx_path = onnx_models.copy("unet", tmp_path / "u.onnx")
    common = ["--roi", "3:17,5:30,:", "--scale", str(1 / 255), "--memory-limit", "256MiB"]
    capsys.readouterr()
    assert main(["plan", str(onnx_path), "--input", inp, *common, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["region"] == [14, 25, 36] and plan["region_given"] and plan["overlap"] == 0.25
    assert plan["passes"] >= 1 and plan["predicted_seconds"] == pytest.approx(
        14 * 25 * 36 / plan["predicted_voxels_per_second"])
    out = tmp_path / "o.zarr"
    assert main(["segment", str(onnx_path), inp, str(out), *common, "--quiet"]) == 0
    ran = zarr.open_array(str(out), mode="r").attrs["znni"]["plan"]
    assert ran["window"] == plan["window"] and ran["batch"] == plan["batch"]
    assert ran["predicted_voxels_per_second"] == pytest.approx(plan["predicted_voxels_per_second"])
    # the whole run (issue 39): start-up, the windows and the exposed reads and writes,
    # the same prediction in the plan and in the run that followed it
    job = plan["job_seconds"]
    assert plan["predicted_job_seconds"] == pytest.approx(job["total_s"])
    assert job["total_s"] == pytest.approx(job["startup_s"] + job["windows_s"] + job["io_s"])
    assert job["windows_s"] == pytest.approx(plan["predicted_seconds"]) and job["blocks"] >= 1
    assert ran["job_seconds"]["total_s"] == pytest.approx(job["total_s"], rel=1e-6)
    assert main(["plan", str(onnx_path), "--input", inp, *common]) == 0
    text = capsys.readouterr().out
    assert f"window {'x'.join(map(str, plan['window']))} for the volume 14x25x36" in text
    assert f"{plan['passes']} window" in text and "whole run: about" in text
    assert main(["plan", str(onnx_path), "--input", inp, *common, "--window", "8,16,12",
                 "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert given["window"] == [8, 16, 12] and given["window_given"]

    for extra, words in (
        (["--roi", "0:4,:,:"], "--roi needs --input"),
        (["--input", str(tmp_path / "missing.zarr")], "does not exist"),
        (["--input", inp, "--roi", "0:99,:,:"], "outside the volume"),
        (["--input", inp, "--level", "1"], "applies to OME-Zarr image groups"),
        (["--input", inp, "--overlap", "1"], "--overlap must be in [0, 1)"),
        (["--window", "8,16,13"], "not on the grid"),
    ):
        assert main(["plan", str(onnx_path), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and err.count("\n") == 1, err
