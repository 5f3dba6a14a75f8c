"""U-Nets: whole `znni segment MODEL.onnx` vs MONAI sliding_window_inference, same run.

    .venv/bin/python benchmarks/unets.py [--size 128] [--window 64] [--overlap 0.25]
        [--reps 3] [--model basicunet|unet] [--features 16,16,32,64,128,16]
        [--memory-limit 8GiB] [--no-auto] [--no-bf16]

MONAI `BasicUNet(features=...)` (instance norm, LeakyReLU, transposed-conv
upsampling, padded 3^3 convs), or with `--model unet` MONAI's `UNet(channels=...)`
(strided convs, residual units, instance norm, PReLU), exported to ONNX with dynamic spatial axes. A
random uint8 volume of size^3 is written as Zarr; znni segments it end to end
(reading, windows, blending, writing, ledger) and MONAI runs
`sliding_window_inference(x, W, sw_batch_size=1, overlap, mode="gaussian",
sigma_scale=0.125)` on the same volume in memory with torch on all cores. The
same windows and blending (engine.windows) are also driven through onnxruntime and
OpenVINO (f32), one whole window per call, where installed, on the volume in memory;
their import and compile (which znni's whole run includes, as it does its Zarr I/O) are
timed apart and reported beside. Unless --no-auto, znni
also runs with the window its planner picks (no --window).

Every run is its own child process, so each reports its own peak RSS (VmHWM);
runs alternate, medians of `--reps`. Outputs are compared with MONAI's (max relative
difference) so a fast wrong run shows. Last, one W^3 window (medians
of 5, alternated in this process): znni's graph executor with the planner's
primitives, PyTorch eager, onnxruntime and OpenVINO.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import peak_rss_bytes  # noqa: E402

RUNTIMES = ("onnxruntime", "openvino")
RUNTIME_CHILDREN = ("onnxruntime", "openvino", "openvino-bf16")


def make_model(kind: str, features: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """MONAI's BasicUNet(features), or (--model unet) MONAI's UNet with those channels,
    strides of 2 and two residual units per level (instance norm, PReLU)."""
    from monai.networks.nets import UNet

    if kind == "unet":
        return UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=features,
                    strides=(2,) * (len(features) - 1), num_res_units=2).eval()
    from monai.networks.nets import BasicUNet

    return BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=features).eval()


def build(folder: Path, features: tuple[int, ...], window: int,
          kind: str = "basicunet"):  # type: ignore[no-untyped-def]
    """The torch model (seeded), its ONNX export and its weights for the child runs."""
    import torch

    torch.manual_seed(0)
    model = make_model(kind, features)
    torch.save(model.state_dict(), folder / "basicunet.pt")
    path = folder / "basicunet.onnx"
    torch.onnx.export(model, (torch.zeros(1, 1, window, window, window),), path,
                      input_names=["x"], dynamo=False,
                      dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return model, path


def run_znni(folder: Path, window: int | None, overlap: float, limit: int,
             precision: str = "fp32") -> dict:
    import zarr

    from znni.engine.job import SegmentJob
    from znni.engine.segment import segment
    from znni.model.loading import load_model

    model = load_model(folder / "basicunet.onnx", scale=1 / 255)
    tag = f"znni-{window or 'auto'}" + ("" if precision == "fp32" else f"-{precision}")
    out = folder / f"{tag}.zarr"
    job = SegmentJob(model, str(folder / "in.zarr"), str(out), overwrite=True, overlap=overlap,
                     window=(window,) * 3 if window else None, memory_limit_bytes=limit,
                     precision=precision)
    t0 = time.perf_counter()
    segment(job, quiet=True)
    seconds = time.perf_counter() - t0
    arr = zarr.open_array(str(out), mode="r")
    np.save(folder / f"{tag}.npy", arr[:])
    chosen = arr.attrs["znni"]["window"]["window"]
    return {"seconds": seconds, "window": chosen}


def run_monai(folder: Path, features: tuple[int, ...], window: int, overlap: float,
              kind: str = "basicunet") -> dict:
    import torch
    from monai.inferers import sliding_window_inference

    torch.set_num_threads(os.cpu_count() or 1)
    model = make_model(kind, features)
    model.load_state_dict(torch.load(folder / "basicunet.pt"))
    vol = np.load(folder / "in.npy")
    x = torch.from_numpy(vol[None, None].astype(np.float32) / 255)
    t0 = time.perf_counter()
    with torch.inference_mode():
        y = sliding_window_inference(x, (window,) * 3, 1, model, overlap=overlap,
                                     mode="gaussian", sigma_scale=0.125)
    seconds = time.perf_counter() - t0
    np.save(folder / "monai.npy", y[0].numpy())
    return {"seconds": seconds}


def runtime_predictor(name: str, onnx_path: Path):  # type: ignore[no-untyped-def]
    """One whole window through onnxruntime or OpenVINO (f32; "openvino-bf16": bf16)."""
    if name == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(str(onnx_path))
        return lambda x: session.run(None, {"x": x})[0]
    import openvino as ov

    # f32: OpenVINO's CPU default may compute in bf16 (relative errors ~2e-3 here)
    hint = "bf16" if name == "openvino-bf16" else "f32"
    compiled = ov.Core().compile_model(str(onnx_path), "CPU", {"INFERENCE_PRECISION_HINT": hint})
    return lambda x: compiled(x)[0]


def run_runtime(folder: Path, name: str, window: int, overlap: float) -> dict:
    """The same windows and blending as znni (engine.windows), each window by the runtime."""
    from znni.engine.compute.windows import WindowGrid, blend_box, read_window_input

    t_setup = time.perf_counter()
    predict = runtime_predictor(name, folder / "basicunet.onnx")  # its import and compile
    setup_seconds = time.perf_counter() - t_setup
    vol = np.load(folder / "in.npy")
    x = vol[None].astype(np.float32) / 255  # (1, Z, Y, X)
    grid = WindowGrid.for_volume(vol.shape, (window,) * 3, overlap)
    t0 = time.perf_counter()

    def run_window(start):  # type: ignore[no-untyped-def]
        return predict(read_window_input(x, grid, start)[None])[0]

    y = blend_box(grid, (0, 0, 0), vol.shape, run_window, "gaussian", 2)
    seconds = time.perf_counter() - t0
    np.save(folder / f"{name}.npy", y)
    return {"seconds": seconds, "setup_seconds": setup_seconds}


def child(args: argparse.Namespace) -> None:
    folder, features = Path(args.folder), _features(args.features)
    if args.child == "znni":
        result = run_znni(folder, args.window, args.overlap, args.memory_limit_bytes)
    elif args.child == "znni-auto":
        result = run_znni(folder, None, args.overlap, args.memory_limit_bytes)
    elif args.child == "znni-bf16":
        result = run_znni(folder, args.window, args.overlap, args.memory_limit_bytes, "bf16")
    elif args.child == "znni-auto-bf16":
        result = run_znni(folder, None, args.overlap, args.memory_limit_bytes, "bf16")
    elif args.child == "monai":
        result = run_monai(folder, features, args.window, args.overlap, args.model)
    else:
        result = run_runtime(folder, args.child, args.window, args.overlap)
    print(json.dumps({**result, "rss_bytes": peak_rss_bytes()}))


def spawn(name: str, folder: Path, args: argparse.Namespace) -> dict:
    """One run in a child process: its result plus its peak RSS in bytes."""
    cmd = [sys.executable, __file__, "--child", name, "--folder", str(folder),
           "--window", str(args.window), "--overlap", str(args.overlap),
           "--features", args.features, "--memory-limit", args.memory_limit,
           "--model", args.model]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} run failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_window(model, onnx_path: Path, window: int, limit: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import torch

    from znni.engine.compute.execution import planning_machine
    from znni.engine.compute.graph_forward import make_graph_backend, run_graph
    from znni.model.onnx_import import load_onnx
    from znni.planner.graph.search import plan_graph

    x = np.random.default_rng(1).random((1, 1, window, window, window), dtype=np.float32)
    graph = load_onnx(onnx_path, (window,) * 3)
    plan = plan_graph(graph, planning_machine(), limit)
    backend = make_graph_backend("cpu", plan.spectra_bytes)
    tx = torch.from_numpy(x)

    def torch_run() -> None:
        with torch.inference_mode():
            model(tx)

    runs = {"znni": lambda: run_graph(graph, x, backend, plan.primitives), "torch": torch_run}
    for name in RUNTIMES:
        try:
            predict = runtime_predictor(name, onnx_path)
        except ImportError:
            continue
        runs[name] = lambda predict=predict: predict(x)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm: plans, kernel transforms, oneDNN kernels
    for _ in range(5):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["predicted"] = plan.predicted_window_s
    return out


def _features(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _errors(a: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max, mean) absolute difference over the reference's range."""
    diff, span = np.abs(a - ref), max(1e-12, float(ref.max() - ref.min()))
    return float(diff.max()) / span, float(diff.mean()) / span


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return "unknown CPU"


