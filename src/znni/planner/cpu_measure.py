"""The CPU primitives' calibration steps: each primitive at each layer shape through the
real CpuBackend, one calibration_steps.Step each, and the rows the fit takes from them.

What a step costs is mostly FFTW's planning: FFTW_MEASURE runs candidate plans on the
whole batch, 5-12x the transform itself at the big shapes. It matters only beyond the
caches: at cache-resident shapes (working set under CACHE_RESIDENT_BYTES) FFTW_ESTIMATE's
plans ran as fast as FFTW_MEASURE's (within the noise, 2026-11-28, AMD EPYC 2-core VM),
at 409 MB they took 2x as long; so shapes in cache are planned with FFTW_ESTIMATE and the
others as a run plans them (FFTW_MEASURE). A step runs its primitive once (plans,
workspaces, kept spectra) and then times it: once where that takes over LONG_S (its noise
is small against it), else the best of REPEATS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from functools import partial
from math import prod
from typing import Any

import numpy as np

from znni.model.network import LayerShape
from znni.planner.calibration_steps import Step
from znni.planner.costs import Work, cpu_conv_work, cpu_seconds, other_work, working_set_bytes
from znni.planner.machine import MachineProfile

ConvShape = tuple[int, int, int, int, int]  # (batch S, Cin f, Cout g, kernel k, input side n)
PoolShape = tuple[int, int, int]  # (S, C, n) of an MPF with 2^3 windows
Row = tuple[str, Work, float, int]  # (scaling key, counted work, seconds, working-set bytes)

CONV_PRIMITIVES = ("direct", "fft-keep", "fft-recompute")
FFT_PRIMITIVES = ("fft-keep", "fft-recompute")
SPECTRA_BYTES = 2**31  # the calibration backend's spectra cache (decides fft-keep tiling)
CACHE_RESIDENT_BYTES = 32 * 2**20  # below: FFTW_ESTIMATE plans (the L3 of the AMD host)
REPEATS = 2
LONG_S = 1.0
# a step's expected seconds (its progress estimate): the default rates' time, run
# 1 + REPEATS times, plus FFTW_MEASURE's planning at this many times the run
PLANNING_FACTOR = {"fft-keep": 8.0, "fft-recompute": 3.0}
STEP_OVERHEAD_S = 0.1  # and this, per step (inputs, workspaces)


def conv_layer(shape: ConvShape) -> LayerShape:
    """The layer of a calibration shape (batch S, Cin f, Cout g, kernel k, input side n)."""
    s, f, g, k, n = shape
    return LayerShape(0, "conv", s, f, (n, n, n), s, g, (n - k + 1,) * 3, (k, k, k))


def pool_layer(shape: PoolShape) -> LayerShape:
    s, c, n = shape
    m = (n + 1) // 2 - 1  # MPF fragment size (n + 1 divisible by 2)
    return LayerShape(0, "maxpool", s, c, (n, n, n), 8 * s, c, (m, m, m), (2, 2, 2))


def step_key(kind: str, shape: tuple[int, ...]) -> str:
    return f"{kind} {','.join(map(str, shape))}"


def timed(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """Seconds of `fn` after one untimed run: one timing if it is long, else the best of
    `repeats`."""
    fn()  # warm: FFTW plans, kept spectra, workspaces
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if best >= LONG_S:
            break
    return best


def random_array(shape: tuple[int, ...]) -> np.ndarray:
    """Normal float32 values in `shape`: 2^20 drawn, repeated (drawing all of a 936 MB
    input took 5 s of the calibration; the timings do not depend on the values)."""
    size = prod(shape)
    block = np.random.default_rng(0).standard_normal(min(2**20, size), dtype=np.float32)
    out = np.empty(size, np.float32)
    for i in range(0, size, block.size):
        out[i:i + block.size] = block[:size - i]
    return out.reshape(shape)


class Backends:
    """The measuring CpuBackends (one per FFTW effort, made when first asked) and the
    inputs of the shape being measured (its primitives run on the same arrays)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self._backends: dict[str, Any] = {}
        self._inputs: tuple[tuple[int, ...], tuple[np.ndarray, ...]] | None = None
        self.planned: set[Hashable] = set()  # workspaces planning_step has planned

    def effort(self, layer: LayerShape) -> str:
        small = working_set_bytes(layer) < CACHE_RESIDENT_BYTES
        return "FFTW_ESTIMATE" if self.quick or small else "FFTW_MEASURE"

    def backend(self, effort: str) -> Any:
        if effort not in self._backends:
            from znni.primitives.backends import make_backend

            self._backends[effort] = make_backend("cpu", fft_effort=effort,
                                                  spectra_cache_bytes=SPECTRA_BYTES)
        return self._backends[effort]

    def conv_inputs(self, shape: ConvShape) -> tuple[np.ndarray, ...]:
        if self._inputs is None or self._inputs[0] != shape:
            self._inputs = None  # the last shape's arrays go before the next are made
            s, f, g, k, n = shape
            self._inputs = shape, (random_array((s, f, n, n, n)),
                                   random_array((g, f, k, k, k)), np.zeros(g, np.float32))
        return self._inputs[1]

    def close(self) -> None:
        self._inputs = None
        for backend in self._backends.values():
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        self._backends.clear()


