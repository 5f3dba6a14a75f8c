"""End-to-end `segment` throughput vs compute-only throughput on the same blocks (I/O hidden?).

    .venv/bin/python benchmarks/volume.py [--shape 64,128,128] [--block 32,64,64]
                                          [--backend cpu] [--channels 16] [--no-s3]

Compute-only: every block's input is read into memory first, then only
`BlockWorker.compute` is timed. End-to-end: the wall time of `segment()` on
the same job (read-ahead, compute, write-behind, ledger) into a fresh output.
The goal is end-to-end >= 0.9 x compute-only. Both are repeated alternately
and the fastest repetition of each counts (the machine may be shared).
S3: the same job with input and output in a bucket of a local S3-API server
(`moto_server` from `moto[server]`, in its own process on this machine), end to end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


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


def start_s3() -> subprocess.Popen:
    """moto's S3-API server in its own process on 127.0.0.1, with bucket `bench`; the
    environment points at it."""
    import os
    import socket

    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    for _ in range(200):
        try:
            boto3.client("s3").create_bucket(Bucket="bench")
            return server
        except Exception:  # not listening yet
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("moto_server did not start")


def s3_job(job: object, local_input: str) -> object:
    """`job` with its input copied to s3://bench/in.zarr and its output there too."""
    import zarr

    from znni.engine.stores import zarr_store

    src = zarr.open_array(local_input, mode="r")
    dst = zarr.create_array(store=zarr_store("s3://bench/in.zarr", read_only=False),
                            shape=src.shape, chunks=src.chunks, dtype=src.dtype)
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
    ap.add_argument("--reps", type=int, default=3, help="repetitions; the fastest counts")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 (local moto server) case")
    args = ap.parse_args()

    from znni.engine.blockwork import default_backend_name
    from znni.primitives.backends import make_backend

    backend = make_backend(args.backend or default_backend_name())
    s3 = None if args.no_s3 else start_s3()
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            results = measure(args, backend, Path(tmp_name), s3 is not None)
    finally:
        if s3 is not None:
            s3.kill()
            s3.wait()
    print_results(args, backend, results)


def measure(args: argparse.Namespace, backend: object, tmp: Path, with_s3: bool) -> dict:
    """Fastest compute-only, end-to-end (and S3 end-to-end) times over `args.reps`."""
    from znni.engine.blockwork import BlockSpec, BlockWorker
    from znni.engine.geometry import Halo, split_blocks
    from znni.engine.job import SegmentJob
    from znni.engine.segment import prepare_run, segment
    from znni.engine.volume import open_or_create_output
    from znni.model.network import load_network

    net = load_network(build_network(tmp, args.channels))
    inp = build_volume(tmp / "in.zarr", args.shape)
    job = SegmentJob(network=net, input_path=inp, output_path=str(tmp / "out.zarr"),
                     chunks=args.block, block=args.block)
    prep = prepare_run(job)
    blocks = split_blocks(
        prep.region, prep.block_shape, prep.chunks, Halo.for_fov(net.fov), net.pool_product
    )
    spec = BlockSpec(net, inp, job.output_path, job.border, job.dtype, prep.patch)
    scratch = open_or_create_output(
        str(tmp / "scratch.zarr"), prep.out_shape, "float32", prep.chunks
    )
    worker = BlockWorker(spec, backend=backend, output_array=scratch)  # type: ignore[arg-type]
    raws = [worker.read(b) for b in blocks]
    worker.compute(blocks[0], raws[0])  # warm-up: plans, spectra, caches
    remote = s3_job(job, inp) if with_s3 else None
    times: dict[str, list[float]] = {"compute": [], "local": [], "s3": []}
    reports = {}
    for _ in range(args.reps):  # alternate, so all see the same machine load
        t0 = time.perf_counter()
        for b, raw in zip(blocks, raws, strict=True):
            worker.compute(b, raw)
        times["compute"].append(time.perf_counter() - t0)
        for name, target in (("local", job), ("s3", remote)):
            if target is not None:
                t0 = time.perf_counter()
                reports[name] = segment(replace(target, overwrite=True), backend=backend)
                times[name].append(time.perf_counter() - t0)
    return {"voxels": sum(b.write.size for b in blocks), "blocks": len(blocks),
            "patch": prep.patch, "fov": net.fov, "reports": reports,
            "seconds": {k: min(v) for k, v in times.items() if v}}


def print_results(args: argparse.Namespace, backend: object, r: dict) -> None:
    seconds, voxels = r["seconds"], r["voxels"]
    compute_vps = voxels / seconds["compute"]
    print(
        f"backend {backend.name}, volume {args.shape}, {r['blocks']} blocks of {args.block}, "  # type: ignore[attr-defined]
        f"patch output {r['patch']}, fov {r['fov']}"
    )
    print(f"best of {args.reps} repetitions")
    print(f"{'measure':<28}{'seconds':>10}{'output voxels/s':>18}")
    print(f"{'compute only (same blocks)':<28}{seconds['compute']:>10.2f}{compute_vps:>18,.0f}")
    for name, label in (("local", "segment end to end"), ("s3", "segment end to end, S3")):
        if name not in seconds:
            continue
        vps = voxels / seconds[name]
        print(f"{label:<28}{seconds[name]:>10.2f}{vps:>18,.0f}")
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in r["reports"][name].stage_seconds.items())
        print(f"  stages: {stages}")
        print(f"  ratio {name} end-to-end / compute-only: {vps / compute_vps:.3f} (goal >= 0.9)")


if __name__ == "__main__":
    main()
