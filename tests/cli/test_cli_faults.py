"""Faults inside a run, end to end on real parts: a real corrupted chunk file, a real full
file system (a small tmpfs), real signals to a real `znni segment` process. Each ends with
one sentence (no traceback), the exit status stated in docs/design.md, every finished block
kept, and a rerun whose output equals an uninterrupted run's bit for bit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import slow_network, small_network, write_network, write_volume
from support.trace_gate import TraceGate

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.location import Location

CTX = StoreContext()
SHAPE, BLOCK, CHUNKS = (40, 50, 60), (8, 10, 12), (16, 16, 16)
TOTAL = 5 * 5 * 5
BAD = "c/1/1/1"  # the input chunk corrupted: z, y, x 16:32
ENV = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1"}


def _cmd(spec: Path, inp: str, out: Path, *extra: str) -> list[str]:
    blk = ",".join(map(str, BLOCK))
    return [sys.executable, "-m", "znni.cli", "segment", str(spec), inp, str(out),
            "--chunks", blk, "--block", blk, "--quiet", *extra]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def _setup(tmp: Path, slow: bool = False,
           shape: tuple[int, int, int] = SHAPE) -> tuple[Path, str, np.ndarray]:
    rng = np.random.default_rng(5)
    layers, params = slow_network(rng) if slow else small_network(rng)
    spec = write_network(tmp, layers, params, scale=1 / 255)
    vol = np.random.default_rng(2).integers(0, 256, size=shape).astype(np.uint8)
    return spec, write_volume(tmp / "in.zarr", vol, 3, CHUNKS), vol


def _values(path: Path) -> np.ndarray:
    return zarr.open_array(str(path))[...]


def _one_sentence(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 2, stderr


def test_corrupt_chunk_stops_names_it_and_resumes(tmp_path: Path) -> None:
    spec, inp, _ = _setup(tmp_path)
    chunk = Path(inp) / BAD
    good = chunk.read_bytes()
    chunk.write_bytes(np.random.default_rng(0).bytes(100))
    out = tmp_path / "out.zarr"
    r = _run(_cmd(spec, inp, out))
    assert r.returncode == 2, r.stderr
    _one_sentence(r.stderr)
    first = r.stderr.splitlines()[0]
    assert BAD in first and inp in first and "ZstdCodec" in first
    assert "rerun the same command to resume" in r.stderr
    done = read_ledger(Location.parse(out), ctx=CTX)[1]
    assert 0 < len(done) < TOTAL  # the blocks before the bad chunk are kept
    verbose = _run([*_cmd(spec, inp, out)[:3], "-v", *_cmd(spec, inp, out)[3:]])
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr

    chunk.write_bytes(good)  # the chunk repaired: the same command resumes
    r = _run(_cmd(spec, inp, out))
    assert r.returncode == 0, r.stderr
    clean = tmp_path / "clean.zarr"
    assert _run(_cmd(spec, inp, clean)).returncode == 0
    assert np.array_equal(_values(out), _values(clean))


def test_corrupt_chunk_in_a_dask_run_is_named_the_same(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    spec, inp, _ = _setup(tmp_path)
    (Path(inp) / BAD).write_bytes(np.random.default_rng(0).bytes(100))
    held = socket.socket()  # distributed's default HTTP port taken, as by another cluster:
    try:  # no warning of its on stderr
        held.bind(("", 8787))
        held.listen()
    except OSError:
        pass  # taken already
    try:
        r = _run(_cmd(spec, inp, tmp_path / "out.zarr", "--scheduler", "local:1"))
    finally:
        held.close()
    assert r.returncode == 2, r.stderr
    _one_sentence(r.stderr)  # the Dask workers' own failure logs are kept off stderr
    assert BAD in r.stderr and "fix the chunk, then rerun" in r.stderr


def test_fill_computes_on_and_lists_exactly_the_bad_chunks(tmp_path: Path) -> None:
    spec, inp, vol = _setup(tmp_path)
    (Path(inp) / BAD).write_bytes(np.random.default_rng(1).bytes(100))
    out = tmp_path / "out.zarr"
    r = _run(_cmd(spec, inp, out, "--on-bad-chunk", "fill"))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "did not decode" in r.stderr and BAD in r.stderr
    record = zarr.open_array(str(out)).attrs["znni"]
    assert record["bad_chunks"]["chunks"] == [BAD]
    filled = vol.copy()
    filled[16:32, 16:32, 16:32] = 0  # the array's fill value
    ref = write_volume(tmp_path / "filled.zarr", filled, 3, CHUNKS)
    clean = tmp_path / "clean.zarr"
    assert _run(_cmd(spec, ref, clean)).returncode == 0
    assert np.array_equal(_values(out), _values(clean))


@pytest.fixture
def small_fs(tmp_path: Path):
    """A real 200 KiB tmpfs (root only); yields its mount point, unmounted after."""
    where = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_full_disk_stops_names_the_block_and_resumes_after_space_is_freed(
        tmp_path: Path, small_fs: Path) -> None:
    spec, inp, _ = _setup(tmp_path)
    out = small_fs / "out.zarr"
    r = _run(_cmd(spec, inp, out))
    assert r.returncode == 1, r.stderr
    _one_sentence(r.stderr)
    assert "no space left on the device" in r.stderr and "output block" in r.stderr
    done = read_ledger(Location.parse(out), ctx=CTX)[1]
    assert len(done) < TOTAL
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
    r = _run(_cmd(spec, inp, out))
    assert r.returncode == 0, r.stderr
    clean = tmp_path / "clean.zarr"
    assert _run(_cmd(spec, inp, clean)).returncode == 0
    assert np.array_equal(_values(out), _values(clean))


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_gracefully_and_resumes_exactly(tmp_path: Path, sig: int,
                                                     code: int) -> None:
    spec, inp, _ = _setup(tmp_path, slow=True)
    out = tmp_path / "out.zarr"
    proc = subprocess.Popen(_cmd(spec, inp, out), env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_ledger(Location.parse(out), ctx=CTX)[1]) >= TOTAL // 3:
            break
        time.sleep(0.01)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert f"stopped by {signal.Signals(sig).name}" in stderr
    done = read_ledger(Location.parse(out), ctx=CTX)[1]
    assert TOTAL // 3 <= len(done) < TOTAL
    assert not Path(str(out) + ".znni-lock").exists()
    r = _run(_cmd(spec, inp, out))
    assert r.returncode == 0, r.stderr
    clean = tmp_path / "clean.zarr"
    assert _run(_cmd(spec, inp, clean)).returncode == 0
    assert np.array_equal(_values(out), _values(clean))


def test_full_disk_before_the_first_block_is_named(tmp_path: Path, small_fs: Path) -> None:
    spec, inp, _ = _setup(tmp_path)
    filler = small_fs / "filler"
    try:
        with open(filler, "wb") as f:  # the disk filled by another job's data
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass
    r = _run(_cmd(spec, inp, small_fs / "out.zarr"))
    assert r.returncode == 1, r.stderr
    _one_sentence(r.stderr)
    assert "no space left on the device" in r.stderr and "cannot write output" in r.stderr


def _held_after_its_first_block(cmd: list[str], out: Path, gate: TraceGate) -> subprocess.Popen:
    """A run started, one block let through its trace gate, then held; returned once that
    block is in the ledger of `out`."""
    run = subprocess.Popen(cmd, env={**ENV, **gate.env()}, stderr=subprocess.PIPE)
    gate.wait_for(run, 1)
    gate.hold()
    deadline = time.monotonic() + 120
    while run.poll() is None and time.monotonic() < deadline \
            and not read_ledger(Location.parse(out), ctx=CTX)[1]:
        time.sleep(0.01)
    return run


@pytest.mark.slow
def test_second_run_on_a_held_output_is_refused_and_a_dead_holder_does_not_block(
        tmp_path: Path) -> None:
    """The first run is held mid-run by its trace gate (not by a volume big enough to still
    be running: 1000 blocks and 37 s before), then killed."""
    spec, inp, _ = _setup(tmp_path)
    out = tmp_path / "out.zarr"
    gate = TraceGate(tmp_path / "gate")
    first = _held_after_its_first_block(_cmd(spec, inp, out), out, gate)
    try:
        assert read_ledger(Location.parse(out), ctx=CTX)[1], "the first run recorded no block"
        second = [subprocess.Popen(_cmd(spec, inp, out, *extra), env=ENV, text=True,
                                   stderr=subprocess.PIPE) for extra in ((), ("--overwrite",))]
        for proc in second:
            r = subprocess.CompletedProcess(proc.args, proc.wait(120), "", proc.stderr.read())
            assert first.poll() is None, "the first run ended before the second was refused"
            assert r.returncode == 2, r.stderr
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
            assert f"pid {first.pid}" in r.stderr and "another run" in r.stderr
    finally:
        first.kill()  # SIGKILL: its lock file stays behind, its process gone
        first.wait()
        gate.close()
    assert Path(str(out) + ".znni-lock").exists()
    r = _run(_cmd(spec, inp, out))
    assert r.returncode == 0, r.stderr
    assert not Path(str(out) + ".znni-lock").exists()
    clean = tmp_path / "clean.zarr"
    assert _run(_cmd(spec, inp, clean)).returncode == 0
    assert np.array_equal(_values(out), _values(clean))


def test_fill_run_stopped_by_a_full_disk_still_lists_the_chunk_after_resuming(
        tmp_path: Path, small_fs: Path) -> None:
    """The filled chunks are noted in the ledger as the run goes: the resumed run, which does
    not read the done blocks' chunks again, still lists exactly the corrupted one."""
    spec, inp, vol = _setup(tmp_path)
    (Path(inp) / "c/0/0/0").write_bytes(np.random.default_rng(1).bytes(100))  # read first
    out = small_fs / "out.zarr"
    r = _run(_cmd(spec, inp, out, "--on-bad-chunk", "fill"))
    assert r.returncode == 1 and "no space left" in r.stderr, r.stderr
    assert read_ledger(Location.parse(out), ctx=CTX)[1]  # blocks over the bad chunk are done
    assert '"bad_chunk": "c/0/0/0"' in (out / "znni-ledger.jsonl").read_text()  # noted
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
    r = _run(_cmd(spec, inp, out, "--on-bad-chunk", "fill"))
    assert r.returncode == 0, r.stderr
    assert zarr.open_array(str(out)).attrs["znni"]["bad_chunks"]["chunks"] == ["c/0/0/0"]
    assert "c/0/0/0" in r.stderr
    filled = vol.copy()
    filled[:16, :16, :16] = 0
    clean = tmp_path / "clean.zarr"
    ref = write_volume(tmp_path / "filled.zarr", filled, 3, CHUNKS)
    assert _run(_cmd(spec, ref, clean)).returncode == 0
    assert np.array_equal(_values(out), _values(clean))


