"""The planner's int8: its conv speed-up calibrated on OpenVINO's own int8 conv (which must
really run in 8 bits), the compiled network charged at it, and an int8 plan that is always
the compiled network, refused in one sentence where that network does not fit."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from znni.engine.compute.graph_choice import plan_window
from znni.model.onnx_model import load_onnx_model
from znni.planner.graph import calibrate as graph_calibrate
from znni.planner.graph.network_costs import conv_speedup, network_window_seconds
from znni.planner.machine import MachineProfile

pytest.importorskip("openvino")


def _ci(**rates: float) -> MachineProfile:
    ci = MachineProfile.load("ci-2core")
    return replace(ci, cpu_rates={**ci.cpu_rates, **rates})


def test_the_quantized_conv_runs_in_eight_bits_and_matches_fp32() -> None:
    """The calibration's int8 conv is an int8 conv (OpenVINO's runtime precision u8), and
    it computes the same conv as the fp32 one: its mean error within 1% of the output's
    range (0.4% measured on an AMD Zen 4 host; single voxels reached 11%, the kernel's own
    rounding: the calibration only times it)."""
    from znni.primitives.cpu.openvino_quantized_conv import compiled_conv

    fp32, p32 = compiled_conv(8, 8, 6, int8=False)
    int8, p8 = compiled_conv(8, 8, 6, int8=True)
    assert p32 == "f32" and p8 in ("u8", "i8")
    a, b = (np.asarray(next(iter(run().values()))) for run in (fp32, int8))
    assert a.shape == b.shape == (1, 8, 6, 6, 6)
    assert 0 < np.abs(a - b).mean() <= 0.01 * (a.max() - a.min())


def test_int8_rates_measures_a_speedup_on_this_machine() -> None:
    rates = graph_calibrate.int8_rates(((8, 8, 8),))
    assert set(rates) == {"openvino_int8_speedup"}
    assert math.isfinite(rates["openvino_int8_speedup"]) and rates["openvino_int8_speedup"] > 0


def test_the_network_is_charged_at_the_calibrated_speedup(onnx_models) -> None:
    model = load_onnx_model(onnx_models.path("basicunet"))
    graph = model.graph(onnx_models.window("basicunet"))
    slow, fast = _ci(openvino_int8_speedup=1.0), _ci(openvino_int8_speedup=3.0)
    assert conv_speedup(fast, "int8") == 3.0 and conv_speedup(fast, "fp32") == 1.0
    same = network_window_seconds(graph, slow, precision="fp32")
    assert network_window_seconds(graph, slow, precision="int8") == pytest.approx(same)
    assert network_window_seconds(graph, fast, precision="int8") < same


def test_an_int8_plan_is_the_compiled_network_even_where_ours_predicts_faster(
        onnx_models) -> None:
    model = load_onnx_model(onnx_models.path("basicunet"))
    window, region = (32, 64, 64), (64, 128, 128)
    slow_openvino = _ci(openvino_flops_per_s=1e8)  # our executor predicts far faster
    fp32 = plan_window(model, window, 2**31, region, 0.25, slow_openvino).plan
    int8 = plan_window(model, window, 2**31, region, 0.25, slow_openvino,
                       precision="int8").plan
    assert fp32.compiled == "" and int8.compiled == "openvino-network"
    assert int8.precision == "int8"


def test_an_int8_network_beyond_the_budget_is_refused_in_one_sentence(onnx_models) -> None:
    model = load_onnx_model(onnx_models.path("basicunet"))
    graph = model.graph((32, 64, 64))
    budget = graph.peak_tensor_bytes() * 2  # our executor fits; the compiled network not
    try:
        plan_window(model, (32, 64, 64), budget, (64, 128, 128), 0.25, _ci(),
                    precision="fp32")
    except ValueError:
        pytest.skip("this budget fits neither plan")
    with pytest.raises(ValueError, match=r"^--precision int8 runs model .* as one OpenVINO "
                       r"network, which needs [\d,]+ bytes .* beyond the [\d,]+-byte budget"):
        plan_window(model, (32, 64, 64), budget, (64, 128, 128), 0.25, _ci(),
                    precision="int8")
