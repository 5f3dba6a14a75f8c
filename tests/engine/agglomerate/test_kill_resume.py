"""`znni agglomerate` killed with SIGKILL in each of its stages, then rerun: the labels equal
a clean run's; and the same job on a Dask cluster writes the same labels."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.agglomerate_ref import smooth_affinities

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.location import Location

CTX = StoreContext()
SHAPE, BLOCK = (40, 48, 48), "8,8,8"
BLOCKS = 5 * 6 * 6


def _affinities(tmp: Path) -> str:
    path = tmp / "affs.zarr"
    values = smooth_affinities(SHAPE, 21, sigma=1.0)
    zarr.create_array(str(path), shape=values.shape, chunks=(3, 16, 16, 16),
                      dtype="float32")[...] = values
    return str(path)


def _cmd(affs: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "znni.cli", "agglomerate", affs, str(out), "--block", BLOCK,
            "--threshold", "0.5", "--quiet", *extra]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    """The affinities and a clean run's labels, once for the module (no test writes them)."""
    tmp = tmp_path_factory.mktemp("clean")
    affs = _affinities(tmp)
    subprocess.run(_cmd(affs, tmp / "clean.zarr"), check=True, timeout=600)
    labels = np.asarray(zarr.open_array(str(tmp / "clean.zarr"))[...])
    assert labels.any()
    return affs, labels


def _done(where: Path) -> int:
    return len(read_ledger(Location.parse(str(where)), ctx=CTX)[1]) if where.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["fragments", "faces", "relabel"])
def test_sigkill_in_a_stage_then_rerun_equals_a_clean_run(
        tmp_path: Path, stage: str, clean: tuple[str, np.ndarray]) -> None:
    affs, expected = clean
    out = tmp_path / "out.zarr"
    work = tmp_path / "out.zarr.agglomerate"
    ledger = {"fragments": work / "fragments.zarr", "faces": work / "faces", "relabel": out}[stage]
    enough = 1 if stage == "relabel" else BLOCKS // 3
    proc = subprocess.Popen(_cmd(affs, out))
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if _done(ledger) >= enough:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if stage != "relabel":  # the relabel has few blocks: it may have finished
        assert proc.returncode == -signal.SIGKILL
        assert 0 < _done(ledger) < BLOCKS
    subprocess.run(_cmd(affs, out), check=True, timeout=600)
    assert np.array_equal(np.asarray(zarr.open_array(str(out))[...]), expected)


@pytest.mark.slow
def test_a_dask_cluster_writes_the_same_labels(tmp_path: Path,
                                               clean: tuple[str, np.ndarray]) -> None:
    """All three stages on one LocalCluster (`shared_cluster`), the same labels as here."""
    pytest.importorskip("distributed")
    affs, here = clean
    there = tmp_path / "there.zarr"
    subprocess.run(_cmd(affs, there, "--scheduler", "local:2"), check=True, timeout=600)
    assert np.array_equal(here, np.asarray(zarr.open_array(str(there))[...]))
