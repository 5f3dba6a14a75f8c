"""The whole window compiled by OpenVINO ("openvino-network"): the same outputs as our
node-by-node executor (1e-4 in fp32; bf16 within its bound), batches padded, the planner's
choice between the two by predicted time, and whole segment runs either way."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import zarr
from support.engine_ref import write_volume
from support.naive import close

from znni.engine.compute.compiled_forward import CompiledForward
from znni.engine.compute.graph_choice import plan_window
from znni.engine.compute.graph_forward import run_graph
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.loading import load_model
from znni.model.onnx_model import load_onnx_model
from znni.planner.machine import MachineProfile
from znni.primitives.backends import make_backend
from znni.primitives.cpu import openvino_network

pytest.importorskip("openvino")
# bf16 keeps 8 mantissa bits: the bound, max error within 5% of the output's range
# and mean within 1% (BasicUNet 64^3 measured 0.6% and 0.05% on an AMD Zen 4 host)
BF16_MAX, BF16_MEAN = 0.05, 0.01


def _model_graph(onnx_models, name):
    model = load_onnx_model(onnx_models.path(name))
    return model, model.graph(onnx_models.window(name))


@pytest.mark.parametrize("name, batch, n", [("basicunet", 1, 1), ("basicunet", 2, 1),
                                            ("unet", 2, 2), ("validunet", 1, 1)])
def test_the_compiled_network_equals_our_executor(onnx_models, name, batch, n) -> None:
    model, graph = _model_graph(onnx_models, name)
    x = np.random.default_rng(0).standard_normal((n, 1, *graph.window)).astype(np.float32)
    want = run_graph(graph, x, make_backend("cpu"))
    got = CompiledForward(model.path, graph, batch, "fp32")(x)  # n < batch: padded
    assert got.shape == want.shape and close(got, want)


def test_bf16_is_within_its_bound(onnx_models, monkeypatch) -> None:
    model, graph = _model_graph(onnx_models, "basicunet")
    x = np.random.default_rng(1).standard_normal((1, 1, *graph.window)).astype(np.float32)
    want = run_graph(graph, x, make_backend("cpu"))
    got = CompiledForward(model.path, graph, 1, "bf16")(x)
    span = float(want.max() - want.min())
    err = np.abs(got - want)
    assert err.max() <= BF16_MAX * span and err.mean() <= BF16_MEAN * span


def test_bf16_without_bf16_units_runs_fp32_and_says_so(onnx_models, monkeypatch,
                                                        caplog) -> None:
    model, graph = _model_graph(onnx_models, "unet")
    monkeypatch.setattr(openvino_network, "cpu_has_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="znni.primitives"):
        net = openvino_network.OpenVinoNetwork(model.path, (1, 1, *graph.window),
                                               graph.output, "bf16")
    assert net.inference_precision == "f32" and "runs in fp32" in caplog.text


def test_the_planner_picks_by_predicted_time(onnx_models, monkeypatch) -> None:
    """Given a profile, the pick is deterministic; a fast OpenVINO rate picks the compiled
    network, a slow one our executor, and without OpenVINO our executor always."""
    model, _ = _model_graph(onnx_models, "basicunet")
    ci = MachineProfile.load("ci-2core")
    window, region = (32, 64, 64), (64, 128, 128)

    def plan(rate: float):
        machine = replace(ci, cpu_rates={**ci.cpu_rates, "openvino_flops_per_s": rate})
        return plan_window(model, window, 2**31, region, 0.25, machine).plan

    fast, slow = plan(1e13), plan(1e8)
    assert fast.compiled == "openvino-network" and fast.alternative_s > fast.predicted_window_s
    assert slow.compiled == "" and plan(1e8) == slow
    monkeypatch.setattr("znni.planner.graph.network_costs.openvino_ready", lambda: False)
    assert plan(1e13).compiled == ""


def test_segment_runs_the_compiled_network_as_our_executor_would(onnx_models, tmp_path,
                                                                 monkeypatch) -> None:
    vol = np.random.default_rng(3).random((21, 45, 38), dtype=np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (7, 15, 19))
    model = load_model(onnx_models.path("basicunet"))

    def run(name: str):
        job = SegmentJob(model, inp, str(tmp_path / name), chunks=(7, 15, 19),
                         block=(14, 30, 19), window=(16, 32, 32))
        report = segment(job)
        runs[name] = report.plan
        return report.plan["compiled"], zarr.open_array(str(tmp_path / name))[...]

    runs: dict[str, dict] = {}

    fast = replace(MachineProfile.load("ci-2core"), cpu_rates={
        **MachineProfile.load("ci-2core").cpu_rates, "openvino_flops_per_s": 1e13})
    monkeypatch.setattr("znni.engine.compute.graph_choice.planning_machine", lambda: fast)
    for once in ("NETWORK_COMPILE_S", "OPENVINO_IMPORT_S"):  # a tiny run: the import and
        monkeypatch.setattr(f"znni.planner.graph.search.{once}", 0.0)  # compile would
    compiled, got = run("compiled.zarr")  # outweigh its eight windows
    monkeypatch.setattr("znni.planner.graph.network_costs.openvino_ready", lambda: False)
    ours, want = run("ours.zarr")
    assert compiled == "openvino-network" and ours == "" and close(got, want)
    plan = runs["compiled.zarr"]
    ran = plan["compiled_ran"]  # what really ran, timed: one call per batch of windows
    assert ran["runtime"] == "openvino" and ran["precision"] == "f32"
    assert ran["batch"] == plan["batch"] and ran["calls"] == -(-plan["windows"] // plan["batch"])
    assert 0 < ran["first_s"] and 0 < ran["steady_s"] and 0 < ran["compile_s"]
    assert ran["compile_wait_s"] >= 0  # times are reported, never compared (noisy hosts)
    assert "compiled_ran" not in runs["ours.zarr"]  # our executor: nothing compiled


def test_the_compiled_run_summary_line() -> None:
    from znni.cli.segment import compiled_summary

    ran = {"runtime": "openvino", "precision": "bf16", "batch": 2, "compile_s": 0.19,
           "compile_wait_s": 0.15, "first_s": 0.08, "steady_s": 0.05, "calls": 27}
    assert compiled_summary(ran) == (
        "OpenVINO network at bf16, batch 2: compiled in 0.19 s, the first window waited "
        "0.15 s for it; first call 0.080 s, then 0.050 s median over 26 (1.60x)")
    one = compiled_summary({**ran, "steady_s": None, "calls": 1})
    assert one.endswith("first call 0.080 s")


def test_a_network_openvino_cannot_compile_runs_on_our_kernels(onnx_models, tmp_path,
                                                               monkeypatch, caplog) -> None:
    """OpenVINO refusing the model (an op it lacks, a broken install) is no failed run: the
    worker says so once and runs the window on our executor."""
    from znni.engine.compute.windows import WindowGrid
    from znni.engine.workers.windowed import WindowedSpec, WindowedWorker

    vol = np.random.default_rng(4).random((16, 32, 32), dtype=np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (16, 32, 32))
    model = load_model(onnx_models.path("basicunet"))
    grid = WindowGrid.for_volume(vol.shape, (16, 32, 32), 0.25)

    def refuse(*args, **kwargs):
        raise RuntimeError("Exception from src/core: unsupported operation")

    monkeypatch.setattr(openvino_network, "OpenVinoNetwork", refuse)
    monkeypatch.setattr(openvino_network, "NETWORKS", openvino_network.CompiledNetworks())
    spec = WindowedSpec(model, Location.parse(inp), Location.parse(tmp_path / "o.zarr"),
                        "float32", grid, "gaussian",
                        compiled="openvino-network")
    worker = WindowedWorker(spec)
    x = vol[None].astype(np.float32)[None]  # (1, 1, Z, Y, X): the one window
    with caplog.at_level(logging.WARNING, logger="znni.engine"):
        got = worker.forward(x)
    assert "our own kernels run it instead" in caplog.text and worker.compiled is None
    assert close(got, run_graph(model.graph((16, 32, 32)), x, make_backend("cpu")))


def _profile(monkeypatch, openvino_flops_per_s: float) -> None:
    """Plan on ci-2core with OpenVINO's conv rate set, and no one-off import or compile."""
    base = MachineProfile.load("ci-2core")
    machine = replace(base, cpu_rates={**base.cpu_rates,
                                       "openvino_flops_per_s": openvino_flops_per_s})
    monkeypatch.setattr("znni.engine.compute.graph_choice.planning_machine", lambda: machine)
    for once in ("NETWORK_COMPILE_S", "OPENVINO_IMPORT_S"):
        monkeypatch.setattr(f"znni.planner.graph.search.{once}", 0.0)


