"""Calibration: measure the CPU primitives on this machine and fit the profile's rates.

Each primitive (direct, fft-keep, fft-recompute, MPF) runs through the real
CpuBackend at layer shapes whose working sets range from cache-resident
(~1 MB) to far beyond the caches (~650 MB) (cpu_measure.py). The counted work of
costs.py per run gives one linear equation  t = sum_j work_j / rate_j, solved in
relative least squares for the inverse rates. What one set of rates cannot say (big
layers stream from DRAM and fault in fresh pages, small ones run from cache)
is then fitted per primitive as a time factor linear in log(working set)
(MachineProfile.cpu_scaling). The graph primitives (Winograd, instance norm,
graph_ops' strided and transposed convs; OpenVINO's conv where it is installed) are
fitted on their models' own terms (graph/calibrate.py), only when a graph model is
planned on this machine (`parts`). Results are cached per machine in $XDG_CACHE_HOME/znni,
each measured step as soon as it is done (calibration_steps.py: an interrupted
calibration resumes), so a machine calibrates once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from znni.planner.calibration_steps import Step, run_steps
from znni.planner.costs import Work
from znni.planner.cpu_measure import (
    SPECTRA_BYTES,
    Backends,
    ConvShape,
    PoolShape,
    Row,
    cpu_rows,
    cpu_steps,
    fftw_s_per_point,
)
from znni.planner.fitting import relative_multipliers
from znni.planner.machine import ASSUMED_CPU_RATES, DEFAULT_CPU_RATES, MachineProfile

log = logging.getLogger(__name__)

__all__ = ["SPECTRA_BYTES", "cache_path", "calibrated_profile", "fit_rates", "fit_scaling",
           "measured_parts"]

# (S, f, f', k, n): first layers, deep layers at S = 1 and at fragment batches, and a few
# output layers (f' = 3); in cache, then the same kinds at 100-200 MB working sets (3-6x
# the AMD host's L3: DRAM as much as 400 MB were, at half the work), and 7^3 kernels
# (direct's column buffers grow with f*k^3), and few channels over many frequencies (the
# multiply-add's per-frequency products dominate). (8, 80, 80, 7, 29) is gone: its
# direct run took a quarter of the calibration, and without it the four benchmark
# networks' plans and predictions stayed within 0.5% (2026-11-28).
FULL_SHAPES: tuple[ConvShape, ...] = (
    (1, 8, 8, 3, 20), (1, 1, 40, 3, 64), (1, 40, 40, 3, 40), (8, 40, 40, 3, 20),
    (1, 80, 80, 5, 32), (8, 32, 32, 5, 24), (64, 24, 24, 3, 12), (64, 80, 3, 3, 12),
    (1, 1, 80, 5, 88), (8, 80, 80, 3, 33), (1, 40, 40, 5, 64), (64, 80, 3, 3, 16),
    (64, 80, 80, 3, 17), (1, 80, 80, 7, 36), (1, 4, 4, 3, 64), (1, 16, 16, 3, 64))
# FFT-only (direct is hopeless there and slow to time): fragment batches over several of
# fft_conv3d's sample chunks, each recomputing every kernel spectrum, with few output
# channels per chunk; the regime of n726's and n926's big 7^3 and 9^3 layers.
FFT_SHAPES: tuple[ConvShape, ...] = ((40, 80, 80, 9, 33), (24, 40, 40, 5, 41))
# A first plan without a volume (`znni plan NETWORK`) needs steady rates only, so it fits
# them from these alone: the nine cache-resident shapes (FFTW_ESTIMATE, no planning) and
# two beyond the caches (about 25 s on 2 cores against ~100 s for all). The four benchmark
# networks' plans at 2-8 GiB were predicted at 0.95-1.01x and 0.98-1.12x the whole
# calibration's steady rate on the two calibrations these were chosen on, 0.84-0.99x on a
# third held out, where two whole calibrations differ by 0.91-1.07x among themselves (AMD
# EPYC Zen 4, 2 cores, 2026-11-29); the plan says it is partial. Its steps are the
# whole calibration's, kept in the cache: the first plan that predicts a run (--input,
# --workers) measures only the rest; segment and the server, which never calibrate, plan
# with these rates until then.
FIRST_PLAN_SHAPES: tuple[ConvShape, ...] = (
    (1, 8, 8, 3, 20), (1, 40, 40, 3, 40), (8, 40, 40, 3, 20), (1, 80, 80, 5, 32),
    (8, 32, 32, 5, 24), (64, 24, 24, 3, 12), (1, 80, 80, 7, 36), (1, 4, 4, 3, 64),
    (1, 16, 16, 3, 64), (64, 80, 80, 3, 17), (64, 80, 3, 3, 16))
QUICK_SHAPES: tuple[ConvShape, ...] = (
    (1, 1, 8, 3, 20), (1, 8, 8, 3, 16), (8, 8, 8, 3, 10), (8, 8, 2, 3, 12))
# (S, C, n) of MPF with 2^3 windows, small to large
FULL_POOLS: tuple[PoolShape, ...] = ((1, 8, 63), (8, 16, 31), (8, 80, 51), (1, 80, 143))
QUICK_POOLS: tuple[PoolShape, ...] = ((1, 4, 31), (8, 4, 15))
# a first plan's MPF shapes: all but the 1.85 GB one (2 s; without it the first plan's steady
# rates were as close to the whole calibration's on the two calibrations above)
FIRST_PLAN_POOLS: tuple[PoolShape, ...] = FULL_POOLS[:3]
CACHE_VERSION = 18  # bump when the calibration changes meaning; older caches are re-measured
# what a calibration measures: "cpu" (the layer primitives: every plan), "graph" (graph
# models' primitives), "openvino" (its conv, where installed; with "graph"), "int8" (its
# int8 conv's speed-up: only where an int8 run is planned)
PARTS = ("cpu", "graph", "openvino", "int8")
GRAPH_ESTIMATE_S, OPENVINO_ESTIMATE_S, INT8_ESTIMATE_S = 4.0, 2.0, 3.0  # progress estimates


# the instruction sets that change which kernels FFTW, OpenBLAS and OpenVINO run
RATE_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "avx_vnni", "amx_bf16", "amx_int8", "amx_tile", "asimddp", "sve", "i8mm")


def cpu_signature(cpuinfo: str | None = None) -> str:
    """8 hex digits of the CPU's model name and RATE_FLAGS (from /proc/cpuinfo, or
    `cpuinfo`): a host whose VM lands on another CPU under the same name (an AVX-512 Zen 4
    one day, an AVX2-only one the next) gets its own calibration."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "CPU part") and not model:
            model = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    text = model + "|" + ",".join(f for f in RATE_FLAGS if f in flags)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@functools.cache
