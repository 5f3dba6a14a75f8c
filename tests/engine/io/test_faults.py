"""The fault types and the output lock on real files and processes (no mocks): a chunk
overwritten with random bytes named by its key and codec, the fill policy listing it, a lock
held by a live process refused, one left by a dead process taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume

from znni.engine.context import StoreContext
from znni.engine.geometry import Box
from znni.engine.io.faults import EXIT_BAD_DATA, VolumeFault
from znni.engine.io.ledger import read_ledger
from znni.engine.io.lock import OutputBusy, hold_output, lock_path
from znni.engine.io.volume import open_input
from znni.engine.job import SegmentCancelled, SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.network import load_network
from znni.primitives.backends import make_backend

CTX = StoreContext()


def _volume(tmp: Path, zarr_format: int) -> tuple[str, np.ndarray]:
    vol = np.arange(16 * 16 * 16, dtype=np.uint16).reshape(16, 16, 16)
    arr = zarr.create_array(str(tmp / "in.zarr"), shape=vol.shape, chunks=(8, 8, 8),
                            dtype=vol.dtype, zarr_format=zarr_format, fill_value=7)
    arr[...] = vol
    return str(tmp / "in.zarr"), vol


@pytest.mark.parametrize("zarr_format, key", [(3, "c/1/0/1"), (2, "1.0.1")])
@pytest.mark.parametrize("cache_bytes", [0, 2**20])
def test_corrupt_chunk_named_or_filled(tmp_path: Path, zarr_format: int, key: str,
                                       cache_bytes: int) -> None:
    path, vol = _volume(tmp_path, zarr_format)
    (Path(path) / key).write_bytes(np.random.default_rng(0).bytes(100))
    volume = open_input(Location.parse(path), 1, cache_bytes, ctx=CTX)
    assert np.array_equal(volume.read(Box((0, 0, 0), (8, 16, 16)))[0], vol[:8])  # untouched
    with pytest.raises(VolumeFault) as info:
        volume.read(Box((4, 0, 4), (12, 8, 12)))
    fault = info.value
    assert (fault.kind, fault.key, fault.exit_code) == ("corrupt", key, EXIT_BAD_DATA)
    assert key in str(fault) and path in str(fault) and "Zstd" in str(fault)
    volume.bad_chunks.policy = "fill"
    got = volume.read(Box((4, 0, 4), (12, 8, 12)))[0]
    want = vol[4:12, 0:8, 4:12].copy()
    want[4:, :, 4:] = 7  # the chunk's part of the box: the fill value
    assert np.array_equal(got, want)
    assert volume.bad_chunks.keys == [key]


def test_live_lock_refused_even_with_overwrite_and_stale_lock_taken_over(tmp_path: Path) -> None:
    out = Location.parse(tmp_path / "out.zarr")
    held = hold_output(out)
    with pytest.raises(OutputBusy, match=f"pid {os.getpid()}"):
        hold_output(out)  # a second run in the same live process
    held.release()
    assert not lock_path(out).exists()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.run([sys.executable, "-c", "pass"])
    try:
        body = {"host": socket.gethostname(), "pid": live.pid, "started": "t", "token": "x"}
        lock_path(out).write_text(json.dumps(body))
        with pytest.raises(OutputBusy, match=f"host {socket.gethostname()}, pid {live.pid}"):
            hold_output(out)
    finally:
        live.kill()
        live.wait()
    assert dead.returncode == 0
    lock_path(out).write_text(json.dumps({**body, "pid": live.pid}))  # its holder is gone
    taken = hold_output(out)
    assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    taken.release()


def test_stop_asked_during_set_up_computes_no_block_and_releases_the_lock(
        tmp_path: Path) -> None:
    layers, params = small_network(np.random.default_rng(0))
    vol = np.random.default_rng(1).standard_normal((12, 12, 12)).astype(np.float32)
    job = SegmentJob(network=load_network(write_network(tmp_path, layers, params)),
                     input_path=write_volume(tmp_path / "in.zarr", vol, 3, (8, 8, 8)),
                     output_path=str(tmp_path / "out.zarr"), chunks=(4, 4, 4), block=(4, 4, 4))
    stop = threading.Event()
    stop.set()  # the signal came while the run was still planning
    with pytest.raises(SegmentCancelled) as info:
        segment(job, cancel=stop, backend=make_backend("reference"))
    assert info.value.done == (0, 27)  # type: ignore[attr-defined]
    assert read_ledger(job.output_path, ctx=CTX)[1] == set()
    assert not lock_path(job.output_path).exists()


def test_wait_takes_the_lock_when_its_holder_ends(tmp_path: Path) -> None:
    out = Location.parse(tmp_path / "out.zarr")
    held = hold_output(out)
    threading.Timer(1.0, held.release).start()
    taken = hold_output(out, wait=True)
    assert json.loads(lock_path(out).read_text())["token"] == taken.token != held.token
    taken.release()


def test_a_zombie_holder_does_not_block(tmp_path: Path) -> None:
    """A holder that exited but was never reaped (its parent gone, as a server's worker is
    when the server is SIGKILLed in a container whose init does not reap) is stale."""
    out = Location.parse(tmp_path / "out.zarr")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and " Z " not in Path(f"/proc/{child.pid}/stat").read_text():
        time.sleep(0.05)  # exited, not yet reaped: a zombie
    body = {"host": socket.gethostname(), "pid": child.pid, "started": "t", "token": "z"}
    lock_path(out).write_text(json.dumps(body))
    try:
        hold_output(out).release()
    finally:
        child.wait()


def test_a_fault_pickles_whole() -> None:
    """A Dask worker's fault reaches the client with its kind, key and exit status."""
    import pickle

    fault = VolumeFault("corrupt", "/in.zarr", "c/1/0/1", "bad bytes", exit_code=EXIT_BAD_DATA,
                        hint="the chunk is corrupt")
    back = pickle.loads(pickle.dumps(fault))
    assert (back.kind, back.key, back.exit_code, str(back)) == (
        "corrupt", "c/1/0/1", EXIT_BAD_DATA, str(fault))
