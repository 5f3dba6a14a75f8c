"""U-Nets: whole `znni segment MODEL.onnx` vs MONAI sliding_window_inference, same run.

    .venv/bin/python benchmarks/unets.py [--size 128] [--window 64] [--overlap 0.25]
                                         [--reps 3] [--features 16,16,32,64,128,16]

MONAI `BasicUNet(features=...)` (instance norm, LeakyReLU, transposed-conv
upsampling, padded 3^3 convs), exported to ONNX with dynamic spatial axes. A
random uint8 volume of size^3 is written as Zarr; znni segments it end to end
(reading, windows, blending, writing, ledger) and MONAI runs
`sliding_window_inference(x, W, sw_batch_size=1, overlap, mode="gaussian",
sigma_scale=0.125)` on the same volume in memory with torch on all cores. Runs
alternate; medians of `--reps`. Also per window (one W^3 window, medians of 5,
alternated): znni's graph executor, PyTorch eager and onnxruntime, all on all cores.
The outputs are compared (max relative difference) so a fast wrong run shows.
Also the same windows and blending (engine.windows) driven through onnxruntime and
OpenVINO, one whole window per call, where they are installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def build(folder: Path, features: tuple[int, ...], window: int):  # type: ignore[no-untyped-def]
    import torch
    from monai.networks.nets import BasicUNet

    torch.manual_seed(0)
    model = BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=features).eval()
    path = folder / "basicunet.onnx"
    torch.onnx.export(model, (torch.zeros(1, 1, window, window, window),), path,
                      input_names=["x"], dynamo=False,
                      dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return model, path


def run_znni(onnx_path: Path, inp: str, out: Path, window: int, overlap: float) -> float:
    from znni.engine.job import SegmentJob
    from znni.engine.segment import segment
    from znni.model.loading import load_model

    model = load_model(onnx_path, scale=1 / 255)
    job = SegmentJob(model, inp, str(out), window=(window,) * 3, overlap=overlap,
                     overwrite=True)
    t0 = time.perf_counter()
    segment(job, quiet=True)
    return time.perf_counter() - t0


def run_monai(model, vol: np.ndarray, window: int, overlap: float) -> tuple[float, np.ndarray]:  # type: ignore[no-untyped-def]
    import torch
    from monai.inferers import sliding_window_inference

    x = torch.from_numpy(vol[None, None].astype(np.float32) / 255)
    t0 = time.perf_counter()
    with torch.inference_mode():
        y = sliding_window_inference(x, (window,) * 3, 1, model, overlap=overlap,
                                     mode="gaussian", sigma_scale=0.125)
    return time.perf_counter() - t0, y[0].numpy()


def runtime_predictors(onnx_path: Path) -> dict[str, object]:
    """Whole-window predictors of the ONNX file in other runtimes (those installed)."""
    out: dict[str, object] = {}
    try:
        import onnxruntime as ort

        session = ort.InferenceSession(str(onnx_path))
        out["onnxruntime"] = lambda x: session.run(None, {"x": x})[0]
    except ImportError:
        pass
    try:
        import openvino as ov

        # f32: OpenVINO's CPU default may compute in bf16 (relative errors ~2e-3 here)
        compiled = ov.Core().compile_model(
            str(onnx_path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
        )
        out["openvino"] = lambda x: compiled(x)[0]
    except ImportError:
        pass
    return out


def run_runtime(predict, vol: np.ndarray, window: int, overlap: float) -> tuple[float, np.ndarray]:  # type: ignore[no-untyped-def]
    """The same windows and blending as znni (engine.windows), each window by `predict`:
    (seconds, output)."""
    from znni.engine.windows import WindowGrid, blend_box, read_window_input

    x = (vol[None].astype(np.float32) / 255)  # (1, Z, Y, X)
    grid = WindowGrid.for_volume(vol.shape, (window,) * 3, overlap)
    t0 = time.perf_counter()

    def run_window(start):  # type: ignore[no-untyped-def]
        return predict(read_window_input(x, grid, start)[None])[0]

    y = blend_box(grid, (0, 0, 0), vol.shape, run_window, "gaussian", 2)
    return time.perf_counter() - t0, y


def per_window(model, onnx_path: Path, window: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    import torch

    from znni.engine.graph_forward import run_graph
    from znni.model.onnx_import import load_onnx
    from znni.primitives.backends import make_backend

    x = np.random.default_rng(1).random((1, 1, window, window, window), dtype=np.float32)
    graph, backend = load_onnx(onnx_path, (window,) * 3), make_backend("cpu")
    session = ort.InferenceSession(str(onnx_path))
    tx = torch.from_numpy(x)

    def torch_run() -> None:
        with torch.inference_mode():
            model(tx)

    runs = {"znni": lambda: run_graph(graph, x, backend), "torch": torch_run,
            "onnxruntime": lambda: session.run(None, {"x": x})}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm: plans, primitive choices, oneDNN kernels
    for _ in range(5):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--overlap", type=float, default=0.25)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--features", default="16,16,32,64,128,16")
    args = ap.parse_args()
    import torch
    import zarr

    torch.set_num_threads(os.cpu_count() or 1)
    features = tuple(int(v) for v in args.features.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model, onnx_path = build(folder, features, args.window)
        vol = np.random.default_rng(0).integers(0, 256, (args.size,) * 3).astype(np.uint8)
        inp = str(folder / "in.zarr")
        zarr.create_array(inp, data=vol, chunks=(64, 64, 64))
        out = folder / "out.zarr"
        z_times, m_times = [], []
        others = runtime_predictors(onnx_path)
        o_times: dict[str, list[float]] = {k: [] for k in others}
        o_err: dict[str, float] = {}
        for _ in range(args.reps):
            z_times.append(run_znni(onnx_path, inp, out, args.window, args.overlap))
            t, ref = run_monai(model, vol, args.window, args.overlap)
            m_times.append(t)
            for name, predict in others.items():
                t_other, y_other = run_runtime(predict, vol, args.window, args.overlap)
                o_times[name].append(t_other)
                o_err[name] = float(np.abs(y_other - ref).max() / max(1.0, np.abs(ref).max()))
        got = zarr.open_array(str(out), mode="r")[:]
        err = float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))
        w = per_window(model, onnx_path, args.window)
    zm, mm = statistics.median(z_times), statistics.median(m_times)
    vox = args.size**3
    print(f"BasicUNet{features}, {args.size}^3 uint8, window {args.window}^3, overlap "
          f"{args.overlap}, gaussian; {os.cpu_count()} cores; medians of {args.reps}")
    print(f"znni segment (end to end)      {zm:8.2f} s  {vox / zm:12,.0f} voxels/s")
    print(f"MONAI sliding_window_inference {mm:8.2f} s  {vox / mm:12,.0f} voxels/s")
    for name, ts in o_times.items():
        t = statistics.median(ts)
        print(f"{name + ' (same windows, blend)':30s} {t:8.2f} s  {vox / t:12,.0f} voxels/s"
              f"   znni / {name}: {t / zm:.2f}x, max rel. diff {o_err[name]:.1e}")
    print(f"znni / MONAI speed: {mm / zm:.2f}x   max relative difference {err:.1e}")
    print(f"one {args.window}^3 window: znni {w['znni']:.3f} s, torch {w['torch']:.3f} s, "
          f"onnxruntime {w['onnxruntime']:.3f} s (torch/znni {w['torch'] / w['znni']:.2f}, "
          f"onnxruntime/znni {w['onnxruntime'] / w['znni']:.2f})")


if __name__ == "__main__":
    main()