def _cpuinfo() -> str:
    """/proc/cpuinfo, read once per process ("" where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def cache_path(cores: int) -> Path:
    """Per host, CPU (cpu_signature) and core count; an OPENBLAS_CORETYPE override gets its
    own file, since it changes which GEMM kernels (and so the direct-conv rate) this
    process gets."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    blas = os.environ.get("OPENBLAS_CORETYPE", "").strip().lower()
    suffix = f"-blas-{''.join(c for c in blas if c.isalnum())}" if blas else ""
    name = f"machine-{os.uname().nodename}-{cores}cores-cpu{cpu_signature()}{suffix}.json"
    return Path(base) / "znni" / name


def calibrated_profile(
    profile: MachineProfile, *, quick: bool = False, measure: bool = True,
    parts: Sequence[str] = ("cpu",), quiet: bool = False, first_plan: bool = False,
) -> MachineProfile:
    """`profile` with measured rates and baseline RSS, from the cache or measured now.

    parts: what to measure where the cache lacks it ("cpu" always; "graph" adds the
    graph primitives, "openvino" OpenVINO's conv where it is installed, "int8" its int8
    conv's speed-up). measure=False
    never measures: the cached rates if there are any, else `profile` as is. quiet: no
    progress bar. first_plan: where the CPU primitives are not yet calibrated, measure
    and fit FIRST_PLAN_SHAPES only (a profile with partial_calibration set) instead of
    them all. Its GPUs get their own cached rates (gpu_calibrate.cached_gpu_rates),
    measured where `measure` and none are cached.
    """
    from znni.planner.graph.gpu_calibrate import cached_gpu_rates

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown calibration parts {sorted(unknown)}; expected {PARTS}")
    if quick:
        out = _quick_profile(profile)
    else:
        out = _cpu_calibrated(profile, measure=measure, parts=parts, quiet=quiet,
                              first_plan=first_plan)
    return replace(out, gpus=cached_gpu_rates(out.gpus, measure=measure, quick=quick))


def measured_parts(profile: MachineProfile, parts: Sequence[str], *,
                   quiet: bool = False) -> MachineProfile:
    """`profile` with the CPU rates of `parts`, cached or measured now (its GPUs as they
    are)."""
    return _cpu_calibrated(profile, measure=True, parts=parts, quiet=quiet)


def wanted_parts(parts: Sequence[str]) -> list[str]:
    """`parts` in measuring order, with "cpu" (every other part's fit starts from it), and
    "openvino" only where OpenVINO is installed."""
    from znni.planner.graph.openvino_costs import openvino_ready

    asked = {"cpu", *parts}
    if not openvino_ready():
        asked -= {"openvino", "int8"}
    return [p for p in PARTS if p in asked]


