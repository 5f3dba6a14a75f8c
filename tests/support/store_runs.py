"""Runs against a local object-store server (S3 by moto, GCS by fake-gcs-server): the
cases, the `znni segment` command, and the kill / restart / down scenarios that the
S3 and GCS tests (tests/cli, tests/engine) both check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from support.engine_ref import slow_network, small_network, write_network, write_volume
from znni.engine.context import StoreContext
from znni.engine.io.ledger import ObjectLedger, read_ledger
from znni.engine.io.stores import zarr_store
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.network import load_network

CTX = StoreContext()  # store options (none) and caches for this module's calls

SHAPE, BLOCK = (24, 30, 36), (8, 10, 12)
CHUNKS = (7, 9, 10)  # the engine-level cases' blocks
TOTAL = 3 * 3 * 3
WAIT_S = 180.0

Env = Callable[..., dict[str, str]]  # extra variables -> the child's environment


def loc(where: str | Location) -> Location:
    """`where` as a Location (a test's text, or a job's location as it is)."""
    return where if isinstance(where, Location) else Location.parse(where)


def make_case(server: Any, tmp_path: Path, seed: int) -> dict:
    """A network heavy enough for a block to take a while, an input on the server and the
    local run's output."""
    rng = np.random.default_rng(seed)
    layers, params = slow_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = rng.integers(0, 256, size=SHAPE).astype(np.uint8)
    prefix = server.prefix()
    arr = zarr.create_array(store=zarr_store(loc(f"{prefix}/in.zarr"), read_only=False, ctx=CTX),
                            shape=SHAPE, chunks=(16, 16, 16), dtype="uint8")
    arr[...] = vol
    local = str(tmp_path / "local.zarr")
    segment(SegmentJob(network=load_network(spec), input_path=f"{prefix}/in.zarr",
                       output_path=local, chunks=BLOCK, block=BLOCK))
    return {"spec": spec, "prefix": prefix, "input": f"{prefix}/in.zarr",
            "expected": zarr.open_array(local)[...]}


def local_job(tmp_path: Path, seed: int) -> tuple[SegmentJob, np.ndarray]:
    """A small local job (network, uint8 volume), run once: its output is the reference
    that the same job on an object store must equal."""
    rng = np.random.default_rng(seed)
    layers, params = small_network(rng)
    net = load_network(write_network(tmp_path, layers, params, scale=1 / 255))
    vol = rng.integers(0, 256, size=(21, 26, 29)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 2, (7, 7, 7))
    job = SegmentJob(network=net, input_path=inp, output_path=str(tmp_path / "local.zarr"),
                     chunks=CHUNKS, block=CHUNKS)
    segment(job)
    return job, vol


def upload(url: str, vol: np.ndarray, zarr_format: int = 2) -> str:
    arr = zarr.create_array(store=zarr_store(loc(url), read_only=False, ctx=CTX), shape=vol.shape,
                            chunks=(7, 7, 7), dtype=vol.dtype, zarr_format=zarr_format)
    arr[...] = vol
    return url


def segment_cmd(spec: Path, inp: str, out: str, *extra: str) -> list[str]:
    blk = ",".join(map(str, BLOCK))
    return [sys.executable, "-m", "znni.cli", "segment", str(spec), inp, out, "--chunks", blk,
            "--block", blk, "--quiet", *extra]


def child_env(**more: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **more}


