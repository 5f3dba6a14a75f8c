"""benchmarks/gpu.py, part (a): the ZNNi networks on one patch, every device algorithm
against PyTorch's dense-equivalent network on torch's device (cuDNN convs on CUDA).

One patch (the same input for every row), dense output voxels/s:
- znni cpu-only: the CPU backend.
- znni gpu-only: GpuBackend on the device, its default per-layer primitives.
- znni gpu + host RAM: the same under a device cap of 1/4 of gpu-only's peak (1/3 or 1/2
  where a layer's single sample does not fit 1/4), so layers stream in sub-batches
  between host RAM and the device.
- znni cpu-gpu: run_patches_cpu_gpu over `patches` copies, ops up to the first pool on
  the CPU, the rest on the GPU, overlapped across patches.
- torch dense-equivalent: benchmarks/_dense_torch.py's network (stride-1 dilated max
  filters and convs), input already on the device, output left there, fp32 with TF32 off,
  cudnn.benchmark off (torch's default; autotuning these dilated convs takes minutes).
Each znni GPU row names what its convs ran (cudnn, cufft, gemm-loop), never "cuDNN" for
the GEMM loop. Outputs are compared with torch's (max |diff| / max |torch|).
"""

from __future__ import annotations

import json
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from _common import torch_or_none
from _dense_torch import torch_dense
from _gpu_common import (
    Results,
    count_layer_convs,
    engines,
    release_pools,
    reset_engines,
    timed_median,
)
from networks import load_random

SECTION = "networks"


def _split_op(ops: Any) -> int:
    """Split just after the first pool: the big early tensors stay in host RAM (ZNNi)."""
    from znni.primitives.base import Pool

    pools = [i for i, op in enumerate(ops) if isinstance(op, Pool)]
    return pools[0] + 1 if pools else len(ops) // 2


