"""End-to-end `segment` throughput vs compute-only throughput on the same blocks (I/O hidden?).

    .venv/bin/python benchmarks/volume.py [--shape 64,128,128] [--block 32,64,64]
        [--backend cpu] [--channels 16] [--reps 5] [--pyramid 2] [--no-s3]
        [--s3-server moto|moto-uvicorn|s3rver] [--s3-chunks 64,64,64] [--s3-latency MS]
        [--onnx MODEL.onnx|basicunet --window 64]

Compute-only: every block's input is read into memory first, then only the
compute of segment()'s own block worker (same blocks, same plan) is timed.
End-to-end: the wall time of `segment()` on the same job (read-ahead, compute,
write-behind, ledger) into a fresh output, for three cases: a local Zarr
array, a local OME-Zarr image with a pyramid (`--pyramid` levels; the default
depth is 0 levels at this size), and S3 (input and output in a bucket of a
local S3-API server). The goal is end-to-end >= 0.9 x compute-only for each.
All are repeated alternately and the fastest repetition of each counts (the
machine may be shared).

Every row also shows the CPU seconds (user + system) of this process and of
the S3-API server's process. The server runs on this machine and takes its
CPU from the same cores as the compute, which a real object store does not;
the S3 lines print the ratio as measured and, separately and labelled, with
the server's CPU seconds taken off the wall time. Servers: `moto` (moto_server,
the tests' server: werkzeug, which closes the connection after every request),
`moto-uvicorn` (moto's app under uvicorn, with keep-alive), `s3rver` (the npm
package, `npm install s3rver`; on PATH or $S3RVER). `--s3-latency MS` makes moto wait MS
milliseconds before each answer, as a store across a network does: it shows whether
the run hides request latency, not only bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.location import Location

CTX = StoreContext()  # store options (none) and caches for this module's calls


def build_network(folder: Path, channels: int) -> Path:
    """A small n337-like net: C2 P2 C3 P2 C3 C3, ReLU, 3 sigmoid outputs (fov 25)."""
    rng = np.random.default_rng(0)
    convs = [(channels, 1, 2), (channels, channels, 3), (channels, channels, 3), (3, channels, 3)]
    layers: list[dict] = []
    params: dict[str, np.ndarray] = {}
    for j, (cout, cin, k) in enumerate(convs):
        i = len(layers)
        layers.append({"kind": "conv", "out_channels": cout, "kernel": [k, k, k]})
        w = rng.standard_normal((cout, cin, k, k, k)) / np.sqrt(cin * k**3)
        params[f"{i}.weight"] = w.astype(np.float32)
        params[f"{i}.bias"] = np.zeros(cout, np.float32)
        layers.append({"kind": "relu" if j < len(convs) - 1 else "sigmoid"})
        if j < 2:
            layers.append({"kind": "maxpool", "window": [2, 2, 2]})
    np.savez(folder / "bench.npz", **params)
    spec = {
        "name": "bench",
        "in_channels": 1,
        "weights": "bench.npz",
        "input": {"scale": 1 / 255, "shift": 0.0},
        "layers": layers,
    }
    (folder / "bench.json").write_text(json.dumps(spec))
    return folder / "bench.json"


def build_volume(path: Path, shape: tuple[int, int, int]) -> str:
    import zarr
    from scipy import ndimage

    rng = np.random.default_rng(1)
    vol = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), 2.0)
    vol = np.clip(128 + 400 * vol, 0, 255).astype(np.uint8)
    arr = zarr.create_array(store=str(path), shape=shape, chunks=(32, 32, 32), dtype="uint8")
    arr[...] = vol
    return str(path)


# moto's app served by uvicorn: moto_server's werkzeug answers every request with
# "Connection: close" (so each request is a new TCP connection and a new server thread);
# uvicorn keeps connections alive, as S3 does
MOTO_UVICORN = """
import sys, uvicorn
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
uvicorn.run(DomainDispatcherApplication(create_backend_app), host="127.0.0.1",
            port=int(sys.argv[1]), interface="wsgi", log_level="warning")