def cached_cpu_rate(key: str, cores: int) -> float | None:
    """Rate `key` of this machine's calibration cache (for `cores`), if it holds one."""
    value = _read_cache(cache_path(cores)).get("cpu_rates", {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache file's contents if it is of this version, else {}."""
    if not path.is_file():
        return {}
    try:
        cached = json.loads(path.read_text())
        if isinstance(cached, dict) and cached.get("version") == CACHE_VERSION:
            return cached
        log.info("calibration cache %s is from an older znni; not using it", path)
    except (ValueError, OSError) as e:
        log.warning("ignoring unreadable calibration cache %s: %s", path, e)
    return {}


def _from_cache(profile: MachineProfile, cached: dict[str, Any]) -> MachineProfile:
    """The cached calibration's profile; the rates no calibration measures as they are now
    (machine.ASSUMED_CPU_RATES)."""
    assumed = {k: DEFAULT_CPU_RATES[k] for k in ASSUMED_CPU_RATES}
    return MachineProfile.from_dict({
        **profile.to_dict(), "cpu_rates": {**cached["cpu_rates"], **assumed},
        "cpu_scaling": cached["cpu_scaling"],
        "base_rss_bytes": int(cached["base_rss_bytes"]), "calibrated": True})


def _cpu_calibrated(profile: MachineProfile, *, measure: bool, parts: Sequence[str],
                    quiet: bool, first_plan: bool = False) -> MachineProfile:
    """`profile` with its CPU rates and baseline RSS from the cache, or measured now."""
    path = cache_path(profile.cores)
    cached = _read_cache(path)
    have = cached.get("parts", ["cpu"] if "cpu_rates" in cached else [])  # rates alone: cpu
    try:
        usable = _from_cache(profile, cached) if "cpu" in have else None
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable calibration cache %s: %s", path, e)
        cached, have, usable = {}, [], None
    missing = [p for p in wanted_parts(parts) if p not in have]
    if not missing or not measure:
        return usable or _cached_first_plan(profile, cached) or profile
    if first_plan and "cpu" in missing:
        return _first_plan_profile(profile, cached, path, quiet)
    log.info("calibrating %s on this machine (once; cached in %s)", ", ".join(missing), path)
    t0, cpu0 = time.perf_counter(), time.process_time()
    state = {**cached, "version": CACHE_VERSION, "parts": list(have)}
    state.setdefault("steps", {})
    for part in missing:
        _measure_part(part, profile, state, path, quiet)
    log.info("calibrated %s in %.0f s (%.0f s of CPU)", ", ".join(missing),
             time.perf_counter() - t0, time.process_time() - cpu0)
    return _from_cache(profile, state)


def _measure_part(part: str, profile: MachineProfile, state: dict[str, Any], path: Path,
                  quiet: bool) -> None:
    """Measure `part`'s steps not in state["steps"] (each saved as it is done), then fit
    them into `state`'s rates and save it with `part` done."""
    def save(measured: dict[str, Any]) -> None:
        state["steps"] = measured
        _write_cache(path, state)

    backends = Backends(quick=False)
    try:
        steps = part_steps(part, profile, state, backends)
        measured = run_steps(steps, state["steps"], save, quiet=quiet)
    finally:
        backends.close()
    if part == "cpu":
        rows = cpu_rows(measured, FULL_SHAPES, FULL_POOLS, FFT_SHAPES)
        rates = fit_rates([(w, t) for _, w, t, _ in rows], dict(DEFAULT_CPU_RATES))
        planning = fftw_s_per_point(measured)
        if planning is not None:
            rates["fftw_measure_s_per_point"] = planning
        state.update(cpu_rates=rates, cpu_scaling=fit_scaling(rows, rates),
                     base_rss_bytes=baseline_rss_bytes())
    else:
        state["cpu_rates"] = {**state["cpu_rates"], **measured[part]}
    state["parts"] = [p for p in PARTS if p in {*state["parts"], part}]
    save(measured)


def _first_plan_profile(profile: MachineProfile, cached: dict[str, Any], path: Path,
                        quiet: bool) -> MachineProfile:
    """`profile` with rates fitted from FIRST_PLAN_SHAPES' and FIRST_PLAN_POOLS' steps, those
    not cached measured now and cached as the whole calibration's; partial_calibration."""
    state = {**cached, "version": CACHE_VERSION, "parts": list(cached.get("parts", []))}
    state.setdefault("steps", {})
    wanted = _first_plan_shapes()

    def save(measured: dict[str, Any]) -> None:
        state["steps"] = measured
        _write_cache(path, state)

    t0 = time.perf_counter()
    backends = Backends(quick=False)
    try:
        steps = [s for s in part_steps("cpu", profile, state, backends)
                 if _shape_of(s.key) in wanted]
        if any(s.key not in state["steps"] for s in steps):
            log.info("calibrating cpu for a first plan (%d of the %d shapes; the rest when a "
                     "run is predicted; cached in %s)", len(FIRST_PLAN_SHAPES),
                     len(FULL_SHAPES) + len(FFT_SHAPES), path)
        measured = run_steps(steps, state["steps"], save, quiet=quiet)
    finally:
        backends.close()
    if "base_rss_bytes" not in state:
        state["base_rss_bytes"] = baseline_rss_bytes()
        save(measured)
    log.debug("first plan's calibration: %.1f s", time.perf_counter() - t0)
    return _first_plan_fit(profile, measured, state["base_rss_bytes"])


def _first_plan_shapes() -> set[str]:
    """The shapes of a first plan's steps, as their step keys end (cpu_measure.step_key)."""
    return {",".join(map(str, s)) for s in (*FIRST_PLAN_SHAPES, *FIRST_PLAN_POOLS)}


def _shape_of(step_key: str) -> str:
    """The shape a step key ends with ("fftw-plan fft-keep 8,80,80,3,33" -> "8,80,80,3,33")."""
    return step_key.rsplit(" ", 1)[-1]


def _first_plan_fit(profile: MachineProfile, measured: dict[str, Any],
                    base_rss_bytes: int) -> MachineProfile:
    """`profile` with the rates fitted from the first plan's steps in `measured`."""
    wanted = _first_plan_shapes()
    rows = cpu_rows(measured, FIRST_PLAN_SHAPES, FIRST_PLAN_POOLS)
    rates = fit_rates([(w, t) for _, w, t, _ in rows], dict(DEFAULT_CPU_RATES))
    planning = fftw_s_per_point({k: v for k, v in measured.items()
                                 if _shape_of(k) in wanted})
    if planning is not None:
        rates["fftw_measure_s_per_point"] = planning
    first = {"cpu_rates": rates, "cpu_scaling": fit_scaling(rows, rates),
             "base_rss_bytes": base_rss_bytes}
    return replace(_from_cache(profile, first), partial_calibration=True)


def _cached_first_plan(profile: MachineProfile,
                       cached: dict[str, Any]) -> MachineProfile | None:
    """The first plan's profile where the cache holds all its steps (and no whole
    calibration): what `znni segment` and the server use until the rest is measured."""
    try:
        out = _first_plan_fit(profile, cached["steps"], int(cached["base_rss_bytes"]))
    except (KeyError, TypeError, ValueError):
        return None
    log.info("planning with a first plan's partial calibration; `znni plan --input` "
             "measures the rest")
    return out


def part_steps(part: str, profile: MachineProfile, state: dict[str, Any],
               backends: Backends) -> list[Step]:
    """The steps of `part`: the CPU primitives' shapes, or one step for the graph
    primitives or OpenVINO (fitted on the CPU rates in `state`)."""
    if part == "cpu":
        return cpu_steps(backends, profile, FULL_SHAPES, FULL_POOLS, FFT_SHAPES)
    from znni.planner.graph.calibrate import (
        GRAPH_RATE_KEYS,
        graph_rates,
        int8_rates,
        openvino_rates,
    )

    def fitted() -> MachineProfile:
        return _from_cache(profile, state)

    if part == "graph":
        def graph() -> dict[str, float]:
            rates = graph_rates(fitted(), openvino=False)
            return {k: rates[k] for k in GRAPH_RATE_KEYS}

        return [Step("graph", "Winograd, instance norm, strided and transposed convs",
                     GRAPH_ESTIMATE_S, graph)]
    if part == "int8":
        return [Step("int8", "OpenVINO's int8 conv", INT8_ESTIMATE_S, int8_rates)]
    return [Step("openvino", "OpenVINO's conv", OPENVINO_ESTIMATE_S,
                 lambda: openvino_rates(fitted()))]


def _quick_profile(profile: MachineProfile) -> MachineProfile:
    """A quick calibration at small shapes (tests), never cached."""
    backends = Backends(quick=True)
    try:
        steps = cpu_steps(backends, profile, QUICK_SHAPES, QUICK_POOLS)
        measured = run_steps(steps, {}, lambda _: None, quiet=True)
    finally:
        backends.close()
    rows = cpu_rows(measured, QUICK_SHAPES, QUICK_POOLS)
    rates = fit_rates([(w, t) for _, w, t, _ in rows], dict(DEFAULT_CPU_RATES))
    scaling = fit_scaling(rows, rates)
    from znni.planner.graph.calibrate import graph_rates

    rates = graph_rates(replace(profile, cpu_rates=rates), quick=True)
    return replace(profile, cpu_rates=rates,
                   cpu_scaling={k: tuple((b, f) for b, f in v) for k, v in scaling.items()},
                   base_rss_bytes=baseline_rss_bytes(), calibrated=True)


def _write_cache(path: Path, payload: dict[str, Any]) -> None:
    """`payload` as JSON at `path`, written to a temporary file and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # readers never see half
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


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
