"""Per-layer primitive choice by measurement, cached by layer shape.

A model only prunes hopeless candidates (so a 9^3 layer never runs direct
for minutes); the rest are timed on the real input and the fastest wins.
Choices persist in `$XDG_CACHE_HOME/znni/choices.json`, keyed by the layer
shape, thread count and FFTW effort, so a later process skips measuring.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from math import prod
from pathlib import Path

from znni.primitives.cpu.fftw_plans import cache_dir
from znni.primitives.cpu.tiling import choose_tiles, model_s

log = logging.getLogger(__name__)

# Rough rate of this machine kind (docs/benchmarks.md), used only to skip hopeless candidates.
GEMM_FLOPS_PER_S = 1.0e11
PRUNE_RATIO = 4.0


def layer_key(x_shape: tuple[int, ...], w_shape: tuple[int, ...], threads: int, effort: str) -> str:
    s, cin, *n = x_shape
    cout, _, *k = w_shape
    dims = f"n{'x'.join(map(str, n))}-k{'x'.join(map(str, k))}"
    return f"s{s}-ci{cin}-co{cout}-{dims}-t{threads}-{effort}"


def estimate_s(
    primitive: str,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    spectra_budget: int = 2**30,
) -> float:
    """Crude time model: direct = GEMM flops; FFT = the best tiling's model time."""
    s, cin, *n = x_shape
    cout, _, *k = w_shape
    kernel = (int(k[0]), int(k[1]), int(k[2]))
    out = (n[0] - k[0] + 1, n[1] - k[1] + 1, n[2] - k[2] + 1)
    if primitive == "direct":
        return 2.0 * s * cin * cout * prod(out) * prod(kernel) / GEMM_FLOPS_PER_S
    keep = primitive == "fft-keep"
    m = choose_tiles(s, cin, cout, out, kernel, spectra_budget if keep else None)
    return model_s(s, cin, cout, out, kernel, m, recompute=not keep)[0]


class PrimitiveChooser:
    """Remembers the measured-fastest primitive per layer shape (memory and disk)."""

    def __init__(self, path: Path | None = None, persist: bool = True) -> None:
        self.path = path or cache_dir() / "choices.json"
        self.persist = persist
        self._lock = threading.Lock()
        self.choices: dict[str, str] = {}
        self.timings: dict[str, dict[str, float]] = {}
        if persist and self.path.exists():
            try:
                self.choices = dict(json.loads(self.path.read_text()))
            except (OSError, ValueError) as e:
                log.warning("ignoring unreadable primitive choices %s: %s", self.path, e)

    def choose(
        self,
        key: str,
        candidates: dict[str, Callable[[], float]],
        estimates: dict[str, float],
    ) -> str:
        """Cached choice, else time the candidates within PRUNE_RATIO of the best estimate."""
        known = self.choices.get(key)
        if known in candidates:
            return known
        best_est = min(estimates.values())
        timed: dict[str, float] = {}
        for name, run in candidates.items():
            if estimates[name] <= PRUNE_RATIO * best_est:
                timed[name] = run()
        pick = min(timed, key=lambda n: timed[n])
        with self._lock:
            self.choices[key] = pick
            self.timings[key] = timed
            self._save()
        return pick

    def _save(self) -> None:
        if not self.persist:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.choices, indent=0, sort_keys=True))
            tmp.replace(self.path)
        except OSError as e:
            log.warning("could not save primitive choices to %s: %s", self.path, e)


def time_call(fn: Callable[[], object], budget_s: float = 0.2, max_runs: int = 5) -> float:
    """Best wall seconds of 2 to `max_runs` calls (more while under `budget_s`).

    The best of two at least: on a shared machine one run is often an outlier.
    """
    best = float("inf")
    spent = 0.0
    for i in range(max_runs):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
        if i >= 1 and spent > budget_s:
            break
    return best