"""


# moto's app under werkzeug (threaded, as moto_server) that waits `latency` ms before it
# answers each request, as a store across a network does (S3's first byte: tens of ms)
MOTO_DELAYED = """
import sys, time
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
app, delay_s = DomainDispatcherApplication(create_backend_app), float(sys.argv[2]) / 1000
def delayed(environ, start_response):
    time.sleep(delay_s)
    return app(environ, start_response)
run_simple("127.0.0.1", int(sys.argv[1]), delayed, threaded=True)
"""


def start_s3(kind: str, data: Path, latency_ms: float = 0.0) -> subprocess.Popen:
    """An S3-API server in its own process on 127.0.0.1, with bucket `bench`; the
    environment points at it. `moto`: moto_server (moto[server], the tests' server);
    `s3rver`: the s3rver npm package (Node; `npm install s3rver`, found on PATH or as
    $S3RVER), storing objects as files under `data`. `latency_ms` > 0: moto's app waits that
    long before each answer."""
    import shutil
    import socket

    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if latency_ms > 0:
        if kind != "moto":
            raise SystemExit("--s3-latency needs --s3-server moto")
        cmd, key = [sys.executable, "-c", MOTO_DELAYED, str(port), str(latency_ms)], "bench"
    elif kind == "moto":
        cmd, key = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1",
                    "-p", str(port)], "bench"
    elif kind == "moto-uvicorn":
        cmd, key = [sys.executable, "-c", MOTO_UVICORN, str(port)], "bench"
    else:
        exe = os.environ.get("S3RVER") or shutil.which("s3rver")
        if exe is None:
            raise SystemExit("s3rver not found: npm install s3rver, then put its .bin on "
                             "PATH or set S3RVER=/path/to/node_modules/.bin/s3rver")
        cmd, key = [exe, "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "-s"], "S3RVER"
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID=key,
                      AWS_SECRET_ACCESS_KEY=key, AWS_DEFAULT_REGION="us-east-1")
    for _ in range(200):
        try:
            boto3.client("s3").create_bucket(Bucket="bench")
            return server
        except Exception:  # not listening yet
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"{kind} did not start")


def s3_job(job: object, local_input: str, chunks: tuple[int, int, int] | None) -> object:
    """`job` with its input copied to s3://bench/in.zarr (in `chunks`, default the local
    input's) and its output there too."""
    import zarr

    from znni.engine.io.stores import zarr_store

    src = zarr.open_array(local_input, mode="r")
    where = Location.parse("s3://bench/in.zarr")
    dst = zarr.create_array(store=zarr_store(where, read_only=False, ctx=CTX),
                            shape=src.shape, chunks=chunks or src.chunks, dtype=src.dtype,
                            overwrite=True)
    dst[...] = src[...]
    return replace(job, input_path="s3://bench/in.zarr", output_path="s3://bench/out.zarr")


def triple(text: str) -> tuple[int, int, int]:
    a, b, c = (int(v) for v in text.split(","))
    return (a, b, c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=triple, default=(64, 128, 128))
    ap.add_argument("--block", type=triple, default=(32, 64, 64))
    ap.add_argument("--backend", default=None, help="backend name (default: the engine's)")
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--onnx", default=None, metavar="MODEL",
                    help="run this ONNX model instead of the small built-in network, blocks "
                    "as segment chooses them; `basicunet`: the seeded BasicUNet(16,16,32,64,"
                    "128,16) of benchmarks/unets.py, exported here (needs torch and monai)")
    ap.add_argument("--window", type=int, default=64,
                    help="--onnx: the window (default 64) of a windowed model")
    ap.add_argument("--reps", type=int, default=5, help="repetitions; the fastest counts")
    ap.add_argument("--pyramid", type=int, default=2,
                    help="OME-Zarr case: pyramid levels (the default depth, coarsest <= 256 "
                    "voxels, is 0 levels for volumes up to 256; -1: that default)")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 (local server) case")
    ap.add_argument("--s3-chunks", type=triple, default=None,
                    help="input chunk shape in the bucket (default: the local input's)")
    ap.add_argument("--s3-server", choices=("moto", "moto-uvicorn", "s3rver"), default="moto",
                    help="the local S3-API server: moto_server (moto[server], as the tests), "
                    "moto's app under uvicorn (keep-alive), or s3rver (npm)")
    ap.add_argument("--s3-latency", type=float, default=0.0, metavar="MS",
                    help="moto waits MS milliseconds before answering each request, as a "
                    "store across a network does (default 0)")
    ap.add_argument("--server-core", action="store_true",
                    help="pin the S3-API server to the last core and this process to the "
                    "others, so the server's CPU is not taken from the compute")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.server_core:
        if len(cores) < 2:
            raise SystemExit("--server-core needs at least 2 cores")
        os.sched_setaffinity(0, cores[:-1])  # before the backend sizes its thread pools

    from znni.engine.workers.mpf import default_backend_name
    from znni.primitives.backends import make_backend

    backend = make_backend(args.backend or default_backend_name())
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        s3 = None if args.no_s3 else start_s3(args.s3_server, tmp / "s3", args.s3_latency)
        if s3 is not None and args.server_core:
            os.sched_setaffinity(s3.pid, cores[-1:])
        try:
            results = measure(args, backend, tmp, s3)
        finally:
            if s3 is not None:
                s3.kill()
                s3.wait()
    print_results(args, backend, results)


