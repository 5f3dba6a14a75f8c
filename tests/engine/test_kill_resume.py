"""`znni segment` killed with SIGKILL about half way, then restarted: exact resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import slow_network, write_network, write_volume

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.location import Location

CTX = StoreContext()  # store options (none) and caches for this module's calls

SHAPE, BLOCK = (40, 50, 60), (8, 10, 12)
TOTAL = 5 * 5 * 5


def _network(tmp: Path) -> Path:
    """Heavy enough that a block takes tens of milliseconds on the reference backend."""
    rng = np.random.default_rng(11)
    layers, params = slow_network(rng)
    return write_network(tmp, layers, params, scale=1 / 255)


def _cmd(spec: Path, inp: str, out: Path) -> list[str]:
    blk = ",".join(map(str, BLOCK))
    return [sys.executable, "-m", "znni.cli", "segment", str(spec), inp, str(out),
            "--chunks", blk, "--block", blk, "--quiet"]


def _trace(path: Path) -> list[str]:
    return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigkill_half_way_then_resume(tmp_path: Path) -> None:
    spec = _network(tmp_path)
    vol = np.random.default_rng(2).integers(0, 256, size=SHAPE).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (16, 16, 16))
    out = tmp_path / "out.zarr"
    env = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    trace1, trace2 = tmp_path / "trace1", tmp_path / "trace2"
    proc = subprocess.Popen(_cmd(spec, inp, out), env={**env, "ZNNI_ENGINE_TRACE": str(trace1)})
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(read_ledger(Location.parse(out), ctx=CTX)[1]) >= TOTAL // 2:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    _, done_before = read_ledger(Location.parse(out), ctx=CTX)
    assert TOTAL // 2 <= len(done_before) < TOTAL
    assert done_before <= set(_trace(trace1))  # recorded only after being computed

    rc = subprocess.run(_cmd(spec, inp, out), env={**env, "ZNNI_ENGINE_TRACE": str(trace2)})
    assert rc.returncode == 0
    recomputed = _trace(trace2)
    assert not set(recomputed) & done_before  # finished blocks were not recomputed
    assert len(recomputed) == len(set(recomputed)) == TOTAL - len(done_before)
    _, done_after = read_ledger(Location.parse(out), ctx=CTX)
    assert len(done_after) == TOTAL

    clean = tmp_path / "clean.zarr"
    assert subprocess.run(_cmd(spec, inp, clean), env=env).returncode == 0
    assert np.array_equal(zarr.open_array(str(out))[...], zarr.open_array(str(clean))[...])
