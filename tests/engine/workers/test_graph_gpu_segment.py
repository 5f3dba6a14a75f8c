"""Whole `segment` runs of ONNX networks with --device gpu on the stand-in device
(ZNNI_GPU_STANDIN=1): BasicUNet and MONAI's UNet windowed, a valid U-Net exact, each
equal to the CPU run; under a device cap that shrinks the plan, with an injected
allocation failure, in fp16; and the refusals (one sentence, nothing written)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume
from support.naive import close

from znni.cli import main
from znni.engine.job import SegmentJob
from znni.engine.segment import segment
from znni.model.loading import load_model

WINDOWS = {"basicunet": (16, 32, 32), "unet": (8, 16, 12), "validunet": (12, 24, 24)}


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> str:
    vol = np.random.default_rng(7).random((21, 45, 38), dtype=np.float32)
    return write_volume(tmp_path_factory.mktemp("gpu-seg") / "in.zarr", vol, 3, (7, 15, 19))


def _run(onnx_models, name: str, volume: str, out: Path, **options) -> np.ndarray:
    model = load_model(onnx_models.path(name))
    job = SegmentJob(model, volume, str(out), chunks=(7, 15, 19), block=(14, 30, 19),
                     window=WINDOWS[name], **options)
    segment(job)
    return zarr.open_array(str(out), mode="r")[...]


@pytest.mark.parametrize("name", ["basicunet", "unet", "validunet"])
def test_gpu_run_equals_the_cpu_run(onnx_models, volume, tmp_path, standin, name) -> None:
    want = _run(onnx_models, name, volume, tmp_path / "cpu.zarr", device="cpu")
    got = _run(onnx_models, name, volume, tmp_path / "gpu.zarr", device="gpu")
    assert close(got, want)
    attrs = json.dumps(dict(zarr.open_array(str(tmp_path / "gpu.zarr")).attrs))
    assert "gpu" in attrs  # the provenance says where it ran


def test_an_allocation_failure_mid_run_shrinks_and_finishes(onnx_models, volume, tmp_path,
                                                            standin, monkeypatch,
                                                            caplog) -> None:
    want = _run(onnx_models, "basicunet", volume, tmp_path / "cpu.zarr", device="cpu")
    monkeypatch.setenv("ZNNI_GPU_STANDIN_FAIL_AT", "12")
    with caplog.at_level(logging.WARNING, logger="znni.engine"):
        got = _run(onnx_models, "basicunet", volume, tmp_path / "gpu.zarr", device="gpu")
    assert close(got, want)
    assert "chunks of output channels" in caplog.text or "ran out of memory" in caplog.text


def test_a_small_device_cap_plans_a_smaller_pass(onnx_models, volume, tmp_path,
                                                 standin) -> None:
    want = _run(onnx_models, "basicunet", volume, tmp_path / "cpu.zarr", device="cpu")
    got = _run(onnx_models, "basicunet", volume, tmp_path / "gpu.zarr", device="gpu",
               memory_limit_bytes=64 * 2**20)
    assert close(got, want)


def test_fp16_is_within_its_bound_of_fp32(onnx_models, volume, tmp_path, standin) -> None:
    want = _run(onnx_models, "basicunet", volume, tmp_path / "fp32.zarr", device="gpu")
    got = _run(onnx_models, "basicunet", volume, tmp_path / "fp16.zarr", device="gpu",
               precision="fp16")
    assert got.dtype == np.float32  # blended and written in fp32
    assert 0 < np.abs(got - want).max() <= 5e-3 * max(1.0, np.abs(want).max())


def test_gpu_without_a_device_is_one_sentence(onnx_models, volume, tmp_path, capsys,
                                              monkeypatch) -> None:
    monkeypatch.delenv("ZNNI_GPU_STANDIN", raising=False)
    out = tmp_path / "never.zarr"
    args = ["segment", str(onnx_models.path("basicunet")), volume, str(out), "--device", "gpu"]
    capsys.readouterr()  # the model's export (first use in this process) may warn
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "CuPy" in err or "CUDA" in err
    assert not out.exists()


def test_precision_on_the_cpu_is_one_sentence(onnx_models, volume, tmp_path, capsys) -> None:
    out = tmp_path / "never.zarr"
    args = ["segment", str(onnx_models.path("basicunet")), volume, str(out), "--device", "cpu",
            "--precision", "fp16"]  # the CPU runs fp32 or bf16
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "fp16" in err and not out.exists()


def test_precision_of_a_sequential_network_is_one_sentence(onnx_models, volume, tmp_path,
                                                           capsys, standin) -> None:
    """A plain chain imports as a sequential network: its MPF path computes in fp32 only."""
    out = tmp_path / "never.zarr"
    args = ["segment", str(onnx_models.path("chain")), volume, str(out), "--device", "gpu",
            "--precision", "fp16"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "applies to ONNX graph models" in err and "Traceback" not in err
    assert not out.exists()