def measure(args: argparse.Namespace, backend: object, tmp: Path,
            server: subprocess.Popen | None) -> dict:
    """The fastest run of compute-only and of each end-to-end case over `args.reps`."""
    from znni.engine.io.formats.zarr_array import create_zarr_array
    from znni.engine.job import SegmentJob
    from znni.engine.segment import _blocks_and_spec, prepare_run, segment
    from znni.engine.workers.make import make_worker
    from znni.model.network import load_network

    inp = build_volume(tmp / "in.zarr", args.shape)
    if args.onnx is None:
        net = load_network(build_network(tmp, args.channels))
        job = SegmentJob(network=net, input_path=inp, output_path=str(tmp / "out.zarr"),
                         chunks=args.block, block=args.block)
    else:
        from znni.model.loading import load_model

        model = args.onnx
        if model == "basicunet":
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from unets import build

            with warnings.catch_warnings():  # torch's tracer on MONAI's shape checks
                warnings.simplefilter("ignore")
                model = build(tmp, (16, 16, 32, 64, 128, 16), args.window)[1]
        job = SegmentJob(network=load_model(model), input_path=inp,
                         output_path=str(tmp / "out.zarr"), window=(args.window,) * 3)
    prep = prepare_run(job)
    blocks, spec = _blocks_and_spec(job, prep)  # the blocks and plan segment() runs
    scratch = create_zarr_array(  # a new array: the scratch output of the compute-only case
        Location.parse(tmp / "scratch.zarr"), prep.out_shape, "float32", prep.chunks, ctx=CTX
    )

    def new_worker() -> object:  # a windowed worker keeps straddling windows: one per pass
        return make_worker(spec, backend=backend, output_array=scratch)

    worker = new_worker()
    raws = [worker.read(b) for b in blocks]
    worker.compute(blocks[0], raws[0])  # warm-up: plans, spectra, caches
    cases = {"local": job, "ome": replace(job, output_path=str(tmp / "out.ome.zarr"),
                                          output_format="ome-zarr",
                                          pyramid=None if args.pyramid < 0 else args.pyramid)}
    if server is not None:
        cases["s3"] = s3_job(job, inp, args.s3_chunks)
    runs: dict[str, list[Run]] = {"compute": [], **{name: [] for name in cases}}
    for _ in range(args.reps):  # alternate, so all see the same machine load
        worker = new_worker()
        with Meter(server) as m:
            for b, raw in zip(blocks, raws, strict=True):
                worker.compute(b, raw)
        runs["compute"].append(m.run)
        for name, target in cases.items():
            with Meter(server) as m:
                report = segment(replace(target, overwrite=True), backend=backend)
            runs[name].append(replace(m.run, report=report))
    return {"voxels": sum(b.write.size for b in blocks), "blocks": len(blocks),
            "block": prep.block_shape, "patch": prep.patch,
            "fov": getattr(job.network, "fov", "-"), "cases": cases,
            "best": {k: min(v, key=lambda r: r.seconds) for k, v in runs.items()}}


