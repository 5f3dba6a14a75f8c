"""`znni segment` with gs:// volumes against a real GCS-API server (fake-gcs-server on
127.0.0.1, its own process): a run equal to the local one, refusals before compute, the
endpoint by --storage-option, SIGKILL and resume, and the server restarting mid-run."""

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
from engine_ref import slow_network, write_network

from znni.engine.job import SegmentJob
from znni.engine.ledger import read_ledger
from znni.engine.segment import segment
from znni.engine.stores import zarr_store
from znni.model.network import load_network

SHAPE, BLOCK = (24, 30, 36), (8, 10, 12)
TOTAL = 3 * 3 * 3
WAIT_S = 180.0


pytestmark = pytest.mark.usefixtures("gcs_env")


@pytest.fixture()
def case(gcs, tmp_path: Path) -> dict:  # noqa: ANN001
    """A network heavy enough for a block to take a while, a gs input and the local run."""
    rng = np.random.default_rng(12)
    layers, params = slow_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = rng.integers(0, 256, size=SHAPE).astype(np.uint8)
    prefix = gcs.prefix()
    arr = zarr.create_array(store=zarr_store(f"{prefix}/in.zarr", read_only=False), shape=SHAPE,
                            chunks=(16, 16, 16), dtype="uint8")
    arr[...] = vol
    local = str(tmp_path / "local.zarr")
    segment(SegmentJob(network=load_network(spec), input_path=f"{prefix}/in.zarr",
                       output_path=local, chunks=BLOCK, block=BLOCK))
    return {"spec": spec, "prefix": prefix, "input": f"{prefix}/in.zarr",
            "expected": zarr.open_array(local)[...]}


def _cmd(spec: Path, inp: str, out: str, *extra: str) -> list[str]:
    blk = ",".join(map(str, BLOCK))
    return [sys.executable, "-m", "znni.cli", "segment", str(spec), inp, out, "--chunks", blk,
            "--block", blk, "--quiet", *extra]


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **more}


def _refused(cmd: list[str], *words: str) -> None:
    """Run `cmd`; it must exit 2 with one sentence on stderr containing `words`."""
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def _read(url: str) -> np.ndarray:
    return zarr.open_array(store=zarr_store(url, read_only=True), mode="r")[...]


def _trace(path: Path) -> list[str]:
    return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []


def test_gs_run_equals_the_local_run_and_a_rerun_computes_nothing(gcs, case, tmp_path) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/out.zarr"
    trace = tmp_path / "trace"
    cmd = _cmd(case["spec"], case["input"], out)
    assert subprocess.run(cmd, env=_env(ZNNI_ENGINE_TRACE=str(trace)), timeout=WAIT_S).returncode == 0
    assert np.array_equal(_read(out), case["expected"])
    header, done = read_ledger(out)
    assert header is not None and len(done) == TOTAL == len(_trace(trace))
    run = header["run"]
    blocks = [k for k in gcs.keys_under(f"{out}/znni-ledger") if f"/{run}/" in k]
    assert len(blocks) == TOTAL  # one object per finished block
    assert subprocess.run(cmd, env=_env(ZNNI_ENGINE_TRACE=str(trace)), timeout=WAIT_S).returncode == 0
    assert len(_trace(trace)) == TOTAL  # the ledger says everything is done


def test_refusals_before_compute_exit_2_and_write_nothing(gcs, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/out.zarr"
    spec, inp = case["spec"], case["input"]
    _refused(_cmd(spec, inp, "gs://no-such-bucket-znni/out.zarr"),
             "output gs://no-such-bucket-znni/out.zarr", "bucket gs://no-such-bucket-znni",
             "does not exist")
    _refused(_cmd(spec, "gs://no-such-bucket-znni/in.zarr", out),
             "input gs://no-such-bucket-znni/in.zarr", "does not exist")
    _refused(_cmd(spec, f"{case['prefix']}/missing.zarr", out), "missing.zarr", "does not exist")
    _refused(_cmd(spec, inp, "gsx://znni-test/out.zarr"), "gsx://")
    assert gcs.keys_under(out) == []


def test_storage_option_flag_gives_the_endpoint(gcs, case, monkeypatch) -> None:  # noqa: ANN001
    """Without STORAGE_EMULATOR_HOST, --storage-option endpoint_url=... reaches the emulator
    (anonymously: the default at an endpoint outside googleapis.com)."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    out = f"{case['prefix']}/flags.zarr"
    cmd = _cmd(case["spec"], case["input"], out, "--storage-option",
               f"endpoint_url={gcs.endpoint}")
    assert subprocess.run(cmd, env=_env(), timeout=WAIT_S).returncode == 0
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    assert np.array_equal(_read(out), case["expected"])


def _wait_for_blocks(proc: subprocess.Popen, out: str, n: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_ledger(out)[1]) >= n:
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_then_rerun_recomputes_only_unfinished_blocks(case, tmp_path) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/killed.zarr"
    trace1, trace2 = tmp_path / "trace1", tmp_path / "trace2"
    cmd = _cmd(case["spec"], case["input"], out)
    proc = subprocess.Popen(cmd, env=_env(ZNNI_ENGINE_TRACE=str(trace1)))
    try:
        _wait_for_blocks(proc, out, TOTAL // 3)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    _, before = read_ledger(out)
    assert TOTAL // 3 <= len(before) < TOTAL
    assert before <= set(_trace(trace1))  # recorded only after being computed

    run = subprocess.run(cmd, env=_env(ZNNI_ENGINE_TRACE=str(trace2)), timeout=WAIT_S)
    assert run.returncode == 0
    again = _trace(trace2)
    assert not set(again) & before  # no finished block computed twice
    assert len(again) == len(set(again)) == TOTAL - len(before)
    assert len(read_ledger(out)[1]) == TOTAL
    assert np.array_equal(_read(out), case["expected"])


@pytest.mark.slow
def test_store_restart_mid_run_is_retried_and_the_run_completes(gcs, case, tmp_path) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/restarted.zarr"
    trace = tmp_path / "trace"
    proc = subprocess.Popen(_cmd(case["spec"], case["input"], out),
                            env=_env(ZNNI_ENGINE_TRACE=str(trace)),
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_blocks(proc, out, 3)
        gcs.stop()
        time.sleep(1.0)  # the store is down for a while; the run retries meanwhile
    finally:
        gcs.start()  # same port, same objects (kept on disk)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    computed = _trace(trace)
    assert len(computed) == len(set(computed)) == TOTAL  # nothing lost, nothing doubled
    assert np.array_equal(_read(out), case["expected"])


@pytest.mark.slow
def test_store_down_for_good_fails_with_one_sentence_naming_the_url(gcs, case) -> None:  # noqa: ANN001
    """gcsfs retries each request itself (about 30 s) inside each of znni's tries, and logs
    every failure it gives up on; stderr still holds only znni's one sentence."""
    out = f"{case['prefix']}/down.zarr"
    proc = subprocess.Popen(_cmd(case["spec"], case["input"], out),
                            env=_env(ZNNI_STORE_RETRIES="1"), stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_blocks(proc, out, 3)
        gcs.stop()
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        gcs.start()
    assert proc.returncode == 1, err
    line = err.strip()
    assert line.count("\n") == 0 and "Traceback" not in line, line
    assert "gs://znni-test/" in line and "did not answer after 1 tries" in line
