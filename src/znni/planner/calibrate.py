"""Calibration: measure the CPU primitives on this machine and fit the profile's rates.

Each primitive (direct, fft-keep, fft-recompute, MPF) runs through the real
CpuBackend at layer shapes whose working sets range from cache-resident
(~1 MB) to far beyond the caches (~400 MB). The counted work of costs.py per
run gives one linear equation  t = sum_j work_j / rate_j, solved in relative
least squares for the inverse rates. What one set of rates cannot say (big
layers stream from DRAM and fault in fresh pages, small ones run from cache)
is then fitted per primitive as a time factor linear in log(working set)
(MachineProfile.cpu_scaling). The graph primitives (Winograd, OpenVINO's conv,
instance norm, graph_ops' strided and transposed convs) are then fitted on their
models' own terms (graph/calibrate.py). Results are cached per machine in
$XDG_CACHE_HOME/znni, so a process calibrates once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from znni.model.network import LayerShape
from znni.planner.costs import Work, cpu_conv_work, other_work, working_set_bytes
from znni.planner.fitting import relative_multipliers
from znni.planner.machine import DEFAULT_CPU_RATES, MachineProfile

log = logging.getLogger(__name__)

# (S, f, f', k, n): first layers, deep layers at S = 1 and at fragment batches, and a few
# output layers (f' = 3); in cache, then the same kinds at 50-400 MB working sets, and
# 7^3 kernels (direct's column buffers grow with f*k^3), and few channels over many
# frequencies (the multiply-add's per-frequency products dominate).
FULL_SHAPES = ((1, 8, 8, 3, 20), (1, 1, 40, 3, 64), (1, 40, 40, 3, 40), (8, 40, 40, 3, 20),
               (1, 80, 80, 5, 32), (8, 32, 32, 5, 24), (64, 24, 24, 3, 12), (64, 80, 3, 3, 12),
               (1, 1, 80, 5, 112), (8, 80, 80, 3, 41), (1, 40, 40, 5, 64), (64, 80, 3, 3, 16),
               (64, 80, 80, 3, 21), (1, 80, 80, 7, 36), (8, 80, 80, 7, 29), (1, 4, 4, 3, 64),
               (1, 16, 16, 3, 64))
# FFT-only (direct is hopeless there and slow to time): fragment batches over several of
# fft_conv3d's sample chunks, each recomputing every kernel spectrum, with few output
# channels per chunk; the regime of n726's and n926's big 7^3 and 9^3 layers.
FFT_SHAPES = ((40, 80, 80, 9, 33), (24, 40, 40, 5, 41))
QUICK_SHAPES = ((1, 1, 8, 3, 20), (1, 8, 8, 3, 16), (8, 8, 8, 3, 10), (8, 8, 2, 3, 12))
# (S, C, n) of MPF with 2^3 windows, small to large
FULL_POOLS = ((1, 8, 63), (8, 16, 31), (8, 80, 51), (1, 80, 143))
QUICK_POOLS = ((1, 4, 31), (8, 4, 15))
SPECTRA_BYTES = 2**31  # the calibration backend's spectra cache (decides fft-keep tiling)
CACHE_VERSION = 16  # bump when the calibration changes meaning; older caches are re-measured


def cache_path(cores: int) -> Path:
    """Per host and core count; an OPENBLAS_CORETYPE override gets its own file, since it
    changes which GEMM kernels (and so the direct-conv rate) this process gets."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    blas = os.environ.get("OPENBLAS_CORETYPE", "").strip().lower()
    suffix = f"-blas-{''.join(c for c in blas if c.isalnum())}" if blas else ""
    return Path(base) / "znni" / f"machine-{os.uname().nodename}-{cores}cores{suffix}.json"


def calibrated_profile(
    profile: MachineProfile, *, quick: bool = False, measure: bool = True
) -> MachineProfile:
    """`profile` with measured rates and baseline RSS, from the cache or measured now.

    measure=False never measures: the cached rates if there are any, else `profile` as is.
    Its GPUs get their own cached rates (gpu_calibrate.cached_gpu_rates), measured where
    `measure` and none are cached.
    """
    from znni.planner.graph.gpu_calibrate import cached_gpu_rates

    out = _cpu_calibrated(profile, quick=quick, measure=measure)
    return replace(out, gpus=cached_gpu_rates(out.gpus, measure=measure, quick=quick))


