"""--precision auto's choice (engine/precision_run.settle) with real networks: candidates
tried fastest predicted first, the first whose measured error is within --max-error taken,
fp32 always within; int8's record and refusal; and `segment` choosing and recording it."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume

from znni.engine.geometry import Box
from znni.engine.job import SegmentJob
from znni.engine.precision_run import Candidate, Sampler, auto_line, settle
from znni.engine.segment import segment
from znni.model.onnx_model import load_onnx_model

pytest.importorskip("openvino")
pytest.importorskip("nncf")
WINDOW = (16, 32, 32)


@pytest.fixture(scope="module")
def unet(onnx_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auto")
    model = load_onnx_model(onnx_models.copy("basicunet", tmp / "u.onnx"), scale=1 / 255)
    vol = np.random.default_rng(3).integers(0, 256, (32, 64, 64)).astype(np.uint8)

    def read(b: Box) -> np.ndarray:
        return vol[None, b.lo[0]:b.hi[0], b.lo[1]:b.hi[1], b.lo[2]:b.hi[2]]

    return model, Sampler(model, read, Box.from_shape(vol.shape)), vol, tmp


def _candidates(**rates: float) -> dict[str, Candidate]:
    return {p: Candidate(p, WINDOW, r) for p, r in rates.items()}


def test_auto_takes_the_fastest_within_the_error(unet) -> None:
    model, sample, _, _ = unet
    got = settle("auto", model, _candidates(int8=3e6, fp32=1e6), sample, max_error=1.0)
    assert got.precision == "int8" and got.compiled_path and got.compiled_path.endswith(".xml")
    auto = got.records["precision_auto"]
    assert auto["chosen"] == "int8"
    assert [c["precision"] for c in auto["candidates"]] == ["int8", "fp32"]
    assert auto["candidates"][0]["within"] and auto["candidates"][1]["measured"] is False
    assert got.records["int8"]["max_error"] == auto["candidates"][0]["max_error"]
    assert "precision auto: int8" in auto_line(auto)


def test_auto_falls_back_when_the_error_is_above(unet) -> None:
    model, sample, _, _ = unet
    got = settle("auto", model, _candidates(int8=3e6, fp32=1e6), sample, max_error=0.0)
    assert got.precision == "fp32" and got.compiled_path is None and "int8" not in got.records
    rows = got.records["precision_auto"]["candidates"]
    assert rows[0]["precision"] == "int8" and not rows[0]["within"]
    assert rows[0]["max_error"] > 0 and rows[1] == {**rows[1], "precision": "fp32",
                                                    "within": True}
    assert "int8" in auto_line(got.records["precision_auto"]) and "(above)" in \
        auto_line(got.records["precision_auto"])


def test_auto_measures_bf16_and_stops_at_fp32_when_it_is_fastest(unet) -> None:
    model, sample, _, _ = unet
    got = settle("auto", model, _candidates(bf16=2e6, fp32=1e6, int8=5e5), sample,
                 max_error=0.05)  # bf16 (or fp32 on a CPU without bf16 units) is within 5%
    assert got.precision == "bf16"
    rows = got.records["precision_auto"]["candidates"]
    assert [r["precision"] for r in rows] == ["bf16", "fp32", "int8"]
    assert rows[0]["max_error"] <= 0.05 and rows[1]["measured"] is False
    fastest = settle("auto", model, _candidates(fp32=2e6, int8=1e6), sample, max_error=0.02)
    assert fastest.precision == "fp32"  # nothing faster: nothing measured
    assert fastest.records["precision_auto"]["candidates"][1]["measured"] is False


def test_int8_above_the_error_is_refused_in_one_sentence(unet) -> None:
    model, sample, _, _ = unet
    with pytest.raises(ValueError) as e:
        settle("int8", model, _candidates(int8=1.0), sample, max_error=0.0)
    assert "\n" not in str(e.value) and "above --max-error 0" in str(e.value)


def test_int8_tries_the_presets_then_the_ends_in_float(unet) -> None:
    from znni.engine.compute.precision_error import int8_measured

    model, sample, _, _ = unet
    output = model.graph(WINDOW).output
    above = int8_measured(model, output, WINDOW, sample(WINDOW), max_error=0.0)
    tries = above.record["tries"]
    assert [(t["preset"], bool(t["kept_float"])) for t in tries] == [
        ("performance", False), ("mixed", False), ("mixed", True)]
    assert above.record["preset"] == "mixed" and len(above.record["kept_float"]) == 2
    assert above.error["max_error"] == tries[-1]["max_error"] > 0
    within = int8_measured(model, output, WINDOW, sample(WINDOW), max_error=1.0)
    assert [t["preset"] for t in within.record["tries"]] == ["performance"]
    assert within.record["kept_float"] == [] and within.record["cached"]  # made above


def test_segment_auto_chooses_and_records_it(unet) -> None:
    model, _, vol, tmp = unet
    inp = write_volume(tmp / "in.zarr", vol, 3, (16, 32, 32))
    job = SegmentJob(model, inp, str(tmp / "out.zarr"), precision="auto", max_error=0.5,
                     window=WINDOW)
    report = segment(job)
    record = zarr.open_array(str(tmp / "out.zarr"), mode="r").attrs["znni"]
    auto = record["precision_auto"]
    assert auto["chosen"] == record["precision"] == report.plan["precision"]
    assert auto["chosen"] in [c["precision"] for c in auto["candidates"]]
    assert auto["max_error_allowed"] == 0.5
    assert ("int8" in record) == (auto["chosen"] == "int8")


def test_int8_at_a_window_above_the_cap_is_calibrated_at_the_cap(unet) -> None:
    """A window above CALIBRATION_SIDE per axis: calibrated and measured at the capped
    window, the quantized network compiled at the run's own; its output near fp32's."""
    model, _, vol, tmp = unet
    inp = write_volume(tmp / "in80.zarr", vol, 3, (16, 32, 32))
    outs = {}
    for precision in ("fp32", "int8"):
        out = tmp / f"out80-{precision}.zarr"
        segment(SegmentJob(model, inp, str(out), precision=precision, max_error=1.0,
                           window=(16, 80, 80)))
        outs[precision] = zarr.open_array(str(out), mode="r")
    record = outs["int8"].attrs["znni"]["int8"]
    assert record["calibration_window"] == [16, 64, 64]
    assert outs["int8"].attrs["znni"]["window"]["window"] == [16, 80, 80]
    ref, got = outs["fp32"][:], outs["int8"][:]
    span = float(ref.max() - ref.min())
    mean_error = float(np.abs(got - ref).mean()) / span
    assert 0 < mean_error <= max(0.05, 3 * record["mean_error"]), (mean_error, record)
