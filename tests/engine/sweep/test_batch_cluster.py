"""`znni segment --scheduler slurm:N` on the real code path without a real cluster: fake
`sbatch`/`squeue`/`scancel` on PATH (support/fake_batch.py) run the job script the real
dask-jobqueue writes as local processes, whose real Dask workers join the run's scheduler.

Outputs are compared with a local run of the same job bit for bit; the fake commands' log
says which batch jobs were asked for and cancelled, and /proc that none is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
from support import fake_batch
from support.engine_ref import small_network, write_network, write_volume
from support.onnx_models import external_conv
from support.trace_gate import TraceGate

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fake batch jobs read /proc")
pytest.importorskip("dask_jobqueue")

SHAPE = (21, 26, 29)
BLOCK = (7, 9, 10)  # 3 x 3 x 3 = 27 blocks
MEMORY = "2GiB"
ENV = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1", "ZNNI_FFT_EFFORT": "FFTW_ESTIMATE"}
JOBQUEUE = """jobqueue:
  slurm:
    cores: 1
    memory: {memory}
    walltime: "00:10:00"
    death-timeout: 30
    job-extra-directives: ["--gres=gpu:0"]
    scheduler-options: {{dashboard_address: null}}
"""


def _cmd(spec: Path, inp: str, out: Path, *extra: str, block=BLOCK) -> list[str]:
    blk = ",".join(map(str, block))
    return [sys.executable, "-m", "znni.cli", "segment", str(spec), inp, str(out),
            "--chunks", blk, "--block", blk, "--quiet", *extra]


def _values(path: Path) -> np.ndarray:
    return zarr.open_array(str(path))[...]


def _ledger_blocks(out: Path) -> list[str]:
    lines = (out / "znni-ledger.jsonl").read_text().splitlines()
    return [e["block"] for e in map(json.loads, lines) if "block" in e]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, np.ndarray]:
    """The network, the input and the output of a local run of the job."""
    tmp = tmp_path_factory.mktemp("batch")
    rng = np.random.default_rng(8)
    spec = write_network(tmp, *small_network(rng), scale=1 / 255)
    vol = rng.integers(0, 256, size=SHAPE).astype(np.uint8)
    inp = write_volume(tmp / "in.zarr", vol, 3, BLOCK)
    local = tmp / "local.zarr"
    run = subprocess.run(_cmd(spec, inp, local, "--memory-limit", MEMORY), env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return spec, inp, _values(local)


def _cluster(tmp: Path, memory: str | None = "1GiB") -> tuple[dict[str, str], Path]:
    """An environment whose PATH has the fake SLURM and whose Dask configuration is a
    jobqueue.yaml in tmp (memory None: a configuration without a worker memory)."""
    bin_dir, state, config = tmp / "bin", tmp / "slurm", tmp / "dask"
    fake_batch.install(bin_dir, state)
    config.mkdir()
    text = JOBQUEUE.format(memory=memory or "null")
    (config / "jobqueue.yaml").write_text(text)
    env = {**ENV, "PATH": f"{bin_dir}{os.pathsep}{ENV.get('PATH', '')}",
           "DASK_CONFIG": str(config)}
    if memory is None:  # whatever the user's own files say
        env["DASK_JOBQUEUE__SLURM__MEMORY"] = "None"
    return env, state


def _all_cancelled(state: Path, jobs: list[str]) -> None:
    """Every job was cancelled and none of its processes is left. A job may be cancelled
    twice: distributed's SpecCluster takes a worker retired at close for a lost one and,
    after `deploy.lost-worker-timeout` (0.5 s in the killed-job test), cancels its job
    again if the close has not yet forgotten it (seen: scancel 3, 2, then 2 again 0.58 s
    later); the second scancel of an ended job does nothing."""
    cancelled = [c[1] for c in fake_batch.calls(state) if c[0] == "scancel"]
    assert sorted(set(cancelled), key=int) == jobs
    for job in jobs:
        assert fake_batch.live_pids(fake_batch.pgid(state, job)) == [], job



def _wait_while_running(run: subprocess.Popen, done: Callable[[], bool],
                        limit_s: float = 120.0) -> None:
    """Poll `done` until it holds; the run ending first is the failure (its stderr shown),
    and `limit_s` only keeps a hung run from hanging the suite."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if done():
            return
        if run.poll() is not None:
            pytest.fail(f"the run ended first: {run.stderr.read() if run.stderr else ''}")
        time.sleep(0.02)
    raise TimeoutError(f"nothing after {limit_s} s; the run is hung")


