"""GPU calibration: rates measured through conv_dispatch.device_conv on the stand-in device,
the model's multiplier recovered from a time, and the cache of rates by GPU name."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from znni.planner.graph import gpu_calibrate
from znni.planner.graph.gpu_calibrate import (
    MEASURED_FIELDS,
    _conv_case,
    _modelled_s,
    _scaled,
    calibrated_gpus,
    fit_multiplier,
    gpu_rates,
)
from znni.planner.machine import GpuProfile, MachineProfile


def test_the_multiplier_is_the_one_the_model_needs() -> None:
    gpu = MachineProfile.load("h100-host").gpu
    graph = _conv_case(32, 32, 3, 48)
    for primitive in ("cudnn", "gemm-loop", "cufft-keep"):
        slower = _modelled_s(_scaled(gpu, primitive, 1 / 40), graph, primitive, "fp32")
        assert fit_multiplier(gpu, graph, primitive, "fp32", slower) == pytest.approx(40, 1e-3)
    # faster than its memory traffic alone: the rate cannot be told
    assert fit_multiplier(gpu, graph, "cudnn", "fp32", 1e-12) is None


def test_the_standin_is_calibrated_through_device_conv() -> None:
    pytest.importorskip("znni.primitives.gpu.conv_dispatch")
    from znni.primitives.gpu.device import HostDevice

    default = GpuProfile("stand-in", 2**30)
    device = HostDevice(2**30)
    measured = gpu_rates(default, device, ("fp32", "fp16"), quick=True)
    assert device.in_use_bytes == 0  # every output freed, the conv caches given back
    assert measured.calibrated and measured.has_cudnn  # the stand-in's cuDNN
    for name in ("memory_bytes_per_s", "transfer_bytes_per_s", "layer_overhead_s"):
        assert getattr(measured, name) > 0 and getattr(measured, name) != getattr(default, name)
    assert measured.cudnn_flops_per_s["bf16"] == default.cudnn_flops_per_s["bf16"]  # not asked


def test_rates_are_cached_by_gpu_name(monkeypatch) -> None:
    gpu = GpuProfile("NVIDIA X", 2**34)
    fast = replace(gpu, memory_bytes_per_s=1e13, calibrated=True)
    calls = []

    def measure(g: GpuProfile, device_id: int, quick: bool) -> GpuProfile:
        calls.append(device_id)
        return fast

    monkeypatch.setattr(gpu_calibrate, "_measure_cuda", measure)
    cache: dict = {}
    assert calibrated_gpus((gpu,), cache, measure=False) == (gpu,)  # never measures
    (out,) = calibrated_gpus((gpu,), cache, measure=True)
    assert out == fast and set(cache["NVIDIA X"]) == set(MEASURED_FIELDS) and calls == [0]
    (again,) = calibrated_gpus((gpu,), cache, measure=True)
    assert again == fast and calls == [0]  # from the cache


def test_a_gpu_that_cannot_be_calibrated_keeps_its_defaults(monkeypatch, caplog) -> None:
    def broken(g: GpuProfile, device_id: int, quick: bool) -> GpuProfile:
        raise RuntimeError("no cuDNN here")

    monkeypatch.setattr(gpu_calibrate, "_measure_cuda", broken)
    gpu = GpuProfile("NVIDIA Y", 2**34)
    cache: dict = {}
    gpu_calibrate.log.disabled = False  # whatever another test's logging setup did to it
    with caplog.at_level(logging.WARNING, logger=gpu_calibrate.log.name):
        assert calibrated_gpus((gpu,), cache, measure=True) == (gpu,) and cache == {}
    assert "could not be calibrated" in caplog.text


def test_the_gpus_rates_are_cached_beside_the_cpus(monkeypatch, tmp_path) -> None:
    import json

    from znni.planner.calibrate import CACHE_VERSION, cache_path, calibrated_profile
    from znni.planner.graph.gpu_calibrate import gpu_cache_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine = MachineProfile.load("ci-2core")
    path = cache_path(machine.cores)
    path.parent.mkdir(parents=True)
    cpu_cache = {"version": CACHE_VERSION, "cpu_rates": machine.cpu_rates, "cpu_scaling": {},
                 "base_rss_bytes": 1}
    path.write_text(json.dumps(cpu_cache))
    gpu = GpuProfile("NVIDIA Z", 2**34)
    fast = replace(gpu, transfer_bytes_per_s=5e10, calibrated=True)
    monkeypatch.setattr(gpu_calibrate, "_measure_cuda", lambda g, i, q: fast)
    with_gpu = replace(machine, gpus=(gpu,))
    assert calibrated_profile(with_gpu, measure=False).gpu == gpu  # never measures
    assert calibrated_profile(with_gpu, measure=True).gpu == fast
    cached = json.loads(gpu_cache_path().read_text())["gpus"]["NVIDIA Z"]
    assert cached["transfer_bytes_per_s"] == 5e10
    assert json.loads(path.read_text()) == cpu_cache  # the CPU's file is left as it was
    monkeypatch.setattr(gpu_calibrate, "_measure_cuda", None)  # never measured again
    assert calibrated_profile(with_gpu, measure=True).gpu == fast
    path.unlink()  # no CPU rates cached: the GPU's still apply
    assert calibrated_profile(with_gpu, measure=False).gpu == fast


def test_znni_plan_measures_this_machines_gpu_once(monkeypatch, tmp_path) -> None:
    from znni.planner import detect
    from znni.planner.graph.gpu_calibrate import gpu_cache_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("znni.primitives.gpu.device_info", lambda: [
        {"name": "NVIDIA Q", "memory_bytes": 2**35, "free_bytes": 2**34}])
    calls = []

    def measure(g: GpuProfile, device_id: int, quick: bool) -> GpuProfile:
        calls.append(g.name)
        return replace(g, calibrated=True)

    monkeypatch.setattr(gpu_calibrate, "_measure_cuda", measure)
    detect.calibrate_gpus()
    detect.calibrate_gpus()
    assert calls == ["NVIDIA Q"] and "NVIDIA Q" in gpu_cache_path().read_text()
    assert detect.detect_machine(calibrate=None).gpu.calibrated


def test_a_fallback_is_not_timed_as_the_primitive_asked() -> None:
    dispatch = pytest.importorskip("znni.primitives.gpu.conv_dispatch")
    from znni.planner.graph.gpu_calibrate import _time_conv
    from znni.primitives.gpu.device import HostDevice

    device = HostDevice(2**30)
    dispatch.conv_state(device).set_library(None)  # no cuDNN: "cudnn" runs the GEMM loop
    graph = _conv_case(2, 2, 3, 6)
    assert _time_conv(device, dispatch.device_conv, "cudnn", graph, "fp32") is None
    assert _time_conv(device, dispatch.device_conv, "gemm-loop", graph, "fp32") is not None
    measured = gpu_rates(GpuProfile("no cuDNN", 2**30), device, quick=True)
    assert not measured.has_cudnn
