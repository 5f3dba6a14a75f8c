"""`znni segment` with s3:// volumes against a real S3-API server (moto on 127.0.0.1):
refusals before compute, SIGKILL and resume, and the server restarting mid-run."""

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


pytestmark = pytest.mark.usefixtures("s3_env")


@pytest.fixture()
def case(s3, tmp_path: Path) -> dict:  # noqa: ANN001
    """A network heavy enough for a block to take a while, an s3 input and the local run."""
    rng = np.random.default_rng(11)
    layers, params = slow_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = rng.integers(0, 256, size=SHAPE).astype(np.uint8)
    prefix = s3.prefix()
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


def _env(s3, user: str = "rw", **more: str) -> dict[str, str]:  # noqa: ANN001
    return {**os.environ, **s3.env(user), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            **more}


def _refused(s3, cmd: list[str], env: dict[str, str], *words: str) -> str:  # noqa: ANN001
    """Run `cmd`; it must exit 2 with one sentence on stderr containing `words`."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def _read(url: str) -> np.ndarray:
    return zarr.open_array(store=zarr_store(url, read_only=True), mode="r")[...]


def test_refusals_before_compute_exit_2_and_write_nothing(s3, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/out.zarr"
    spec, inp = case["spec"], case["input"]
    err = _refused(s3, _cmd(spec, inp, out), _env(s3, "wrong"), inp, "refused access")
    assert "credentials" in err
    _refused(s3, _cmd(spec, inp, out), _env(s3, "ro"), out, "not writable")
    _refused(s3, _cmd(spec, inp, "s3://no-such-bucket-znni/out.zarr"), _env(s3),
             "s3://no-such-bucket-znni", "does not exist")
    _refused(s3, _cmd(spec, inp, "http://127.0.0.1:9/out.zarr"), _env(s3), "only reads")
    _refused(s3, _cmd(spec, f"{case['prefix']}/missing.zarr", out), _env(s3), "does not exist")
    assert s3.keys_under(out) == []


def test_storage_option_flag_gives_the_endpoint_and_keys(s3, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/flags.zarr"
    env = {k: v for k, v in _env(s3).items() if not k.startswith("AWS_")}
    key, secret = s3.keys["rw"]
    opts = [f"endpoint_url={s3.endpoint}", f"key={key}", f"secret={secret}"]
    cmd = _cmd(case["spec"], case["input"], out,
               *(a for o in opts for a in ("--storage-option", o)))
    assert subprocess.run(cmd, env=env, timeout=WAIT_S).returncode == 0
    assert np.array_equal(_read(out), case["expected"])


def _trace(path: Path) -> list[str]:
    return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for_blocks(proc: subprocess.Popen, out: str, n: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_ledger(out)[1]) >= n:
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_then_rerun_recomputes_only_unfinished_blocks(s3, case, tmp_path) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/killed.zarr"
    trace1, trace2 = tmp_path / "trace1", tmp_path / "trace2"
    cmd = _cmd(case["spec"], case["input"], out)
    proc = subprocess.Popen(cmd, env=_env(s3, ZNNI_ENGINE_TRACE=str(trace1)))
    try:
        _wait_for_blocks(proc, out, TOTAL // 3)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    _, before = read_ledger(out)
    assert TOTAL // 3 <= len(before) < TOTAL
    assert before <= set(_trace(trace1))  # recorded only after being computed

    run = subprocess.run(cmd, env=_env(s3, ZNNI_ENGINE_TRACE=str(trace2)), timeout=WAIT_S)
    assert run.returncode == 0
    again = _trace(trace2)
    assert not set(again) & before  # no finished block computed twice
    assert len(again) == len(set(again)) == TOTAL - len(before)
    assert len(read_ledger(out)[1]) == TOTAL
    assert np.array_equal(_read(out), case["expected"])


@pytest.mark.slow
def test_store_restart_mid_run_is_retried_and_the_run_completes(s3, case, tmp_path) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/restarted.zarr"
    trace = tmp_path / "trace"
    proc = subprocess.Popen(_cmd(case["spec"], case["input"], out),
                            env=_env(s3, ZNNI_ENGINE_TRACE=str(trace)),
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_blocks(proc, out, 3)
        s3.stop()
        time.sleep(1.0)  # the store is down for a while; the run retries meanwhile
    finally:
        s3.start()  # same port, same state (moto keeps it in this process)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    computed = _trace(trace)
    assert len(computed) == len(set(computed)) == TOTAL  # nothing lost, nothing doubled
    assert np.array_equal(_read(out), case["expected"])


@pytest.mark.slow
def test_store_down_for_good_fails_with_one_sentence_naming_the_url(s3, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/down.zarr"
    proc = subprocess.Popen(_cmd(case["spec"], case["input"], out),
                            env=_env(s3, ZNNI_STORE_RETRIES="2"),
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_blocks(proc, out, 3)
        s3.stop()
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        s3.start()
    assert proc.returncode == 1, err
    line = err.strip()
    assert line.count("\n") == 0 and "Traceback" not in line, line
    assert "s3://znni-test/" in line and "did not answer after 2 tries" in line