def _watched_run(onnx_models, tmp_path, monkeypatch, **kw):
    """A windowed segment run that records, in order, each compile started and the input's
    opening; (events, report, the process's networks afterwards, the output)."""
    import znni.engine.segment as segment_module

    networks, events = openvino_network.CompiledNetworks(), []
    start, opened = networks.start, segment_module.open_input

    def watched_start(*key):
        events.append(("compile", key[1]))
        return start(*key)

    def watched_open(*a, **k):
        events.append(("open", None))
        return opened(*a, **k)

    monkeypatch.setattr(networks, "start", watched_start)
    monkeypatch.setattr(openvino_network, "NETWORKS", networks)
    monkeypatch.setattr(segment_module, "open_input", watched_open)
    vol = np.random.default_rng(5).random((21, 45, 38), dtype=np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (7, 15, 19))
    model = load_model(onnx_models.path("basicunet"))
    out = str(tmp_path / "out.zarr")
    job = SegmentJob(model, inp, out, chunks=(7, 15, 19), window=(16, 32, 32), **kw)
    return events, segment(job), networks, zarr.open_array(out)[...], model


def test_a_given_windows_compile_starts_before_the_volume_opens(onnx_models, tmp_path,
                                                                monkeypatch) -> None:
    """With --window the whole window's compile starts before the input is opened (the plan
    needs its shape), and the run uses that network: one compile, the one prefetched."""
    _profile(monkeypatch, 1e13)  # OpenVINO fast: the planner picks the network, batch 1
    monkeypatch.setattr("znni.engine.compute.graph_choice.BATCHES", (1,))
    events, report, networks, _, model = _watched_run(onnx_models, tmp_path, monkeypatch)
    shape = (1, 1, 16, 32, 32)
    assert report.plan["compiled"] == "openvino-network" and report.plan["batch"] == 1
    assert events[0] == ("compile", shape) and events[1] == ("open", None)
    assert (model.path, shape, model.graph((16, 32, 32)).output, "fp32", None) in networks
    assert report.plan["compiled_ran"]["calls"] == report.plan["windows"]


def test_a_prefetched_compile_the_plan_did_not_choose_is_dropped(onnx_models, tmp_path,
                                                                 monkeypatch) -> None:
    _profile(monkeypatch, 1e6)  # OpenVINO slow: the planner runs our kernels
    events, report, networks, got, model = _watched_run(onnx_models, tmp_path, monkeypatch)
    assert report.plan["compiled"] == "" and events[0] == ("compile", (1, 1, 16, 32, 32))
    output = model.graph((16, 32, 32)).output
    assert (model.path, (1, 1, 16, 32, 32), output, "fp32", None) not in networks
    assert "compiled_ran" not in report.plan


def test_no_compile_ahead_where_the_plan_would_want_another(onnx_models, tmp_path) -> None:
    from znni.engine.compute.compiled_forward import prefetch_compile

    model = load_model(onnx_models.path("basicunet"))
    job = SegmentJob(model, "in.zarr", "out.zarr", window=(16, 32, 32))
    for other in (dict(window=None), dict(tta="flips"), dict(scheduler="local:2"),
                  dict(device="gpu"), dict(precision="fp16")):
        assert prefetch_compile(replace(job, **other)) is None, other