def _cpu_calibrated(profile: MachineProfile, *, quick: bool, measure: bool) -> MachineProfile:
    """`profile` with its CPU rates and baseline RSS from the cache, or measured now."""
    path = cache_path(profile.cores)
    if path.is_file() and not quick:
        try:
            cached = json.loads(path.read_text())
            if cached.get("version") == CACHE_VERSION:
                return MachineProfile.from_dict({
                    **profile.to_dict(), "cpu_rates": cached["cpu_rates"],
                    "cpu_scaling": cached["cpu_scaling"],
                    "base_rss_bytes": int(cached["base_rss_bytes"]), "calibrated": True})
            log.info("calibration cache %s is from an older znni; not using it", path)
        except (ValueError, KeyError, TypeError, OSError) as e:
            log.warning("ignoring unreadable calibration cache %s: %s", path, e)
    if not measure:
        return profile
    log.info("calibrating the CPU primitives on this machine (once; cached in %s)", path)
    rows = measurements(QUICK_SHAPES if quick else FULL_SHAPES,
                        QUICK_POOLS if quick else FULL_POOLS, quick,
                        () if quick else FFT_SHAPES)
    rates = fit_rates([(w, t) for _, w, t, _ in rows], dict(DEFAULT_CPU_RATES))
    scaling = fit_scaling(rows, rates)
    from znni.planner.graph.calibrate import graph_rates

    rates = graph_rates(replace(profile, cpu_rates=rates), quick)
    out = replace(profile, cpu_rates=rates,
                  cpu_scaling={k: tuple((b, f) for b, f in v) for k, v in scaling.items()},
                  base_rss_bytes=baseline_rss_bytes(), calibrated=True)
    if not quick:
        _write_cache(path, {"version": CACHE_VERSION, "cpu_rates": rates,
                           "cpu_scaling": scaling, "base_rss_bytes": out.base_rss_bytes})
    return out


