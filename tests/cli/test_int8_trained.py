"""int8 on issue 53's trained U-Net (benchmarks/networks/trained_unet.onnx, made by
benchmarks/train_unet.py): `znni segment --precision int8` against an independent fp32
reference (onnxruntime on MONAI's windows, blended as znni documents) within stated
bounds, and the error it reports consistent with that reference. Random weights' errors
mean nothing (their output's range is tiny), so the bounds are judged on this network.
ZNNI_TEST_TRAINED_UNET names another export of the same script (e.g. before the fixture
is committed); without either the test is skipped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume

from znni.cli import main
from znni.cli.demo_data import synthetic_em

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("monai")
pytest.importorskip("nncf")
from monai.inferers import sliding_window_inference  # noqa: E402

FIXTURE = Path(os.environ.get(
    "ZNNI_TEST_TRAINED_UNET",
    Path(__file__).resolve().parents[2] / "benchmarks" / "networks" / "trained_unet.onnx"))
WINDOW = (64, 64, 64)
SCALE = 1 / 255
# Measured on the fixture (200 steps, validation F1 0.964; and on a 300-step export of the
# same script), NNCF 3.4's performance preset, this test's volume (2026-11-28): whole-volume
# max |int8 - fp32| 0.151 (0.146), 99.9th percentile 0.047 (0.053), mean 0.0029 (0.0019),
# labels at 0.5 changed 0.088% (0.056%); the bounds leave room for another training run.
# Labels: the target (at most 0.5% changed).
MAX_ABS, MEAN_ABS, LABELS_CHANGED = 0.3, 0.005, 0.005


def _onnxruntime(vol: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(FIXTURE))

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"x": x.numpy()})[0])

    x = torch.from_numpy(vol.astype(np.float32) * np.float32(SCALE))[None, None]
    out = sliding_window_inference(x, WINDOW, 1, run, overlap=0.25, mode="gaussian",
                                   sigma_scale=0.125)
    return out[0].numpy()


@pytest.mark.skipif(not FIXTURE.is_file(), reason=f"{FIXTURE} not made yet")
def test_int8_of_the_trained_unet_is_within_its_bounds(tmp_path, capsys) -> None:
    vol, _ = synthetic_em((64, 96, 96), n_cells=18, seed=7)  # not a training seed
    inp = write_volume(tmp_path / "em.zarr", vol, 3, (32, 48, 48))
    out = tmp_path / "int8.zarr"
    args = ["segment", str(FIXTURE), inp, str(out), "--window", "64,64,64", "--scale",
            str(SCALE), "--precision", "int8", "--max-error", "1"]
    assert main(args) == 0, capsys.readouterr().err
    got = zarr.open_array(str(out), mode="r")
    record = got.attrs["znni"]["int8"]
    got = got[...]
    ref = _onnxruntime(vol)
    diff = np.abs(got - ref)
    assert diff.max() <= MAX_ABS and diff.mean() <= MEAN_ABS
    assert np.mean((got > 0.5) != (ref > 0.5)) <= LABELS_CHANGED
    # the held-out windows' measurement agrees with the whole volume's (same network,
    # other windows: within a factor of 3 on the mean, the max of a few voxels alike)
    span = float(ref.max() - ref.min())
    assert record["mean_error"] <= MEAN_ABS / span
    assert diff.mean() / 3 <= record["mean_error"] * span <= 3 * diff.mean()
    assert record["max_error"] <= MAX_ABS / span