def refused(cmd: list[str], env: dict[str, str], *words: str) -> str:
    """Run `cmd`; it must exit 2 with one sentence on stderr containing `words`."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def read_url(url: str | Location) -> np.ndarray:
    return zarr.open_array(store=zarr_store(loc(url), read_only=True, ctx=CTX), mode="r")[...]


def traced(path: Path) -> list[str]:
    """Blocks a run computed, from its ZNNI_ENGINE_TRACE file."""
    return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_blocks(proc: subprocess.Popen, out: str, n: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_ledger(loc(out), ctx=CTX)[1]) >= n:
            return
        time.sleep(0.05)


def kill_after_blocks(proc: subprocess.Popen, out: str, n: int) -> None:
    """SIGKILL `proc` once `out`'s ledger lists `n` finished blocks; it must not have ended
    before that."""
    try:
        wait_for_blocks(proc, out, n)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"


def kill_then_rerun(case: dict, env: Env, tmp_path: Path) -> None:
    """SIGKILL a run after a third of its blocks; the rerun computes only the rest."""
    out = f"{case['prefix']}/killed.zarr"
    trace1, trace2 = tmp_path / "trace1", tmp_path / "trace2"
    cmd = segment_cmd(case["spec"], case["input"], out)
    kill_after_blocks(subprocess.Popen(cmd, env=env(ZNNI_ENGINE_TRACE=str(trace1))), out,
                      TOTAL // 3)
    _, before = read_ledger(loc(out), ctx=CTX)
    assert TOTAL // 3 <= len(before) < TOTAL
    assert before <= set(traced(trace1))  # recorded only after being computed

    run = subprocess.run(cmd, env=env(ZNNI_ENGINE_TRACE=str(trace2)), timeout=WAIT_S)
    assert run.returncode == 0
    again = traced(trace2)
    assert not set(again) & before  # no finished block computed twice
    assert len(again) == len(set(again)) == TOTAL - len(before)
    assert len(read_ledger(loc(out), ctx=CTX)[1]) == TOTAL
    assert np.array_equal(read_url(out), case["expected"])


def restart_mid_run(server: Any, case: dict, env: Env, tmp_path: Path) -> None:
    """The server stops for a while and comes back on the same port with the same state:
    the run retries and completes, no block lost or doubled."""
    out = f"{case['prefix']}/restarted.zarr"
    trace = tmp_path / "trace"
    proc = subprocess.Popen(segment_cmd(case["spec"], case["input"], out),
                            env=env(ZNNI_ENGINE_TRACE=str(trace)),
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_blocks(proc, out, 3)
        server.stop()
        time.sleep(1.0)  # the store is down for a while; the run retries meanwhile
    finally:
        server.start()
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    computed = traced(trace)
    assert len(computed) == len(set(computed)) == TOTAL  # nothing lost, nothing doubled
    assert np.array_equal(read_url(out), case["expected"])


def down_for_good(server: Any, case: dict, env: Env, retries: int | None,
                  default_tries: int = 0) -> str:
    """The server stops for good: exit 1 and one line on stderr, which is returned.
    `retries`: ZNNI_STORE_RETRIES, or None to leave the scheme's `default_tries`."""
    out = f"{case['prefix']}/down.zarr"
    extra = {} if retries is None else {"ZNNI_STORE_RETRIES": str(retries)}
    n = default_tries if retries is None else retries
    proc = subprocess.Popen(segment_cmd(case["spec"], case["input"], out), env=env(**extra),
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_blocks(proc, out, 3)
        server.stop()
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        server.start()
    assert proc.returncode == 1, err
    line, _, kept = err.strip().partition("\n")  # the fault, then how much is kept
    assert kept.count("\n") == 0 and "Traceback" not in err, err
    assert not kept or "rerun the same command to resume" in kept, err
    assert f"did not answer after {n} {'try' if n == 1 else 'tries'} (" in line
    return line


def ome_pyramid_run(server: Any, local: SegmentJob, vol: np.ndarray,
                    tmp_path: Path) -> tuple[SegmentJob, Any]:
    """An OME-Zarr output with one pyramid level from an input in the store equals the local
    one, level by level, with the same multiscales and ledger; returns the store's job and
    its report."""
    prefix = server.prefix()
    ome = {"output_format": "ome-zarr", "pyramid": 1}
    here = SegmentJob(**{**local.__dict__, **ome, "output_path": str(tmp_path / "img.ome.zarr")})
    there = SegmentJob(**{**local.__dict__, **ome, "input_path": upload(f"{prefix}/in", vol, 3),
                          "output_path": f"{prefix}/img.ome.zarr"})
    segment(here)
    report = segment(there)
    for level in ("0", "1"):
        expected = zarr.open_array(here.output_path.join(level).url)[...]
        assert np.array_equal(read_url(there.output_path.join(level)), expected)
    attrs = zarr.open_group(store=zarr_store(there.output_path, read_only=True, ctx=CTX),
                            mode="r").attrs
    assert [d["path"] for d in attrs["ome"]["multiscales"][0]["datasets"]] == ["0", "1"]
    assert read_ledger(there.output_path, ctx=CTX)[1] == read_ledger(here.output_path, ctx=CTX)[1]
    return there, report


def ledger_start_forgets_earlier_runs(server: Any) -> None:
    """An object ledger records each block once, and a new run's start forgets the old
    run's header and deletes its block objects."""
    out = Location.parse(f"{server.prefix()}/out.zarr")
    ledger = ObjectLedger(out, ctx=CTX)
    ledger.start({"network": "a"}, (8, 8, 8))
    ledger.record(["0:8,0:8,0:8", "0:8,0:8,8:16"])
    ledger.record(["0:8,0:8,8:16"])  # recorded twice: still one block
    header, done = read_ledger(out, ctx=CTX)
    assert header is not None and header["block_shape"] == [8, 8, 8]
    assert done == {"0:8,0:8,0:8", "0:8,0:8,8:16"}
    again = ObjectLedger(out, ctx=CTX)
    again.start({"network": "b"}, (4, 4, 4))
    header, done = read_ledger(out, ctx=CTX)
    assert header is not None and header["parts"] == {"network": "b"} and done == set()
    assert len(server.keys_under(out.join("znni-ledger").url)) == 1  # stale block objects deleted


def dask_reads_and_writes(server: Any, local: SegmentJob, vol: np.ndarray,
                          monkeypatch: Any, endpoint_env: str) -> None:
    """A Dask LocalCluster run whose workers open the store themselves, with the job's
    --storage-option endpoint (`endpoint_env` is taken out of the environment for the run),
    equals the local run: the job's StoreContext reaches them inside the block spec."""
    from znni.engine.io.stores import context_for

    prefix = server.prefix()
    inp = upload(f"{prefix}/in.zarr", vol)
    monkeypatch.delenv(endpoint_env)
    out = f"{prefix}/dask.zarr"
    store = context_for((loc(inp), loc(out)), {"endpoint_url": server.endpoint})
    job = SegmentJob(**{**local.__dict__, "input_path": inp, "output_path": out,
                        "scheduler": "local:2", "store": store})
    report = segment(job)
    assert report.blocks_computed == report.blocks_total
    monkeypatch.setenv(endpoint_env, server.endpoint)
    assert np.array_equal(read_url(job.output_path), zarr.open_array(local.output_path.url)[...])
    assert len(read_ledger(job.output_path, ctx=CTX)[1]) == report.blocks_total
