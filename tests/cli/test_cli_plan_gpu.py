"""`znni plan MODEL.onnx --device gpu [--precision P]` (the stand-in GPU, or a profile's) and
--precision's refusals on plan and segment: exit 2, one sentence, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from znni.cli import main
from znni.engine.job import PRECISIONS
from znni.primitives.precision import PRECISIONS as STORED


@pytest.fixture
def standin(monkeypatch) -> None:
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")


def _one_sentence(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_cli_vocabulary_is_the_primitives() -> None:
    assert PRECISIONS == STORED


def test_plan_shows_the_gpu_plan_and_why(tmp_path, capsys, onnx_models, standin) -> None:
    onnx_path = onnx_models.copy("basicunet", tmp_path / "b.onnx")
    capsys.readouterr()
    assert main(["plan", str(onnx_path), "--device", "gpu", "--precision", "fp16",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["device"] == "gpu" and plan["precision"] == "fp16"
    assert plan["device_peak_bytes"] <= plan["device_cap_bytes"]
    assert plan["window_peak_bytes"] <= plan["memory_budget_bytes"]
    assert plan["batch"] >= 1 and plan["predicted_window_s"] > 0
    convs = plan["conv_nodes"]
    assert convs and all(n["primitive"] in ("cudnn", "cufft-keep", "cufft", "gemm-loop")
                         for n in convs)
    for n in convs:  # the chosen one is the fastest candidate that fits
        assert n["primitive"] in n["candidates"]
        assert n["predicted_s"] == pytest.approx(n["candidates"][n["primitive"]])
    assert plan["primitives"] == {n["name"]: n["primitive"] for n in convs}
    assert main(["plan", str(onnx_path), "--device", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "device gpu at fp32" in out and "device peak" in out and "candidates (ms)" in out
    assert "cudnn" in out


def test_plan_for_a_profiles_gpu(tmp_path, capsys, onnx_models) -> None:
    onnx_path = onnx_models.copy("unet", tmp_path / "u.onnx")
    capsys.readouterr()  # MONAI prints the features of the nets it builds
    for precision in ("fp32", "bf16"):
        assert main(["plan", str(onnx_path), "--device", "gpu", "--machine", "h100-host",
                     "--precision", precision, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["precision"] == precision and plan["device"] == "gpu"
        assert plan["device_cap_bytes"] == int(0.9 * 80e9)
        # MONAI's UNet downsamples with strided convs: never on cuFFT
        strided = [n for n in plan["conv_nodes"] if n["op"] == "conv_transpose"]
        assert strided and all(not any(c.startswith("cufft") for c in n["candidates"])
                               for n in strided)
    assert main(["plan", str(onnx_path), "--device", "gpu", "--machine", "h100-host",
                 "--memory-limit", "1GiB", "--json"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert capped["device_cap_bytes"] == 2**30
    assert capped["device_peak_bytes"] <= 2**30


@pytest.mark.parametrize("extra, words", [
    (["--precision", "fp64"], "precision 'fp64' is not one of fp32, tf32, bf16, fp16"),
    (["--precision", "tf32"], "--precision tf32 needs --device gpu"),  # no GPU here: the CPU
    (["--precision", "fp16", "--device", "cpu"], "--precision fp16 needs --device gpu"),
])
def test_plan_refuses_a_precision_in_one_sentence(tmp_path, capsys, onnx_models, extra,
                                                   words) -> None:
    onnx_path = onnx_models.copy("unet", tmp_path / "u.onnx")
    assert main(["plan", str(onnx_path), *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and _one_sentence(err)


@pytest.mark.parametrize("extra, words", [
    (["--precision", "fp64"], "precision 'fp64' is not one of"),
    (["--precision", "fp16", "--device", "cpu"], "--precision fp16 needs --device gpu"),
    (["--precision", "tf32", "--device", "cpu"], "--precision tf32 needs --device gpu"),
])
def test_segment_refuses_a_precision_and_writes_nothing(tmp_path, capsys, onnx_models, extra,
                                                        words, standin) -> None:
    """(With the stand-in GPU, so that cpu-gpu's check of the device passes.)"""
    onnx_path = onnx_models.copy("unet", tmp_path / "u.onnx")
    inp = str(tmp_path / "in.zarr")
    zarr.create_array(inp, shape=(16, 16, 16), chunks=(16, 16, 16), dtype="float32")[:] = \
        np.zeros((16, 16, 16), np.float32)
    out = tmp_path / "never.zarr"
    assert main(["segment", str(onnx_path), inp, str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and _one_sentence(err)
    assert not out.exists()


def test_segment_takes_a_gpu_precision_on_the_standin(tmp_path, standin) -> None:
    from znni.engine.compute.execution import check_precision

    for precision in PRECISIONS:
        if precision != "int8":  # int8 is the CPU's (NNCF's network on OpenVINO)
            check_precision("gpu", precision)  # the stand-in computes in all four
    for precision in ("int8", "auto"):
        with pytest.raises(ValueError, match="runs on the CPU"):
            check_precision("gpu", precision)
        check_precision("auto", precision)  # --device auto: the CPU runs them
    check_precision("auto", "fp16")  # a graph network runs on the (stand-in) GPU
    with pytest.raises(ValueError, match="needs --device gpu"):
        check_precision("cpu", "fp16")
    check_precision("cpu", "bf16")  # OpenVINO's compiled networks on the CPU
