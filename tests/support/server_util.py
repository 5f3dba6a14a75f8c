"""Server test helpers: a tiny network, small Zarr volumes, a real `znni serve` subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import zarr

from support.naive import naive_border_pad, naive_dense, naive_fov

# 2 input channels, anisotropic kernels and pool: fov (6, 6, 4), pool product (2, 2, 1)
TINY_LAYERS = [
    {"kind": "conv", "out_channels": 3, "kernel": [3, 3, 2]},
    {"kind": "relu"},
    {"kind": "maxpool", "window": [2, 2, 1]},
    {"kind": "conv", "out_channels": 2, "kernel": [2, 2, 3]},
    {"kind": "sigmoid"},
]
TINY_INPUT = {"scale": 0.5, "shift": 0.25}
TINY_IN_CHANNELS = 2
START_TIMEOUT_S = 60.0


def tiny_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params, c = {}, TINY_IN_CHANNELS
    for i, layer in enumerate(TINY_LAYERS):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], c, *layer["kernel"])
            params[f"{i}.weight"] = (rng.standard_normal(shape) / 3).astype(np.float32)
            params[f"{i}.bias"] = (0.1 * rng.standard_normal(layer["out_channels"])).astype(
                np.float32
            )
            c = layer["out_channels"]
    return params


def reference(x: np.ndarray, params: dict, border: str, roi: tuple | None = None) -> np.ndarray:
    """The tiny model's brute-force dense output of raw (C, Z, Y, X) `x` over `roi` (default: all)."""
    fov = naive_fov(TINY_LAYERS)
    lo = tuple((f - 1) // 2 for f in fov)
    hi = tuple(f - 1 - a for f, a in zip(fov, lo, strict=True))
    padded = naive_border_pad(x, lo, hi, border).astype(np.float32)
    padded = padded * np.float32(TINY_INPUT["scale"]) + np.float32(TINY_INPUT["shift"])
    if roi is not None:  # padded index of output voxel i's window start is i
        padded = padded[
            :,
            roi[0][0] : roi[0][1] + fov[0] - 1,
            roi[1][0] : roi[1][1] + fov[1] - 1,
            roi[2][0] : roi[2][1] + fov[2] - 1,
        ]
    return naive_dense(TINY_LAYERS, params, padded)


def write_models(models: Path) -> dict[str, np.ndarray]:
    models.mkdir(parents=True, exist_ok=True)
    params = tiny_params()
    spec = {
        "name": "tiny",
        "in_channels": TINY_IN_CHANNELS,
        "weights": "tiny.npz",
        "input": TINY_INPUT,
        "layers": TINY_LAYERS,
    }
    (models / "tiny.json").write_text(json.dumps(spec))
    np.savez(models / "tiny.npz", **params)
    (models / "broken.json").write_text("{not json")
    return params


def write_volume(
    path: Path,
    shape: tuple[int, ...],
    seed: int,
    chunks: tuple[int, ...],
    overwrite: bool = False,
) -> np.ndarray:
    """A float32 array of random values at `path` (`overwrite`: replacing one there)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    array = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32",
                              overwrite=overwrite)
    array[...] = x
    return x


def new_job(store: Any, output: str, input_path: str = "/r/in", border: str = "reflect") -> int:
    """A queued job of network "tiny" in a JobStore, straight through the store."""
    return store.create(
        network="tiny",
        network_digest="d",
        input_path=input_path,
        output_path=output,
        parameters={"border": border},
    ).id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A `znni serve` subprocess on 127.0.0.1 and an httpx client for it."""

    root: Path  # data root
    models: Path
    db: Path
    token: str | None = None
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    port: int = 0
    log_paths: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "znni.cli",
            "serve",
            "--port",
            str(self.port),
            "--data-root",
            str(self.root),
            "--models",
            str(self.models),
            "--db",
            str(self.db),
            *self.extra,
        ]
        env = {k: v for k, v in os.environ.items() if k != "ZNNI_TOKEN"}
        if self.token is not None:
            env["ZNNI_TOKEN"] = self.token
        log_path = self.db.with_suffix(f".{self.port}.log")
        self.log_paths.append(log_path)
        log = open(log_path, "w")  # noqa: SIM115 - kept open for the subprocess
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).json()["workers_alive"] >= 1:
                    return self
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not start in {START_TIMEOUT_S} s:\n{self.log()}")

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def log(self) -> str:
        """Everything every start of this server logged."""
        return "".join(p.read_text() for p in self.log_paths if p.exists())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (its worker notices and exits by itself)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def wait_job(
    client: httpx.Client,
    job_id: int,
    until: tuple[str, ...],
    timeout_s: float = 120.0,
    min_done: int | None = None,
) -> dict:
    """Poll GET /v1/jobs/{id} until its status is in `until` (or `min_done` blocks are done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in until:
            return job
        if min_done is not None and job["progress"]["done"] >= min_done:
            return job
        if job["status"] in ("failed", "cancelled", "succeeded"):
            raise AssertionError(f"job {job_id} ended {job['status']}: {job['error']}")
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach {until} in {timeout_s} s")


def children_of(pid: int) -> list[int]:
    """Live child processes of `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def claim_all(db: str, slot: int, queue: Any) -> None:
    """Worker-like loop for the concurrent-claim test (a spawn target must be importable)."""
    from znni.jobs.store import JobStore

    store = JobStore(Path(db))
    got = []
    while (record := store.claim(slot)) is not None:
        got.append(record.id)
        store.finish(record.id, "succeeded")
    queue.put(got)


def commit_then_die(db: str, committed: int) -> None:
    """Spawn target for the crash test: commit `committed` jobs, then die by SIGKILL with a
    further job inserted but not committed (as a power cut or OOM kill would)."""
    from znni.jobs.store import JobStore

    store = JobStore(Path(db))
    for i in range(committed):
        store.create(
            network="tiny",
            network_digest="d",
            input_path="/r/in",
            output_path=f"/r/{i}",
            parameters={},
        )
    with store._write() as con:
        con.execute(
            "INSERT INTO jobs (status, network, network_digest, input_path, output_path,"
            " parameters, created_at) VALUES ('queued', 'tiny', 'd', '/r/in', '/r/x', '{}', 0)"
        )
        os.kill(os.getpid(), signal.SIGKILL)


def refused_detail(client: Any, body: dict, words: tuple[str, ...]) -> str:
    """POST /v1/jobs with `body`: a 422 whose `detail` is one string holding every one of
    `words`, and no job stored; returns the detail for further checks."""
    before = client.get("/v1/jobs").json()["total"]
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and all(w in detail for w in words), detail
    assert client.get("/v1/jobs").json()["total"] == before
    return detail
