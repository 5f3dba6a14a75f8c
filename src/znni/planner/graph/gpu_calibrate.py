"""Calibration of the GPU primitives on a device (a CUDA device, or the numpy stand-in).

A few convs, each timed through primitives/gpu/conv_dispatch.device_conv (the primitives
the GPU graph executor runs), give the GpuProfile's rates: the device's memory bandwidth
(one large copy), its host->device rate (a pinned upload), the launch cost (a tiny conv),
and per primitive the multiplier of its compute rates with which gpu_costs' model gives
the measured time at compute-bound shapes (fit_multiplier): the rates are divided by it
(cuDNN and the GEMM loop per precision the device computes in; cuFFT's transform and
product rates together). Where memory traffic and launches alone explain the time, the
rate stays as it was. A few seconds on a GPU; the rates are cached by GPU name in their
own file beside the CPU's (gpu_cache_path), whenever calibrate.calibrated_profile runs.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from znni.model.graph import Graph, Node
from znni.planner.graph.gpu_costs import conv_costs
from znni.planner.machine import GpuProfile

log = logging.getLogger(__name__)

# (Cin, Cout, kernel, output side): compute-bound on a GPU; the quick ones for tests and
# the stand-in, whose "device" is numpy on the host
CUDNN_SHAPES = ((32, 32, 3, 48), (16, 16, 3, 64))
GEMM_SHAPES = ((16, 16, 3, 48),)
FFT_SHAPES = ((16, 16, 5, 48),)
QUICK_CUDNN_SHAPES, QUICK_GEMM_SHAPES, QUICK_FFT_SHAPES = ((4, 4, 3, 12),), ((4, 4, 3, 8),), \
    ((4, 4, 5, 12),)
COPY_BYTES, QUICK_COPY_BYTES = 2**28, 2**22
REPEATS = 3  # timed after a warm-up; the median counts
MULTIPLIER_RANGE = (1e-6, 1e9)  # of the default rates: an H100's to a numpy stand-in's
BISECTIONS = 60


def gpu_rates(gpu: GpuProfile, device: Any, precisions: tuple[str, ...] = ("fp32",),
              quick: bool = False) -> GpuProfile:
    """`gpu` with its rates measured on `device` (a primitives/gpu Device), for
    `precisions` (the others keep their defaults); ValueError without conv_dispatch."""
    try:
        from znni.primitives.gpu.conv_dispatch import release_conv_caches
    except ImportError as e:  # the GPU graph primitives are not in this build
        raise ValueError(f"the GPU conv primitives cannot be calibrated here ({e})") from e
    try:
        return _measured(gpu, device, precisions, quick)
    finally:
        release_conv_caches(device)  # the calibration's kept spectra and plan-cache bound


def _measured(gpu: GpuProfile, device: Any, precisions: tuple[str, ...],
              quick: bool) -> GpuProfile:
    from znni.primitives.gpu.conv_dispatch import cudnn_available, device_conv

    copy = QUICK_COPY_BYTES if quick else COPY_BYTES
    gpu = replace(gpu, memory_bytes_per_s=_copy_rate(device, copy),
                  transfer_bytes_per_s=_upload_rate(device, copy))
    tiny = _conv_case(1, 1, 1, 4)  # one kernel offset: the GEMM loop's two launches
    launches_s = _time_conv(device, device_conv, "gemm-loop", tiny, "fp32")
    if launches_s is not None:
        gpu = replace(gpu, layer_overhead_s=launches_s / 2)
    has_cudnn = cudnn_available(device)
    cudnn, gemm = dict(gpu.cudnn_flops_per_s), dict(gpu.gemm_flops_per_s)
    for precision in precisions:
        if has_cudnn:
            m = _multiplier(gpu, device, device_conv, "cudnn", precision,
                            QUICK_CUDNN_SHAPES if quick else CUDNN_SHAPES)
            cudnn[precision] /= m
        gemm[precision] /= _multiplier(gpu, device, device_conv, "gemm-loop", precision,
                                       QUICK_GEMM_SHAPES if quick else GEMM_SHAPES)
    m = _multiplier(gpu, device, device_conv, "cufft-keep", "fp32",
                    QUICK_FFT_SHAPES if quick else FFT_SHAPES)
    return replace(gpu, has_cudnn=has_cudnn, cudnn_flops_per_s=cudnn, gemm_flops_per_s=gemm,
                   fft_flops_per_s=gpu.fft_flops_per_s / m,
                   madd_flops_per_s=gpu.madd_flops_per_s / m, calibrated=True)


def _median_s(device: Any, fn: Callable[[], object]) -> float:
    fn()
    device.synchronize()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        device.synchronize()
        times.append(time.perf_counter() - t0)
    return max(1e-9, statistics.median(times))


def _copy_rate(device: Any, nbytes: int) -> float:
    """Bytes read and written per second by one device-to-device copy."""
    xp = device.xp
    a = xp.zeros(nbytes // 4, dtype=np.float32)
    b = xp.empty_like(a)

    def copy() -> None:
        b[...] = a

    return 2 * nbytes / _median_s(device, copy)


def _upload_rate(device: Any, nbytes: int) -> float:
    """Host->device bytes per second from a pinned buffer on the copy stream."""
    host = device.pinned((nbytes // 4,), np.float32)
    host[...] = 0
    dst = device.xp.empty(nbytes // 4, dtype=np.float32)
    stream = device.stream("copy")
    return nbytes / _median_s(device, lambda: device.copy_to_device(dst, host, stream))


def _conv_case(cin: int, cout: int, k: int, side: int) -> Graph:
    """A one-node graph: a k^3 conv of `cin` -> `cout` channels with `side`^3 outputs."""
    rng = np.random.default_rng(0)
    n = side + k - 1
    params = {"weight": rng.standard_normal((cout, cin, k, k, k)).astype(np.float32),
              "bias": np.zeros(cout, np.float32), "strides": (1, 1, 1), "pads": (0,) * 6,
              "dilations": (1, 1, 1), "group": 1}
    node = Node("conv", "conv", ("x",), ("y",), params)
    return Graph("calibration", "x", cin, (n, n, n), (node,), "y", cout, (side,) * 3, "",
                 {"x": (1, cin, n, n, n), "y": (1, cout, side, side, side)})


def _time_conv(device: Any, device_conv: Callable[..., Any], primitive: str, graph: Graph,
               precision: str) -> float | None:
    """Median seconds of one `primitive` call on the graph's conv at `precision`; None
    where conv_dispatch ran another primitive instead (a fallback: not this one's rate)."""
    from znni.primitives.gpu.conv_dispatch import conv_state
    from znni.primitives.precision import storage_dtype

    xp, dtype = device.xp, storage_dtype(precision)
    node = graph.nodes[0]
    rng = np.random.default_rng(1)
    x = xp.asarray(rng.standard_normal(graph.shapes["x"]).astype(np.float32).astype(dtype))
    params = {**node.params, "weight": xp.asarray(node.params["weight"].astype(dtype)),
              "bias": xp.asarray(node.params["bias"])}
    key = ("calibration", primitive, precision, graph.shapes["x"])  # its kept spectra

    def run() -> None:
        device.free(device_conv(device, primitive, x, params, precision=precision, key=key))

    ran = conv_state(device).ran
    before = sum(n for name, n in ran.items() if name.startswith(primitive))
    seconds = _median_s(device, run)
    after = sum(n for name, n in ran.items() if name.startswith(primitive))
    return seconds if after - before == REPEATS + 1 else None  # "cudnn" or "cudnn-standin"


def _scaled(gpu: GpuProfile, primitive: str, factor: float) -> GpuProfile:
    """`gpu` with `primitive`'s compute rates times `factor`."""
    if primitive == "cudnn":
        return replace(gpu, cudnn_flops_per_s={k: v * factor
                                               for k, v in gpu.cudnn_flops_per_s.items()})
    if primitive == "gemm-loop":
        return replace(gpu, gemm_flops_per_s={k: v * factor
                                              for k, v in gpu.gemm_flops_per_s.items()})
    return replace(gpu, fft_flops_per_s=gpu.fft_flops_per_s * factor,
                   madd_flops_per_s=gpu.madd_flops_per_s * factor)


def _modelled_s(gpu: GpuProfile, graph: Graph, primitive: str, precision: str) -> float:
    return next(c.seconds for c in conv_costs(graph, graph.nodes[0], gpu, precision)
                if c.primitive == primitive)


def fit_multiplier(gpu: GpuProfile, graph: Graph, primitive: str, precision: str,
                   measured_s: float) -> float | None:
    """m such that the model with `primitive`'s compute rates divided by m gives
    `measured_s` (the model's time rises with m: geometric bisection); None where even
    unbounded compute is modelled slower than measured (memory traffic and launches
    alone explain the time: the rate cannot be told)."""
    def model(m: float) -> float:
        return _modelled_s(_scaled(gpu, primitive, 1 / m), graph, primitive, precision)

    lo, hi = MULTIPLIER_RANGE
    if model(lo) >= measured_s:
        return None
    if model(hi) <= measured_s:
        return hi
    for _ in range(BISECTIONS):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if model(mid) < measured_s else (lo, mid)
    return (lo * hi) ** 0.5


def _multiplier(gpu: GpuProfile, device: Any, device_conv: Callable[..., Any],
                primitive: str, precision: str,
                shapes: tuple[tuple[int, int, int, int], ...]) -> float:
    """Median over `shapes` of fit_multiplier; 1 where no shape tells the rate."""
    ratios = []
    for cin, cout, k, side in shapes:
        graph = _conv_case(cin, cout, k, side)
        measured = _time_conv(device, device_conv, primitive, graph, precision)
        if measured is None:
            log.warning("GPU %s %s %s fell back to another primitive; not timed", primitive,
                        precision, (cin, cout, k, side))
            continue
        m = fit_multiplier(gpu, graph, primitive, precision, measured)
        log.info("GPU %s %s %s: %.3g s measured, %.3g s modelled, multiplier %s", primitive,
                 precision, (cin, cout, k, side), measured,
                 _modelled_s(gpu, graph, primitive, precision), m)
        if m is not None:
            ratios.append(m)
    return float(statistics.median(ratios)) if ratios else 1.0


# GpuProfile fields a calibration measures (cached by GPU name beside the CPU's rates)
MEASURED_FIELDS = ("memory_bytes_per_s", "transfer_bytes_per_s", "layer_overhead_s",
                   "fft_flops_per_s", "madd_flops_per_s", "has_cudnn", "cudnn_flops_per_s",
                   "gemm_flops_per_s", "calibrated")


GPU_CACHE_VERSION = 1  # bump when the GPU rates change meaning; older caches re-measured


def gpu_cache_path() -> Path:
    """This host's GPU rates, by GPU name, beside the CPU's (calibrate.cache_path)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "znni" / f"gpus-{os.uname().nodename}.json"


def cached_gpu_rates(gpus: tuple[GpuProfile, ...], *, measure: bool,
                     quick: bool = False) -> tuple[GpuProfile, ...]:
    """`gpus` with the rates cached for them (gpu_cache_path), the first one measured now
    where `measure` and it has none (and then cached; not in a quick calibration)."""
    if not gpus:
        return gpus
    path = gpu_cache_path()
    cached: dict[str, Any] = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("version") == GPU_CACHE_VERSION and isinstance(data.get("gpus"), dict):
                cached = data["gpus"]
        except (ValueError, OSError) as e:
            log.warning("ignoring unreadable GPU calibration cache %s: %s", path, e)
    known = dict(cached)
    out = calibrated_gpus(gpus, known, measure=measure, quick=quick)
    if known != cached and not quick:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # readers never see half
        tmp.write_text(json.dumps({"version": GPU_CACHE_VERSION, "gpus": known}))
        tmp.replace(path)
    return out


def calibrated_gpus(gpus: tuple[GpuProfile, ...], cached: dict[str, Any], *, measure: bool,
                    quick: bool = False) -> tuple[GpuProfile, ...]:
    """`gpus` with their cached rates (`cached`: GPU name -> measured fields), the first one
    (the device the planner plans) measured where none are cached and `measure`; what is
    measured is added to `cached`. A device that cannot be calibrated keeps its defaults
    (logged)."""
    out = []
    for i, gpu in enumerate(gpus):
        entry = cached.get(gpu.name)
        if entry is None and measure and i == 0:
            try:
                measured = _measure_cuda(gpu, i, quick)
            except (ValueError, RuntimeError, ImportError, MemoryError) as e:
                log.warning("GPU %s could not be calibrated (%s); its default rates are kept",
                            gpu.name, e)
            else:
                entry = cached[gpu.name] = {f: getattr(measured, f) for f in MEASURED_FIELDS}
        if isinstance(entry, dict):
            gpu = replace(gpu, **{f: entry[f] for f in MEASURED_FIELDS if f in entry})
        out.append(gpu)
    return tuple(out)


def _measure_cuda(gpu: GpuProfile, device_id: int, quick: bool) -> GpuProfile:
    """`gpu_rates` on CUDA device `device_id` at the precisions it computes in."""
    from znni.primitives.gpu import supported_precisions
    from znni.primitives.gpu.cupy_device import CupyDevice

    log.info("calibrating the GPU primitives on %s (once; cached)", gpu.name)
    device = CupyDevice(memory_cap_bytes=gpu.memory_bytes // 2, device_id=device_id)
    try:
        return gpu_rates(gpu, device, supported_precisions(device_id) or ("fp32",), quick)
    finally:
        device.close()