FULL_RUNS = 20
TWO_BLOCKS = (8, 10, 24)  # blocks x 0:12 and 12:24
FORK_CLI = Path(__file__).parents[1] / "support" / "fork_cli.py"


def test_full_disk_ends_in_its_two_lines_every_time(tmp_path: Path) -> None:
    """zarr writes a block's chunks as concurrent tasks; a full disk fails one and leaves
    the others running, and zarr's exit handler stopped its loop under them: a task never
    stepped printed `RuntimeWarning: coroutine 'concurrent_map.<locals>.run' was never
    awaited` after the sentence (issue 52; the CLI now cancels and awaits them first:
    io/zarr_arrays.settle_zarr_io). 20 runs of the CLI's entry point, each its own process
    and interpreter exit (support/fork_cli.py: one start-up for all, two at a time), each
    on its own real 600 KiB tmpfs: 2,2,2 chunks, 120 a block of a page each, so the first
    of two blocks fits and the second fills the disk mid-block. Each exits 1 with exactly
    its two lines, records only the first block, kept as a clean run writes it, and leaves
    no half-written chunk file."""
    spec, inp, _ = _setup(tmp_path, shape=TWO_BLOCKS)
    clean = tmp_path / "clean.zarr"
    outs = [tmp_path / f"fs{i}" / "out.zarr" for i in range(FULL_RUNS)]
    try:
        for out in outs:
            out.parent.mkdir()
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs",
                               str(out.parent)], capture_output=True).returncode != 0:
                pytest.skip("cannot mount a tmpfs here (needs root)")
        runs = tmp_path / "runs.json"
        runs.write_text(json.dumps([_cmd(spec, inp, out, "--chunks", "2,2,2")[3:]
                                    for out in (clean, *outs)]))
        r = subprocess.run([sys.executable, str(FORK_CLI), str(runs), "2"], env=ENV,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["0"] + ["1"] * FULL_RUNS, (r.stdout, runs.with_name(
            "runs.json.0.err").read_text())
        first = _values(clean)[..., :12]
        for i, out in enumerate(outs, start=1):
            err = runs.with_name(f"runs.json.{i}.err").read_text()
            assert "RuntimeWarning" not in err and "never awaited" not in err, err
            assert err.splitlines() == [
                f"znni segment: error: cannot write output block 0:8,0:10,12:24 of {out}: "
                "no space left on the device",
                "znni segment: 1 of 2 blocks are done and kept; fix the cause, then rerun the "
                "same command to resume"], err
            assert read_ledger(Location.parse(out), ctx=CTX)[1] == {"0:8,0:10,0:12"}
            assert not list(out.rglob("*.partial"))  # zarr's temporary chunk files
            assert np.array_equal(_values(out)[..., :12], first)
    finally:
        for out in outs:
            subprocess.run(["umount", "-l", str(out.parent)], capture_output=True, check=False)
