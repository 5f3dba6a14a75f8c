"""--precision auto's choice (engine/precision_run.settle) with real networks: candidates
tried fastest predicted first, the first whose measured error is within --max-error taken,
fp32 always within; int8's record and refusal; and `segment` choosing and recording it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume

from znni.engine.compute.precision_error import try_text
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
    assert len(tries[-1]["kept_float"]) == 2  # the ends
    assert above.error["max_error"] == min(t["max_error"] for t in tries) > 0  # the best
    within = int8_measured(model, output, WINDOW, sample(WINDOW), max_error=1.0)
    assert [t["preset"] for t in within.record["tries"]] == ["performance"]
    assert within.record["kept_float"] == [] and within.record["cached"]  # made above


def test_int8_tries_nncf_accuracy_control_last_and_never_takes_an_all_float_network(
        onnx_models, tmp_path) -> None:
    """Above the error with the presets and the ends in float, NNCF's accuracy control
    aims at CONTROL_MARGIN of it on the calibration windows; every try is timed against
    fp32 on one window. At 0.1% (below int8's resolution) it puts every conv back in
    float: no int8 network, so not taken; the most exact int8 try is reported, above.
    (The valid U-Net: few convs, a quick ranking.)"""
    from znni.engine.compute.precision_error import CONTROL_MARGIN, int8_measured, refusal

    model = load_onnx_model(onnx_models.copy("validunet", tmp_path / "v.onnx"), scale=1 / 255)
    window = onnx_models.window("validunet")
    vol = np.random.default_rng(4).integers(0, 256, (24, 48, 48)).astype(np.uint8)

    def read(b: Box) -> np.ndarray:
        return vol[None, b.lo[0]:b.hi[0], b.lo[1]:b.hi[1], b.lo[2]:b.hi[2]]

    sample = Sampler(model, read, Box.from_shape(vol.shape))(window)
    got = int8_measured(model, model.graph(window).output, window, sample, max_error=1e-3)
    tries = got.record["tries"]
    assert [t["accuracy_control"] for t in tries] == [None, None, None,
                                                      pytest.approx(CONTROL_MARGIN * 1e-3)]
    assert [t["preset"] for t in tries] == ["performance", "mixed", "mixed", "mixed"]
    assert all(t["max_error"] > 1e-3 for t in tries[:3])
    assert len(tries[-1]["kept_float"]) == tries[-1]["convs"] > 2  # all back in float
    assert "no int8 left" in try_text(tries[-1])
    assert not got.within(1e-3) and got.record["accuracy_control"] is None
    assert got.error["max_error"] == min(t["max_error"] for t in tries[:3])
    assert all(math.isfinite(t["window_speedup"]) for t in tries)
    assert "accuracy control (all" in refusal(got, 1e-3)


def test_auto_puts_int8_back_in_line_at_its_measured_speed(unet) -> None:
    """int8 within the error but predicted far faster than its measured speed-up over fp32
    gives: it goes back in line at fp32's rate times that speed-up, and bf16, predicted
    faster than that, is measured and taken; int8 is not measured twice."""
    model, sample, _, _ = unet
    got = settle("auto", model, _candidates(int8=1e12, bf16=1e11, fp32=1e6), sample,
                 max_error=1.0)  # random weights: every precision within
    rows = got.records["precision_auto"]["candidates"]
    assert rows[0]["precision"] == "int8" and rows[0]["within"]
    assert "measured_voxels_per_second" in rows[0]  # its rate revised down
    assert got.precision == "bf16" and "int8" not in got.records
    assert [r["precision"] for r in rows] == ["int8", "bf16", "fp32"]
    assert rows[2]["measured"] is False
    assert "by its measured speed-up over fp32" in auto_line(got.records["precision_auto"])


def test_auto_passes_over_a_bf16_plan_that_runs_fp32_kernels() -> None:
    """A bf16 plan with no compiled network is fp32's plan: not a candidate of its own."""
    from dataclasses import dataclass

    from znni.engine.precision_run import candidates_of

    @dataclass
    class Planned:  # what graph_choice.GraphChoice gives candidates_of
        window: tuple[int, int, int]
        predicted_voxels_per_second: float
        precision: str

    plans = {"fp32": Planned(WINDOW, 1e6, "fp32"), "bf16": Planned(WINDOW, 1e6, "fp32"),
             "int8": Planned(WINDOW, 2e6, "int8")}
    assert sorted(candidates_of(plans)) == ["fp32", "int8"]
    plans["bf16"] = Planned(WINDOW, 3e6, "bf16")
    assert candidates_of(plans)["bf16"] == Candidate("bf16", WINDOW, 3e6)


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
