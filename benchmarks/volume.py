"""End-to-end `segment` throughput vs compute-only throughput on the same blocks (I/O hidden?).

    .venv/bin/python benchmarks/volume.py [--shape 64,128,128] [--block 32,64,64]
                                          [--backend cpu] [--channels 16]

Compute-only: every block's input is read into memory first, then only
`BlockWorker.compute` is timed. End-to-end: the wall time of `segment()` on
the same job (read-ahead, compute, write-behind, ledger) into a fresh output.
The goal is end-to-end >= 0.9 x compute-only. Both are repeated alternately
and the fastest repetition of each counts (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
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
    args = ap.parse_args()

    from znni.engine.blockwork import BlockSpec, BlockWorker, default_backend_name
    from znni.engine.geometry import Halo, split_blocks
    from znni.engine.job import SegmentJob
    from znni.engine.segment import prepare_run, segment
    from znni.engine.volume import open_or_create_output
    from znni.model.network import load_network
    from znni.primitives.backends import make_backend

    backend = make_backend(args.backend or default_backend_name())
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        net = load_network(build_network(tmp, args.channels))
        inp = build_volume(tmp / "in.zarr", args.shape)
        job = SegmentJob(
            network=net,
            input_path=inp,
            output_path=str(tmp / "out.zarr"),
            chunks=args.block,
            block=args.block,
        )
        prep = prepare_run(job)
        blocks = split_blocks(
            prep.region, prep.block_shape, prep.chunks, Halo.for_fov(net.fov), net.pool_product
        )
        spec = BlockSpec(net, inp, job.output_path, job.border, job.dtype, prep.patch)
        scratch = open_or_create_output(
            str(tmp / "scratch.zarr"), prep.out_shape, "float32", prep.chunks
        )
        worker = BlockWorker(spec, backend=backend, output_array=scratch)
        raws = [worker.read(b) for b in blocks]
        worker.compute(blocks[0], raws[0])  # warm-up: plans, spectra, caches
        voxels = sum(b.write.size for b in blocks)
        compute_times, wall_times = [], []
        for _ in range(args.reps):  # alternate, so both see the same machine load
            t0 = time.perf_counter()
            for b, raw in zip(blocks, raws, strict=True):
                worker.compute(b, raw)
            compute_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = segment(replace(job, overwrite=True), backend=backend)
            wall_times.append(time.perf_counter() - t0)
        compute_s, wall_s = min(compute_times), min(wall_times)
        del raws

    compute_vps, e2e_vps = voxels / compute_s, voxels / wall_s
    print(
        f"backend {backend.name}, volume {args.shape}, {len(blocks)} blocks of {args.block}, "
        f"patch output {prep.patch}, fov {net.fov}"
    )
    print(f"best of {args.reps} repetitions")
    print(f"{'measure':<28}{'seconds':>10}{'output voxels/s':>18}")
    print(f"{'compute only (same blocks)':<28}{compute_s:>10.2f}{compute_vps:>18,.0f}")
    print(f"{'segment end to end':<28}{wall_s:>10.2f}{e2e_vps:>18,.0f}")
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in report.stage_seconds.items())
    print(f"segment stages: {stages}")
    print(f"ratio end-to-end / compute-only: {e2e_vps / compute_vps:.3f} (goal >= 0.9)")


if __name__ == "__main__":
    main()