def cpu_has_bf16() -> bool:
    from znni.primitives.cpu.openvino_network import cpu_has_bf16 as has

    return has()


def measure(args: argparse.Namespace, folder: Path) -> tuple[dict, dict, object, Path]:
    import zarr

    model, onnx_path = build(folder, _features(args.features), args.window, args.model)
    vol = np.random.default_rng(0).integers(0, 256, (args.size,) * 3).astype(np.uint8)
    np.save(folder / "in.npy", vol)
    zarr.create_array(str(folder / "in.zarr"), data=vol, chunks=(64, 64, 64))
    names = ["znni", "monai", *(n for n in RUNTIMES if _installed(n))]
    if args.auto:
        names.append("znni-auto")
    if args.bf16 and cpu_has_bf16():  # bf16 units: OpenVINO's and znni's bf16 runs too
        names += ["openvino-bf16", "znni-bf16", *(["znni-auto-bf16"] if args.auto else [])]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.reps):
        for name in names:
            runs[name].append(spawn(name, folder, args))
    ref = np.load(folder / "monai.npy")
    files = {"znni": f"znni-{args.window}.npy", "znni-auto": "znni-auto.npy",
             "znni-bf16": f"znni-{args.window}-bf16.npy", "znni-auto-bf16": "znni-auto-bf16.npy"}
    errors = {n: _errors(np.load(folder / files.get(n, f"{n}.npy")), ref) for n in names}
    return runs, errors, model, onnx_path


