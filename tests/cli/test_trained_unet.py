"""Issue 53's trained test U-Net (benchmarks/networks/trained_unet.onnx, made by
benchmarks/train_unet.py): `znni segment` of it in fp32 equals onnxruntime running the same
file on the same windows, and its output really finds the synthetic EM's membranes, so
precision errors judged on it are errors of a network that has learned something."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume
from support.naive import close

from znni.cli import main
from znni.cli.demo_data import synthetic_em
from znni.model.onnx_import import load_onnx

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("monai")
from monai.inferers import sliding_window_inference  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "benchmarks" / "networks" / "trained_unet.onnx"
WINDOW = (64, 64, 64)
SCALE = 1 / 255  # the scale it was trained with
# The smallest F1 of (output > 0.5) against the true membranes measured on volumes of this
# test's shape (seeds 3-12: 0.953-0.968), with margin; an untrained net scores ~0.3.
MIN_F1 = 0.93


def _onnxruntime(vol: np.ndarray, overlap: float) -> np.ndarray:
    """The independent reference: onnxruntime on the windows MONAI's sliding window cuts,
    blended as znni's windowed mode documents (Gaussian, sigma 0.125 W)."""
    session = ort.InferenceSession(str(FIXTURE))

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"x": x.numpy()})[0])

    x = torch.from_numpy(vol.astype(np.float32) * np.float32(SCALE))[None, None]
    out = sliding_window_inference(x, WINDOW, 1, run, overlap=overlap, mode="gaussian",
                                   sigma_scale=0.125)
    return out[0].numpy()


def _f1(pred: np.ndarray, truth: np.ndarray) -> float:
    tp = np.count_nonzero(pred & truth)
    return 2 * tp / (np.count_nonzero(pred) + np.count_nonzero(truth))


def test_trained_unet_segments_membranes_as_onnxruntime_does(tmp_path, capsys) -> None:
    graph = load_onnx(FIXTURE, WINDOW)
    assert graph.in_channels == 1 and graph.out_window == WINDOW
    assert FIXTURE.stat().st_size < 1 << 20  # a fixture kept in git
    vol, membranes = synthetic_em((64, 96, 96), n_cells=18, seed=7)  # not a training seed
    inp = write_volume(tmp_path / "em.zarr", vol, 3, (32, 48, 48))
    out = tmp_path / "membranes.zarr"
    args = ["segment", str(FIXTURE), inp, str(out), "--window", "64,64,64", "--overlap", "0.25",
            "--scale", str(SCALE), "--precision", "fp32", "--quiet"]
    assert main(args) == 0, capsys.readouterr().err
    got = zarr.open_array(str(out), mode="r")[:]
    ref = _onnxruntime(vol, 0.25)
    assert got.shape == ref.shape == (1, *vol.shape)
    assert close(got, ref)  # max |znni - onnxruntime| <= 1e-4 (outputs are in [0, 1])
    assert 0.0 <= got.min() and got.max() <= 1.0  # the sigmoid is in the graph
    assert _f1(got[0] > 0.5, membranes) > MIN_F1