def test_two_batch_workers_equal_the_local_run(job, tmp_path: Path) -> None:
    spec, inp, expected = job
    env, state = _cluster(tmp_path)
    out = tmp_path / "slurm.zarr"
    run = subprocess.run(_cmd(spec, inp, out, "--memory-limit", MEMORY,
                              "--scheduler", "slurm:2"),
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert np.array_equal(_values(out), expected)
    blocks = _ledger_blocks(out)
    assert len(blocks) == len(set(blocks)) == 27
    jobs = fake_batch.job_ids(state)
    assert jobs == ["1", "2"]
    _all_cancelled(state, jobs)
    script = (state / "job-1.sh").read_text()  # sized from the run, the rest from the config
    for line in ("#SBATCH --cpus-per-task=1", "#SBATCH --mem=2G", "#SBATCH -t 00:10:00",
                 "#SBATCH --gres=gpu:0"):
        assert line in script.splitlines(), script
    assert script.rstrip().endswith("--nthreads 1"), script  # one block at a time


def test_a_killed_batch_job_loses_no_block(job, tmp_path: Path) -> None:
    """SIGKILL of one worker's whole batch job (its process group) after the first block is
    in the ledger, the workers held: the lost job is asked for again (after distributed's
    lost-worker-timeout, 0.5 s here), and the job finishes, every block recorded once,
    output as local."""
    spec, inp, expected = job
    env, state = _cluster(tmp_path, MEMORY)
    env["DASK_DISTRIBUTED__DEPLOY__LOST_WORKER_TIMEOUT"] = "0.5s"
    gate = TraceGate(tmp_path / "trace")
    out = tmp_path / "slurm.zarr"
    run = subprocess.Popen(_cmd(spec, inp, out, "--scheduler", "slurm:2"),
                           env={**env, **gate.env()}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        gate.wait_for(run, 1)
        gate.hold()  # the workers stop at their next block's trace
        _wait_while_running(run, lambda: (out / "znni-ledger.jsonl").exists()
                            and bool(_ledger_blocks(out)))
        pid = int(gate.text.decode().split()[0])  # the worker of the first block
        group = os.getpgid(pid)
        jobs = fake_batch.job_ids(state)
        assert group in [fake_batch.pgid(state, j) for j in jobs]
        os.killpg(group, signal.SIGKILL)
        _wait_while_running(run, (state / "job-3.pgid").exists)  # the replacement, held
        gate.release()
        _, err = run.communicate(timeout=300)
        traced = gate.keys()  # every block computed, the killed job's last one again
    finally:
        if run.poll() is None:
            run.kill()
        gate.close()
    assert run.returncode == 0, err
    blocks = _ledger_blocks(out)
    assert sorted(blocks) == sorted(set(blocks)) and len(blocks) == 27
    assert set(traced) == set(blocks)
    assert np.array_equal(_values(out), expected)
    assert fake_batch.job_ids(state) == ["1", "2", "3"]
    _all_cancelled(state, ["1", "2", "3"])  # the lost one as it was replaced


def test_sigterm_releases_the_batch_jobs(job, tmp_path: Path) -> None:
    """SIGTERM to the run while its workers are held mid-block: it stops (exit 143, the
    sentence of `znni segment`), and both batch jobs are cancelled and gone."""
    spec, inp, _ = job
    env, state = _cluster(tmp_path, MEMORY)
    gate = TraceGate(tmp_path / "trace")
    out = tmp_path / "slurm.zarr"
    run = subprocess.Popen(_cmd(spec, inp, out, "--scheduler", "slurm:2"),
                           env={**env, **gate.env()}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        gate.wait_for(run, 1)
        gate.hold()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
        gate.close()
    assert run.returncode == 143, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err, err
    jobs = fake_batch.job_ids(state)
    assert jobs and len(jobs) <= 2
    _all_cancelled(state, jobs)


def test_more_workers_than_blocks_asks_for_the_blocks(tmp_path: Path, job) -> None:
    """slurm:3 over one block: one job. The network is an ONNX model with external weights,
    which the worker gets as bytes (written in its own temporary folder), not as a path."""
    _, inp, _ = job
    model = external_conv(tmp_path / "model")
    env, state = _cluster(tmp_path)
    env["TMPDIR"] = str(tmp_path / "worker-tmp")  # the worker's (and the client's) temp
    (tmp_path / "worker-tmp").mkdir()
    runs = {}
    for name, extra in (("local", ()), ("slurm", ("--scheduler", "slurm:3"))):
        out = tmp_path / f"{name}.zarr"
        run = subprocess.run(_cmd(model, inp, out, "--memory-limit", MEMORY, "--window",
                                  "8,8,8", "--scale", str(1 / 255), *extra, block=SHAPE),
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        runs[name] = _values(out)
    assert np.array_equal(runs["slurm"], runs["local"])
    assert [c[0] for c in fake_batch.calls(state)] == ["sbatch", "scancel"]
    carried = list((tmp_path / "worker-tmp" / "znni-models").glob("*/*"))
    assert sorted(p.name for p in carried) == ["m.onnx", "w.data"]


def test_int8_workers_get_the_quantized_network_as_bytes(tmp_path: Path, job) -> None:
    """--precision int8 on a batch worker: the quantized IR made on the submitting host (in
    its int8 cache) travels with the job and is written in the worker's own temporary
    folder beside the model; the labels equal a local int8 run's."""
    pytest.importorskip("nncf")
    _, inp, _ = job
    model = external_conv(tmp_path / "model")
    env, state = _cluster(tmp_path)
    env["TMPDIR"] = str(tmp_path / "worker-tmp")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the int8 cache of this run only
    (tmp_path / "worker-tmp").mkdir()
    runs = {}
    for name, extra in (("local", ()), ("slurm", ("--scheduler", "slurm:1"))):
        out = tmp_path / f"{name}.zarr"
        run = subprocess.run(_cmd(model, inp, out, "--memory-limit", MEMORY, "--window",
                                  "8,8,8", "--scale", str(1 / 255), "--precision", "int8",
                                  "--max-error", "1", *extra, block=SHAPE),
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert zarr.open_array(str(out)).attrs["znni"]["precision"] == "int8"
        runs[name] = _values(out)
    assert np.array_equal(runs["slurm"], runs["local"])
    made = [p.parent for p in (tmp_path / "cache").rglob("model.xml")]
    assert len(made) == 1  # quantized once: the second run found it in the cache
    sent = {p.name: p.read_bytes()
            for p in (tmp_path / "worker-tmp" / "znni-models").glob("*/model.*")}
    assert sent == {n: (made[0] / n).read_bytes() for n in ("model.xml", "model.bin")}


@pytest.mark.parametrize("case", ["no sbatch", "no memory", "no dask-jobqueue"])
def test_refused_before_anything_is_written(job, tmp_path: Path, case: str) -> None:
    spec, inp, _ = job
    env, state = _cluster(tmp_path, None if case == "no memory" else "1GiB")
    extra: tuple[str, ...] = ()
    if case == "no sbatch":
        empty = tmp_path / "empty"
        empty.mkdir()
        env["PATH"] = str(empty)
        said = "submits its workers with sbatch, which is not on PATH"
    elif case == "no memory":
        said = "set jobqueue.slurm.memory in your Dask configuration"
    else:  # a dask_jobqueue that cannot be imported, first on the path
        hidden = tmp_path / "hidden"
        hidden.mkdir()
        (hidden / "dask_jobqueue.py").write_text("raise ImportError('not installed')\n")
        env["PYTHONPATH"] = str(hidden)
        said = "needs dask-jobqueue: pip install 'znni[dask]'"
        extra = ("--memory-limit", MEMORY)
    out = tmp_path / "out.zarr"
    run = subprocess.run(_cmd(spec, inp, out, "--scheduler", "slurm:2", *extra), env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert said in run.stderr, run.stderr
    assert not out.exists()
    assert fake_batch.calls(state) == []


def test_a_refused_submission_is_one_sentence(job, tmp_path: Path) -> None:
    """sbatch says no (an unknown account): its words in one sentence, exit 2, the output
    left as a rerun resumes it (no block recorded), no job left."""
    spec, inp, _ = job
    env, state = _cluster(tmp_path, MEMORY)
    env["FAKE_SBATCH_REFUSE"] = "Invalid account or account/partition combination specified"
    out = tmp_path / "out.zarr"
    run = subprocess.run(_cmd(spec, inp, out, "--scheduler", "slurm:2"), env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert "sbatch refused a worker job of --scheduler slurm:2" in run.stderr, run.stderr
    assert "Invalid account" in run.stderr and "jobqueue.slurm" in run.stderr
    assert _ledger_blocks(out) == []
    assert {c[1] for c in fake_batch.calls(state)} == {"refused"}


def test_server_jobs_run_on_the_batch_cluster(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`znni serve --scheduler slurm:2`: a job's blocks on batch workers, released after it."""
    from support.naive import close
    from support.server_util import Server, reference, wait_job, write_models
    from support.server_util import write_volume as write_float_volume

    env, state = _cluster(tmp_path)
    for key in ("PATH", "DASK_CONFIG", "ZNNI_BACKEND"):
        monkeypatch.setenv(key, env[key])
    params = write_models(tmp_path / "models")
    (tmp_path / "root").mkdir()
    x = write_float_volume(tmp_path / "root" / "in.zarr", (2, 12, 14, 10), 4, (2, 6, 7, 10))
    server = Server(tmp_path / "root", tmp_path / "models", tmp_path / "jobs.sqlite",
                    extra=["--scheduler", "slurm:2"]).start()
    try:
        with server.client() as client:
            made = client.post("/v1/jobs", json={"network": "tiny", "input": "in.zarr",
                                                 "output": "out.zarr", "chunks": [6, 7, 10],
                                                 "block": [6, 7, 10]})
            assert made.status_code == 201, made.text
            wait_job(client, made.json()["id"], ("succeeded",))
    finally:
        server.stop()
    out = zarr.open_array(str(tmp_path / "root" / "out.zarr"))[...]
    assert close(out, reference(x, params, "reflect"))
    jobs = fake_batch.job_ids(state)
    assert jobs == ["1", "2"]  # 4 blocks, at most 2 workers
    _all_cancelled(state, jobs)


@pytest.mark.parametrize(("scheduler", "path_has_sbatch", "said"), [
    ("slurm:2", False, "submits its workers with sbatch, which is not on PATH"),
    ("slurm:two", True, "'slurm:two' is not one of tcp://HOST:PORT, local:N, slurm:N"),
])
def test_server_refuses_a_batch_cluster_it_cannot_use(tmp_path: Path, scheduler: str,
                                                      path_has_sbatch: bool, said: str) -> None:
    env, _ = _cluster(tmp_path)
    if not path_has_sbatch:
        (tmp_path / "empty").mkdir()
        env["PATH"] = str(tmp_path / "empty")
    run = subprocess.run([sys.executable, "-m", "znni.cli", "serve", "--scheduler", scheduler,
                          "--port", "0", "--data-root", str(tmp_path), "--models",
                          str(tmp_path), "--db", str(tmp_path / "jobs.sqlite")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert said in run.stderr, run.stderr
    assert not (tmp_path / "jobs.sqlite").exists()