def report(args: argparse.Namespace, runs: dict, errors: dict, window: dict) -> None:
    vox, gib = args.size**3, 2**30
    med = {n: statistics.median(r["seconds"] for r in rs) for n, rs in runs.items()}
    rss = {n: max(r["rss_bytes"] for r in rs) for n, rs in runs.items()}
    name = "UNet" if args.model == "unet" else "BasicUNet"
    print(f"{name}{_features(args.features)}, {args.size}^3 uint8, window {args.window}^3, "
          f"overlap {args.overlap}, gaussian; {cpu_model()}, {os.cpu_count()} cores; medians "
          f"of {args.reps}; znni memory limit {args.memory_limit_bytes / gib:.1f} GiB")
    print(f"{'run':32s} {'seconds':>8s} {'voxels/s':>12s} {'peak RSS':>9s} {'MONAI/run':>9s} "
          f"{'max / mean diff vs MONAI fp32':>30s}")
    auto = runs.get("znni-auto", [{}])[0].get("window")
    labels = {"znni": "znni segment (same window)", "monai": "MONAI sliding_window_inference",
              "onnxruntime": "onnxruntime (same windows)",
              "openvino": "OpenVINO f32 (same windows)", "znni-auto": f"znni (planner: {auto})",
              "openvino-bf16": "OpenVINO bf16 (same windows)",
              "znni-bf16": "znni bf16 (same window)", "znni-auto-bf16": "znni bf16 (planner)"}
    for name, t in med.items():
        print(f"{labels[name]:32s} {t:8.2f} {vox / t:12,.0f} {rss[name] / gib:7.2f}Gi "
              f"{med['monai'] / t:8.2f}x {errors[name][0]:20.1e} / {errors[name][1]:.1e}")
    for name, ours in (("onnxruntime", "znni"), ("openvino", "znni"),
                       ("openvino", "znni-auto"), ("openvino-bf16", "znni-bf16"),
                       ("openvino-bf16", "znni-auto-bf16")):
        if name not in med or ours not in med:
            continue
        setup = statistics.median(r["setup_seconds"] for r in runs[name])
        print(f"{labels[ours]} / {name}: {med[name] / med[ours]:.2f}x; "
              f"{(med[name] + setup) / med[ours]:.2f}x with its import and compile "
              f"({setup:.2f} s), which znni's whole run includes")
    print(f"one {args.window}^3 window: " + ", ".join(
        f"{k} {v:.3f} s" for k, v in window.items()) +
        f"; torch/znni {window['torch'] / window['znni']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--overlap", type=float, default=0.25)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--features", default=None,
                    help="BasicUNet's features (default 16,16,32,64,128,16) or UNet's "
                    "channels (default 16,32,64,128)")
    ap.add_argument("--model", choices=("basicunet", "unet"), default="basicunet")
    ap.add_argument("--memory-limit", default="8GiB", help="znni's --memory-limit")
    ap.add_argument("--no-auto", dest="auto", action="store_false",
                    help="skip the run with the planner's window")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false",
                    help="skip the bf16 runs (they run only where the CPU has bf16 units)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.features is None:
        args.features = "16,32,64,128" if args.model == "unet" else "16,16,32,64,128,16"
    from znni.engine.units import parse_bytes

    args.memory_limit_bytes = parse_bytes(args.memory_limit)
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs, errors, model, onnx_path = measure(args, Path(tmp))
        window = per_window(model, onnx_path, args.window, args.memory_limit_bytes)
    report(args, runs, errors, window)


if __name__ == "__main__":
    main()
