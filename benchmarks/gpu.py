"""GPU benchmark: output voxels/s of CPU-only, GPU-only, GPU + host RAM, CPU-GPU and a
cuDNN-style direct baseline for the four ZNNi networks, all measured in one run.

- CPU-only: `make_backend("cpu")` (the reference backend where it is absent), one patch.
- GPU-only: GpuBackend on the CUDA device, the planner-free default primitives.
- GPU + host RAM: the same patch under a memory cap of 1/4 of GPU-only's peak, so
  layers stream in sub-batches between host RAM and the device.
- CPU-GPU: `run_patches_cpu_gpu` over several patches, layers before the second
  pool on the CPU, the rest on the GPU (split_op printed).
- cuDNN baseline: every conv "gpu-direct" (cuDNN where CuPy has it).

Without CuPy or a CUDA device it prints so and exits 0; `--standin` then runs a
small smoke of the same code paths on the numpy stand-in device (its figures
are not GPU figures). Run: `python benchmarks/gpu.py [--quick] [--standin]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from math import prod
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_s, print_table  # noqa: E402
from networks import NETS, load_random  # noqa: E402

# Dense output edge per network for one patch (GPU-only sized, ZNNi's best were 88-152^3).
DEFAULT_OUTPUT = {"n337": 96, "n537": 64, "n726": 64, "n926": 48}


def _cpu_backend():
    from znni.primitives.backends import BACKEND_FACTORIES, make_backend

    return make_backend("cpu") if "cpu" in BACKEND_FACTORIES else make_backend("reference")


def _split_op(ops) -> int:
    """Split just after the first pool: the big early tensors stay in host RAM (ZNNi)."""
    from znni.primitives.base import Pool

    pools = [i for i, op in enumerate(ops) if isinstance(op, Pool)]
    return pools[0] + 1 if pools else len(ops) // 2


def bench_net(name: str, edge: int, reps: int, patches: int, device, tmp: Path) -> list[str]:
    from znni.engine.compute.cpu_gpu import run_patches_cpu_gpu
    from znni.primitives import dense_forward
    from znni.primitives.gpu.backend import GpuBackend

    net, _, _ = load_random(name, tmp)
    size = net.input_size_for((edge, edge, edge))
    out_vox = prod(net.output_size(size))
    x = np.random.default_rng(0).random((1, 1, *size), dtype=np.float32)
    ops = net.ops
    cpu = _cpu_backend()
    cap_full = device.memory_cap_bytes
    gpu = GpuBackend(device)

    def vps(fn) -> float:
        return out_vox / median_s(fn, reps)

    device.reset_peak()
    gpu_only = vps(lambda: dense_forward(ops, x, gpu))
    peak = device.peak_bytes
    ram = GpuBackend(device, memory_cap_bytes=max(1, peak // 4))
    gpu_ram = vps(lambda: dense_forward(ops, x, ram))
    device.memory_cap_bytes = cap_full
    direct = ["gpu-direct" if hasattr(op, "weight") else None for op in ops]
    baseline = vps(lambda: dense_forward(ops, x, gpu, direct))
    cpu_only = vps(lambda: dense_forward(ops, x, cpu))
    split_op = _split_op(ops)
    t0 = time.perf_counter()
    for _ in run_patches_cpu_gpu(ops, (x for _ in range(patches)), cpu, gpu, split_op):
        pass
    cpu_gpu = patches * out_vox / (time.perf_counter() - t0)
    return [
        name,
        f"{edge}^3",
        f"{baseline:,.0f}",
        f"{gpu_only:,.0f}",
        f"{cpu_only:,.0f}",
        f"{gpu_ram:,.0f}",
        f"{cpu_gpu:,.0f} (split_op={split_op})",
        f"{peak / 2**20:,.0f}",
    ]


def _narrow(name: str, tmp: Path, width: int):
    """The network's layout with `width` feature maps instead of 80 (a fast smoke)."""
    import json

    from znni.model import load_network

    spec = json.loads((Path(__file__).resolve().parent / "networks" / f"{name}.json").read_text())
    rng = np.random.default_rng(0)
    params, cin = {}, spec["in_channels"]
    convs = [i for i, layer in enumerate(spec["layers"]) if layer["kind"] == "conv"]
    for i in convs:
        layer = spec["layers"][i]
        if i != convs[-1]:
            layer["out_channels"] = width
        shape = (layer["out_channels"], cin, *layer["kernel"])
        params[f"{i}.weight"] = (rng.standard_normal(shape) / np.sqrt(prod(shape[1:]))).astype(
            np.float32
        )
        params[f"{i}.bias"] = np.zeros(shape[0], np.float32)
        cin = shape[0]
    (tmp / "narrow.json").write_text(json.dumps(spec))
    np.savez(tmp / spec["weights"], **params)
    return load_network(tmp / "narrow.json")


def standin_smoke(tmp: Path) -> None:
    """The same code paths on the numpy stand-in: a correctness smoke, not a GPU figure."""
    from znni.engine.compute.cpu_gpu import run_patches_cpu_gpu
    from znni.primitives import ReferenceBackend, dense_forward
    from znni.primitives.gpu.backend import GpuBackend
    from znni.primitives.gpu.device import HostDevice

    net = _narrow("n337", tmp, width=6)
    size = net.input_size_for((8, 8, 8))
    x = np.random.default_rng(0).random((1, 1, *size), dtype=np.float32)
    dev = HostDevice(2**31)
    try:
        t0 = time.perf_counter()
        ref = dense_forward(net.ops, x, ReferenceBackend())
        t_ref = time.perf_counter() - t0
        gpu = GpuBackend(dev, memory_cap_bytes=2**31)
        t0 = time.perf_counter()
        (got,) = list(run_patches_cpu_gpu(net.ops, [x], _cpu_backend(), gpu, _split_op(net.ops)))
        t_pipe = time.perf_counter() - t0
        err = float(np.max(np.abs(got - ref)))
        print(
            f"stand-in smoke n337 layout, 6 maps, 8^3: CPU-GPU pipeline on HostDevice "
            f"max|diff| vs reference "
            f"{err:.2e}, {t_pipe:.2f} s (reference {t_ref:.2f} s); not a GPU measurement"
        )
    finally:
        dev.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller patches, one rep")
    parser.add_argument("--standin", action="store_true", help="stand-in smoke without CUDA")
    parser.add_argument("--nets", nargs="*", default=list(NETS))
    parser.add_argument("--patches", type=int, default=4, help="patches through CPU-GPU")
    args = parser.parse_args(argv)
    from znni.primitives.gpu.cupy_device import require_cuda

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        try:
            require_cuda()
        except ValueError as e:
            print(f"no CUDA device is present, GPU benchmark skipped: {e}")
            if args.standin:
                standin_smoke(tmp)
            return 0
        from znni.primitives.gpu.cupy_device import CupyDevice

        device = CupyDevice()
        reps = 1 if args.quick else 3
        rows = []
        for name in args.nets:
            edge = DEFAULT_OUTPUT[name] // (2 if args.quick else 1)
            rows.append(bench_net(name, edge, reps, args.patches, device, tmp))
        print_table(
            [
                "net",
                "output",
                "cuDNN-direct",
                "GPU-only",
                "CPU-only",
                "GPU+RAM",
                "CPU-GPU",
                "GPU peak MiB",
            ],
            rows,
        )
        print("output voxels/s, median of", reps, "runs; all columns measured in this run")
        device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