def _write_cache(path: Path, payload: dict[str, Any]) -> None:
    """`payload` as JSON at `path`, written to a temporary file and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # readers never see half
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


ConvShape = tuple[int, int, int, int, int]  # (batch S, Cin f, Cout g, kernel k, input side n)
PoolShape = tuple[int, int, int]  # (S, C, n) of an MPF with 2^3 windows


def _conv_shape(shape: ConvShape) -> LayerShape:
    """The layer of a calibration shape (batch S, Cin f, Cout g, kernel k, input side n)."""
    s, f, g, k, n = shape
    return LayerShape(0, "conv", s, f, (n, n, n), s, g, (n - k + 1,) * 3, (k, k, k))


def _timed(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm: FFTW plans, kept spectra, workspaces
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


Row = tuple[str, Work, float, int]  # (scaling key, counted work, seconds, working-set bytes)


def measurements(shapes: Sequence[ConvShape], pools: Sequence[PoolShape], quick: bool,
                 fft_shapes: Sequence[ConvShape] = ()) -> list[Row]:
    """One row per primitive at every conv shape, per FFT primitive at every `fft_shapes`
    shape (timed once after the warm-up: seconds each), plus MPF at every pool shape."""
    from znni.primitives.backends import make_backend

    effort = "FFTW_ESTIMATE" if quick else "FFTW_MEASURE"
    backend = make_backend("cpu", fft_effort=effort, spectra_cache_bytes=SPECTRA_BYTES)
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    repeats = 1 if quick else 2
    runs: list[tuple[ConvShape, tuple[str, ...], int]] = [
        (shape, ("direct", "fft-keep", "fft-recompute"), repeats) for shape in shapes]
    runs += [(shape, ("fft-keep", "fft-recompute"), 1) for shape in fft_shapes]
    for (s, f, g, k, n), prims, reps in runs:
        x = rng.standard_normal((s, f, n, n, n), dtype=np.float32)
        w = rng.standard_normal((g, f, k, k, k), dtype=np.float32)
        b = np.zeros(g, np.float32)
        sh = _conv_shape((s, f, g, k, n))
        for prim in prims:
            t = _timed(partial(backend.conv3d, x, w, b, None, prim), reps)
            rows.append((prim, cpu_conv_work(sh, prim, SPECTRA_BYTES), t, working_set_bytes(sh)))
        del x
    for s, c, n in pools:
        x = rng.standard_normal((s, c, n, n, n), dtype=np.float32)
        m = (n + 1) // 2 - 1  # MPF fragment size (n + 1 divisible by 2)
        sh = LayerShape(0, "maxpool", s, c, (n, n, n), 8 * s, c, (m, m, m), (2, 2, 2))
        t = _timed(partial(backend.mpf, x, (2, 2, 2)), repeats)
        rows.append(("maxpool", other_work(sh), t, working_set_bytes(sh)))
        del x
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    return rows


def _columns(work: Work, rates: dict[str, float]) -> list[float]:
    """Seconds of each term at `rates` (the madd term is its bound regime at those rates)."""
    madd_s = max(work.madd_flops / rates["madd_flops_per_s"],
                 work.madd_bytes / rates["madd_bytes_per_s"])
    return [work.fft_flops / rates["fft_flops_per_s"],
            work.kernel_fft_flops / rates["kernel_fft_flops_per_s"], madd_s,
            work.direct_flops / rates["direct_flops_per_s"],
            work.gather_bytes / rates["gather_bytes_per_s"],
            work.memory_bytes / rates["memory_bytes_per_s"],
            work.pack_bytes / rates["pack_bytes_per_s"],
            work.products * rates["product_overhead_s"],
            work.calls * rates["layer_overhead_s"]]


def fit_rates(rows: list[tuple[Work, float]], start: dict[str, float]) -> dict[str, float]:
    """Scale each rate so that predicted/measured is 1 in relative least squares.

    Unknowns are multipliers m_j >= 0 of the seconds of term j at `start`
    rates; a negative solution drops that term's column (keeps its rate).
    """
    a = np.array([[c / t for c in _columns(w, start)] for w, t in rows])  # (runs, terms)
    mult = relative_multipliers(a, np.ones(len(rows)))
    keys = (("fft_flops_per_s",), ("kernel_fft_flops_per_s",),
            ("madd_flops_per_s", "madd_bytes_per_s"), ("direct_flops_per_s",),
            ("gather_bytes_per_s",), ("memory_bytes_per_s",), ("pack_bytes_per_s",))
    rates = dict(start)
    for j, names in enumerate(keys):
        for name in names:
            rates[name] = float(start[name] / mult[j])
    for j, name in enumerate(("product_overhead_s", "layer_overhead_s"), start=len(keys)):
        rates[name] = float(start[name] * mult[j])  # seconds per unit: scales the other way
    return rates


# the calibrated size scaling's bounds: a few noisy rows (a shared CPU, a row the model
# misses) once fitted 0.2 and 14 for fft-recompute, moving every plan; a primitive whose
# time the model misses by more than 2x has a model to fix, not a factor to fit
SCALING_BOUNDS = (0.5, 2.0)


def fit_scaling(rows: list[Row], rates: dict[str, float]) -> dict[str, list[list[float]]]:
    """Per scaling key, measured / modelled time as a power of the working set, fitted
    robustly (Theil-Sen: the median of the pairwise slopes of log ratio over log bytes, so
    one or two outlying rows do not tilt it), returned as its values at the smallest and
    largest calibrated working set, within SCALING_BOUNDS."""
    out: dict[str, list[list[float]]] = {}
    lo_f, hi_f = SCALING_BOUNDS
    for key in sorted({r[0] for r in rows}):
        pts = [(float(ws), t / sum(_columns(w, rates))) for k, w, t, ws in rows if k == key]
        logs = np.log([b for b, _ in pts])
        log_r = np.log([max(f, 1e-9) for _, f in pts])
        lo, hi = float(min(b for b, _ in pts)), float(max(b for b, _ in pts))
        slopes = [(log_r[j] - log_r[i]) / (logs[j] - logs[i])
                  for i in range(len(pts)) for j in range(i + 1, len(pts))
                  if logs[j] != logs[i]]
        slope = float(np.median(slopes)) if slopes else 0.0
        level = float(np.median(log_r - slope * logs))
        out[key] = [[b, float(np.clip(np.exp(level + slope * np.log(b)), lo_f, hi_f))]
                    for b in (lo, hi)]
    return out


def baseline_rss_bytes() -> int:
    """RSS of a fresh process that imported znni, made a CpuBackend and ran a tiny conv."""
    code = (
        "import numpy as np; from znni.primitives.backends import make_backend\n"
        "b = make_backend('cpu', fft_effort='FFTW_ESTIMATE')\n"
        "x = np.ones((1, 2, 12, 12, 12), np.float32); w = np.ones((2, 2, 3, 3, 3), np.float32)\n"
        "b.conv3d(x, w, np.zeros(2, np.float32), None, 'fft-recompute')\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=120)
        return int(out.stdout.strip().splitlines()[-1]) * 1024
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        log.warning("could not measure the baseline RSS (%s); assuming 150 MiB", e)
        return 150 * 2**20