def conv_step(backends: Backends, shape: ConvShape, prim: str,
              profile: MachineProfile) -> Step:
    layer = conv_layer(shape)
    effort = backends.effort(layer) if prim != "direct" else "FFTW_ESTIMATE"

    def run() -> float:
        x, w, b = backends.conv_inputs(shape)
        return timed(partial(backends.backend(effort).conv3d, x, w, b, None, prim),
                     1 if backends.quick else REPEATS)

    once = cpu_seconds(cpu_conv_work(layer, prim, SPECTRA_BYTES), profile)
    planning = PLANNING_FACTOR.get(prim, 0.0) if effort == "FFTW_MEASURE" else 0.0
    s, f, g, k, n = shape
    return Step(step_key(prim, shape), f"{prim} {s}x{f}->{g} {k}^3 at {n}^3",
                once * (1 + REPEATS + planning) + STEP_OVERHEAD_S, run)


def planning_step(backends: Backends, shape: ConvShape, prim: str, estimate_s: float) -> Step:
    """FFTW_MEASURE's planning of the workspaces conv `prim` checks out at `shape` (as the
    calibration's backend has them) that no earlier step planned, timed from no wisdom
    (the process's wisdom set aside, then merged back with the new plans): what a first
    run on this CPU pays per point of its image transforms (jobtime.cold_fft's unit and
    rule; kernel spectra folded in). The conv step after it finds these plans in the
    wisdom, so the calibration plans them once."""
    def run() -> list[float]:
        from znni.primitives.cpu.backend import usable_cores
        from znni.primitives.cpu.fft_workspaces import FftSettings, layer_workspaces
        from znni.primitives.cpu.fftw_plans import PlanCache, fftw

        s, f, g, k, n = shape
        spaces = [ws for ws in layer_workspaces(
            prim == "fft-keep", (s, f, n, n, n), (g, f, k, k, k),
            FftSettings(spectra_budget=SPECTRA_BYTES)) if ws.key not in backends.planned]
        cache = PlanCache(usable_cores(), "FFTW_MEASURE", max_bytes=0)  # loads the saved
        wisdom = fftw().export_wisdom()
        fftw().forget_wisdom()
        try:
            t0 = time.perf_counter()
            for ws in spaces:
                ws.build(cache)
            seconds = time.perf_counter() - t0
        finally:
            fftw().import_wisdom(wisdom)  # merged with what was just planned
        backends.planned.update(ws.key for ws in spaces)
        return [seconds, float(sum(ws.points for ws in spaces if ws.images))]

    s, f, g, k, n = shape
    return Step(step_key(f"fftw-plan {prim}", shape),
                f"FFTW planning for {prim} {s}x{f}->{g} {k}^3 at {n}^3", estimate_s, run)


def fftw_s_per_point(measured: dict[str, Any]) -> float | None:
    """FFTW_MEASURE's planning seconds per image-transform point over the planning steps in
    `measured` (None where none planned anything)."""
    plans = [v for key, v in measured.items() if key.startswith("fftw-plan ")]
    points = sum(float(p[1]) for p in plans)
    return sum(float(p[0]) for p in plans) / points if points else None


def pool_step(backends: Backends, shape: PoolShape, profile: MachineProfile) -> Step:
    s, c, n = shape

    def run() -> float:
        x = random_array((s, c, n, n, n))
        return timed(partial(backends.backend("FFTW_ESTIMATE").mpf, x, (2, 2, 2)),
                     1 if backends.quick else REPEATS)

    once = cpu_seconds(other_work(pool_layer(shape)), profile)
    return Step(step_key("maxpool", shape), f"max-pool fragments {s}x{c} at {n}^3",
                once * (1 + REPEATS) + STEP_OVERHEAD_S, run)


def cpu_steps(backends: Backends, profile: MachineProfile, shapes: Sequence[ConvShape],
              pools: Sequence[PoolShape], fft_shapes: Sequence[ConvShape] = ()) -> list[Step]:
    """Every primitive at every conv shape, the FFT ones at every `fft_shapes` shape, MPF
    at every pool shape; `profile`'s rates give their estimates."""
    runs = [(shape, prim) for shape in shapes for prim in CONV_PRIMITIVES]
    runs += [(shape, prim) for shape in fft_shapes for prim in FFT_PRIMITIVES]
    steps: list[Step] = []
    for shape, prim in runs:
        step = conv_step(backends, shape, prim, profile)
        if prim != "direct" and backends.effort(conv_layer(shape)) == "FFTW_MEASURE":
            planning = PLANNING_FACTOR.get(prim, 0.0)  # the conv step's share moves here
            share = step.estimate_s * planning / (1 + REPEATS + planning)
            steps.append(planning_step(backends, shape, prim, share))
            step = replace(step, estimate_s=step.estimate_s - share)
        steps.append(step)
    return steps + [pool_step(backends, shape, profile) for shape in pools]


def cpu_rows(seconds: dict[str, Any], shapes: Sequence[ConvShape], pools: Sequence[PoolShape],
             fft_shapes: Sequence[ConvShape] = ()) -> list[Row]:
    """The fit's rows of the measured `seconds` (by step key)."""
    runs = [(shape, prim) for shape in shapes for prim in CONV_PRIMITIVES]
    runs += [(shape, prim) for shape in fft_shapes for prim in FFT_PRIMITIVES]
    rows: list[Row] = []
    for shape, prim in runs:
        layer = conv_layer(shape)
        rows.append((prim, cpu_conv_work(layer, prim, SPECTRA_BYTES),
                     float(seconds[step_key(prim, shape)]), working_set_bytes(layer)))
    for pool in pools:
        layer = pool_layer(pool)
        rows.append(("maxpool", other_work(layer), float(seconds[step_key("maxpool", pool)]),
                     working_set_bytes(layer)))
    return rows
