"""The FFT workspaces a layer is said to check out are the ones a real run checks out, and
FFTW's wisdom answers whether they are planned: after a run, in another process, after
several processes saved at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np
import pytest

from znni.primitives.cpu.backend import CpuBackend
from znni.primitives.cpu.fft_workspaces import layer_workspaces
from znni.primitives.cpu.fftw_plans import PlanCache, Workspace, fftw, in_wisdom, save_wisdom


class RecordingPlanCache(PlanCache):
    """A plan cache that notes every key checked out (the real one, otherwise)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.keys: set[Hashable] = set()

    def checkout(self, key: Hashable, build: Callable[[PlanCache], Workspace]) -> Workspace:
        self.keys.add(key)
        return super().checkout(key, build)


# (primitive, x shape, w shape, backend options): untiled; tiled keep (a small spectra
# budget); tiled recompute in parts; chunked samples; kernel spectra in chunks
CASES = [
    ("fft-keep", (1, 3, 14, 13, 12), (4, 3, 3, 3, 3), {}),
    ("fft-recompute", (2, 3, 11, 12, 13), (5, 3, 3, 2, 1), {}),
    ("fft-keep", (1, 2, 21, 20, 19), (3, 2, 3, 3, 3), {"fft_tiles": 2}),
    ("fft-recompute", (1, 4, 19, 18, 17), (6, 4, 3, 3, 3),
     {"fft_tiles": 3, "recompute_spectra_bytes": 2 * 4 * 10 * 10 * 6 * 8}),
    ("fft-keep", (5, 3, 12, 12, 12), (4, 3, 3, 3, 3), {"fft_work_bytes": 2 * 7 * 12 * 12 * 7 * 8}),
    ("fft-recompute", (3, 2, 10, 11, 9), (7, 2, 2, 3, 3), {"fft_work_bytes": 9 * 12 * 12 * 6 * 8}),
]


@pytest.mark.parametrize(("primitive", "x_shape", "w_shape", "options"), CASES)
def test_listed_workspaces_are_the_ones_a_run_checks_out(
    primitive: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], options: dict
) -> None:
    backend = CpuBackend(threads=1, fft_effort="FFTW_ESTIMATE", persist_choices=False,
                         spectra_cache_bytes=options.pop("spectra_cache_bytes", 2**30),
                         **options)
    backend.plans = RecordingPlanCache(1, "FFTW_ESTIMATE")
    try:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        backend.conv3d(x, w, np.zeros(w_shape[0], np.float32), None, primitive)
        listed = layer_workspaces(primitive == "fft-keep", x_shape, w_shape,
                                  backend.fft_settings)
        assert {ws.key for ws in listed} == backend.plans.keys
        assert len(listed) == len(backend.plans.keys) >= 3
    finally:
        backend.close()


def _plan(ws_list: list, threads: int, effort: str) -> None:
    cache = PlanCache(threads, effort)
    for ws in ws_list:
        ws.build(cache)


def test_in_wisdom_after_planning_not_before(tmp_path: Path, monkeypatch) -> None:
    """Shapes no other test plans; FFTW_ESTIMATE is always 'planned' (it never measures)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    listed = layer_workspaces(True, (1, 2, 23, 17, 29), (3, 2, 3, 3, 3), _settings())
    assert not any(in_wisdom(ws.build, 1, "FFTW_MEASURE") for ws in listed)
    assert all(in_wisdom(ws.build, 1, "FFTW_ESTIMATE") for ws in listed)
    _plan(listed, 1, "FFTW_MEASURE")
    assert all(in_wisdom(ws.build, 1, "FFTW_MEASURE") for ws in listed)
    assert not any(in_wisdom(ws.build, 2, "FFTW_MEASURE") for ws in listed)  # per threads


def _settings():
    from znni.primitives.cpu.fft_workspaces import FftSettings

    return FftSettings()


PLAN_IN_CHILD = """
import sys
from znni.primitives.cpu.fft_workspaces import FftSettings, layer_workspaces
from znni.primitives.cpu.fftw_plans import PlanCache, in_wisdom, load_wisdom, save_wisdom
n = int(sys.argv[1])
listed = layer_workspaces(False, (1, 1, n, n + 2, n + 4), (2, 1, 3, 3, 3), FftSettings())
if sys.argv[2] == "plan":
    load_wisdom()
    cache = PlanCache(1, "FFTW_MEASURE")
    for ws in listed:
        ws.build(cache)
    save_wisdom()
else:
    load_wisdom()
    print(all(in_wisdom(ws.build, 1, "FFTW_MEASURE") for ws in listed))
"""


def _child(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PLAN_IN_CHILD, *args], env=env,
                          capture_output=True, text=True, timeout=120, check=True)


def test_processes_saving_at_once_lose_no_wisdom(tmp_path: Path) -> None:
    """Six processes plan six shapes and save at once; each shape is then known to a fresh
    process (a save merges what is on disk under a lock, so none overwrites another)."""
    import os

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    sizes = [str(n) for n in (25, 26, 27, 28, 29, 30)]
    procs = [subprocess.Popen([sys.executable, "-c", PLAN_IN_CHILD, n, "plan"], env=env)
             for n in sizes]
    assert [p.wait(timeout=180) for p in procs] == [0] * len(sizes)
    for n in sizes:
        assert _child(env, n, "ask").stdout.strip() == "True", n
    assert _child(env, "31", "ask").stdout.strip() == "False"


def test_in_wisdom_reads_what_another_process_saved(tmp_path: Path, monkeypatch) -> None:
    """A prediction in a long-lived process (the server) sees wisdom a run saved later."""
    import os

    from znni.primitives.cpu.fftw_plans import refresh_wisdom

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    listed = layer_workspaces(False, (1, 1, 33, 35, 37), (2, 1, 3, 3, 3), _settings())
    assert not any(in_wisdom(ws.build, 1, "FFTW_MEASURE") for ws in listed)
    _child(env, "33", "plan")
    refresh_wisdom()
    assert all(in_wisdom(ws.build, 1, "FFTW_MEASURE") for ws in listed)
    save_wisdom()  # this process's wisdom merged with the file's: nothing lost
    assert fftw().export_wisdom()[1]