def narrow(name: str, tmp: Path, width: int) -> tuple[Any, dict, dict]:
    """The network's layout with `width` feature maps instead of 80 (the stand-in smoke)."""
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
        params[f"{i}.weight"] = (rng.standard_normal(shape) * np.sqrt(2 / prod(shape[1:])))\
            .astype(np.float32)
        params[f"{i}.bias"] = np.full(shape[0], 0.01, np.float32)
        cin = shape[0]
    (tmp / f"{name}-w{width}.json").write_text(json.dumps({**spec, "weights": f"{name}.npz"}))
    np.savez(tmp / f"{name}.npz", **params)
    return load_network(tmp / f"{name}-w{width}.json"), spec, params


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(a - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def bench_network(name: str, edge: int, width: int | None, reps: int, patches: int,
                  device: Any, gpu_label: str, cpu_label: str, tmp: Path,
                  results: Results) -> None:
    """Every row for one network; each row is added (and saved) as soon as it is measured."""
    from znni.engine.compute.cpu_gpu import run_patches_cpu_gpu
    from znni.primitives import dense_forward
    from znni.primitives.backends import BACKEND_FACTORIES, make_backend
    from znni.primitives.gpu.backend import GpuBackend

    net, spec, params = narrow(name, tmp, width) if width else load_random(name, tmp)
    ops = net.ops
    size = net.input_size_for((edge, edge, edge))
    out_vox = prod(net.output_size(size))
    x = np.random.default_rng(0).random((1, 1, *size), dtype=np.float32)
    base = {"net": name, "width": width or 80, "input": f"{size[0]}^3", "output": f"{edge}^3"}
    count_layer_convs()
    outs: dict[str, np.ndarray] = {}

    def row(what: str, dev: str, seconds: float | None, **extra: Any) -> None:
        r = {**base, "what": what, "device": dev, "seconds": seconds,
             "voxels/s": out_vox / seconds if seconds else None, **extra}
        results.add(SECTION, r)
        print(f"  {name} {what} on {dev}: "
              + (f"{seconds:.3f} s, {out_vox / seconds:,.0f} voxels/s" if seconds else "-")
              + "".join(f", {k} {v}" for k, v in extra.items()), flush=True)

    def run_into(key: str, fn: Any) -> Any:
        def go() -> None:
            outs[key] = fn()
        return go

    cap_full = device.memory_cap_bytes
    gpu = GpuBackend(device)
    reset_engines(device)
    device.reset_peak()
    t = timed_median(run_into("gpu", lambda: dense_forward(ops, x, gpu)), reps,
                     after_warmup=lambda: reset_engines(device))
    peak = device.peak_bytes
    row("znni gpu-only", gpu_label, t, convs=engines(device),
        gpu_peak_mib=round(peak / 2**20))
    _ram_row(ops, x, device, peak, reps, gpu_label, outs, row, run_into)
    device.memory_cap_bytes = cap_full
    cpu = make_backend("cpu") if "cpu" in BACKEND_FACTORIES else make_backend("reference")
    t = timed_median(run_into("cpu", lambda: dense_forward(ops, x, cpu)), reps)
    row("znni cpu-only", cpu_label, t, vs_gpu_only=_rel(outs["cpu"], outs["gpu"]))
    split = _split_op(ops)
    reset_engines(device)

    def pipeline() -> None:
        for y in run_patches_cpu_gpu(ops, (x for _ in range(patches)), cpu, gpu, split):
            outs["cpu-gpu"] = y

    t = timed_median(pipeline, 1, warmup=0) / patches
    row("znni cpu-gpu", f"{cpu_label} + {gpu_label}", t, split_after_op=split - 1,
        patches=patches, convs=engines(device))
    _torch_row(spec, params, x, outs, row)


def _ram_row(ops: Any, x: np.ndarray, device: Any, peak: int, reps: int, gpu_label: str,
             outs: dict, row: Any, run_into: Any) -> None:
    """GPU + host RAM: the smallest cap (1/4, 1/3, 1/2 of gpu-only's peak) that runs."""
    from znni.primitives import dense_forward
    from znni.primitives.gpu.backend import GpuBackend

    cap_full, note = device.memory_cap_bytes, ""
    for share in (4, 3, 2):
        try:
            ram = GpuBackend(device, memory_cap_bytes=max(1, peak // share))
            reset_engines(device)
            t = timed_median(run_into("ram", lambda b=ram: dense_forward(ops, x, b)), reps,
                             after_warmup=lambda: reset_engines(device))
            row("znni gpu + host RAM", gpu_label, t, convs=engines(device),
                gpu_cap=f"1/{share} of gpu-only's peak",
                vs_gpu_only=_rel(outs["ram"], outs["gpu"]))
            return
        except (ValueError, MemoryError) as e:
            note = f"did not run at 1/2 of gpu-only's peak: {e}"
        finally:
            device.memory_cap_bytes = cap_full
    row("znni gpu + host RAM", gpu_label, None, note=note)


def _torch_row(spec: dict, params: dict, x: np.ndarray, outs: dict, row: Any) -> None:
    torch = torch_or_none()
    if torch is None:
        row("torch dense-equivalent", "-", None, note="torch is not installed")
        return
    from _gpu_common import torch_setup

    tdev, tname = torch_setup(torch)
    torch.backends.cudnn.benchmark = False
    release_pools()
    what = "torch cuDNN dense-equivalent (fp32)" if tdev == "cuda" else \
        "torch CPU dense-equivalent (fp32)"
    try:
        t, ref = _torch_time(torch, tdev, spec, params, x)
    except RuntimeError as e:  # CUDA out of memory, typically
        row(what, tname, None, note=f"did not run: {e}"[:200])
        return
    finally:
        if tdev == "cuda":
            torch.cuda.empty_cache()
    row(what, tname, t, vs_znni_gpu=_rel(outs["gpu"], ref))


def _torch_time(torch: Any, tdev: str, spec: dict, params: dict,
                x: np.ndarray) -> tuple[float, np.ndarray]:
    """(median seconds, output) of the dense-equivalent network on torch's device: input
    already there, output left there (in torch's favour)."""
    model = torch_dense(torch, spec, params).to(tdev)
    tx = torch.from_numpy(x).to(tdev)
    got: dict[str, Any] = {}

    def run() -> None:
        with torch.inference_mode():
            got["y"] = model(tx)
            if tdev == "cuda":
                torch.cuda.synchronize()

    t = timed_median(run, 1)
    return t, got["y"].float().cpu().numpy()