@dataclass(frozen=True)
class Run:
    seconds: float  # wall
    client_cpu: float  # this process, all threads (user + system)
    server_cpu: float | None  # the S3-API server process (user + system); None: no server
    report: object = None


class Meter:
    """Wall time and the CPU seconds of this process and of the server process over a
    `with` block (psutil: user + system of every thread)."""

    def __init__(self, server: subprocess.Popen | None) -> None:
        import psutil

        self.me = psutil.Process()
        self.server = psutil.Process(server.pid) if server is not None else None

    @staticmethod
    def _cpu(proc: object) -> float:
        t = proc.cpu_times()  # type: ignore[attr-defined]
        return t.user + t.system

    def __enter__(self) -> Meter:
        self.c0 = self._cpu(self.me)
        self.s0 = self._cpu(self.server) if self.server is not None else 0.0
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        seconds = time.perf_counter() - self.t0
        server = self._cpu(self.server) - self.s0 if self.server is not None else None
        self.run = Run(seconds, self._cpu(self.me) - self.c0, server)


LABELS = {"compute": "compute only (same blocks)", "local": "segment end to end, local",
          "ome": "  OME-Zarr + pyramid", "s3": "  S3 (in and out)"}


def print_results(args: argparse.Namespace, backend: object, r: dict) -> None:
    best, voxels = r["best"], r["voxels"]
    compute = best["compute"].seconds
    print(
        f"backend {backend.name}, volume {args.shape}, {r['blocks']} blocks of {r['block']}, "  # type: ignore[attr-defined]
        f"patch output {r['patch']}, fov {r['fov']}, {len(os.sched_getaffinity(0))} of "
        f"{os.cpu_count()} cores" + (" (the server on the last)" if args.server_core else "")
    )
    print(f"best of {args.reps} repetitions; CPU s = user + system seconds of the process")
    print(f"{'measure':<28}{'seconds':>8}{'voxels/s':>12}{'ratio':>7}{'client CPU s':>14}"
          f"{'server CPU s':>14}")
    for name, run in best.items():
        ratio = "" if name == "compute" else f"{compute / run.seconds:.3f}"
        server = "" if run.server_cpu is None else f"{run.server_cpu:.2f}"
        print(f"{LABELS[name]:<28}{run.seconds:>8.2f}{voxels / run.seconds:>12,.0f}{ratio:>7}"
              f"{run.client_cpu:>14.2f}{server:>14}")
    print("ratio = end-to-end voxels/s / compute-only voxels/s (goal >= 0.9)")
    for name, run in best.items():
        if name == "compute":
            continue
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in run.report.stage_seconds.items())
        print(f"  {name} stages: {stages}")
    if "s3" in best:
        print_s3(args, best["s3"], compute, r["cases"]["s3"])


def print_s3(args: argparse.Namespace, run: Run, compute: float, job: object) -> None:
    """The S3 case with the server's CPU share shown, never silently subtracted."""
    server = run.server_cpu or 0.0
    where = "its own core" if args.server_core else f"this machine's {os.cpu_count()} cores"
    wait = f", {args.s3_latency:g} ms before each answer" if args.s3_latency else ""
    chunks, block = job.chunks or "default", job.block or "chosen"  # type: ignore[attr-defined]
    print(f"S3: output chunks {chunks}, block {block}, input chunks "
          f"{args.s3_chunks or 'as local'}; the S3-API server ({args.s3_server}{wait}) ran on "
          f"{where} "
          f"and used {server:.2f} CPU s during the run's {run.seconds:.2f} s")
    if args.server_core:
        print(f"  ratio as measured (the server on its own core): {compute / run.seconds:.3f}")
        return
    cores = os.cpu_count() or 1
    alone = run.seconds - server / cores
    print(f"  ratio as measured (the server sharing the cores): {compute / run.seconds:.3f}")
    print(f"  estimate, NOT measured: the ratio with the server's CPU taken off the wall time "
          f"(wall - server CPU / {cores} = {alone:.2f} s): {compute / alone:.3f}")


if __name__ == "__main__":
    main()
