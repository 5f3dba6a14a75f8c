"""U-Nets: whole `znni segment MODEL.onnx` processes vs MONAI users' whole processes.

    .venv/bin/python benchmarks/unets.py [--size 128] [--window 64] [--overlap 0.25]
        [--reps 3] [--model basicunet|unet] [--features 16,16,32,64,128,16]
        [--memory-limit 8GiB] [--no-auto] [--no-bf16] [--no-int8]
        [--onnx benchmarks/networks/trained_unet.onnx --em]

MONAI `BasicUNet(features=...)` (instance norm, LeakyReLU, transposed-conv
upsampling, padded 3^3 convs), or with `--model unet` MONAI's `UNet(channels=...)`
(strided convs, residual units, instance norm, PReLU), exported to ONNX with dynamic
spatial axes. A random uint8 volume of size^3 is written as Zarr. Each run is one whole
process from the Zarr input to a float32 Zarr output, as the issue compares them:
`znni segment` (at --window, and unless --no-auto at its planner's window), and a MONAI
user's script (benchmarks/_monai_user.py: `sliding_window_inference(x, W,
sw_batch_size=1, overlap, mode="gaussian", sigma_scale=0.125)` driving torch,
onnxruntime or OpenVINO f32; OpenVINO bf16 and znni bf16 where the CPU has bf16 units).
int8 (issue 53): znni `--precision int8` (NNCF calibrated on the job's own windows) against
a MONAI user quantizing the same ONNX model with NNCF as its documentation shows, on the
same number of windows (16); on random weights znni's int8 runs take `--max-error 1` (the
error of a random network means nothing). `--onnx PATH` runs a given model instead (no
torch run; the errors are then against MONAI + OpenVINO f32), and `--em` feeds it the
demo's synthetic EM (`synthetic_em`, seed 3, cells as dense as the demo's), not noise,
as the trained test U-Net (benchmarks/train_unet.py) needs: its errors mean something,
and the share of voxels whose label at 0.5 differs from the reference's is shown.
Runs alternate, medians of `--reps`; each reports its own peak RSS. Beside the whole
process, each run's inner loop is shown (MONAI's sliding window alone; znni's job from
its plan to its last write): the stricter comparison, which leaves out MONAI's imports.
Outputs are compared with MONAI-on-torch's (max and mean difference over its range), so
a fast wrong run shows. Last, one W^3 window (medians of 5, alternated in this
process, on the volume's central window): znni's graph executor with the planner's
primitives, PyTorch eager, onnxruntime and OpenVINO f32, and where they run, OpenVINO bf16
and znni's int8 network (NNCF's performance preset on 16 windows of the volume): the
per-window ratios of issue 53.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _unet_processes import run_user, run_znni  # noqa: E402

RUNTIMES = ("onnxruntime", "openvino")


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


def int8_window_predictor(onnx_path: Path, vol: np.ndarray, window: int):  # type: ignore[no-untyped-def]
    """znni's int8 network of one window (NNCF's performance preset, the first try of
    `--precision int8`), calibrated on 16 windows of the volume spread on a seeded grid."""
    import hashlib

    import openvino as ov

    from znni.primitives.cpu.openvino_int8 import quantized_network
    from znni.primitives.cpu.openvino_network import NETWORKS

    rng = np.random.default_rng(5)
    starts = rng.integers(0, max(1, vol.shape[0] - window + 1), (16, 3))
    windows = np.stack([vol[z:z + window, y:y + window, x:x + window][None]
                        for z, y, x in starts]).astype(np.float32) / 255  # (16, 1, W, W, W)
    output = ov.Core().read_model(str(onnx_path)).outputs[0].get_any_name()
    digest = hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    q = quantized_network(str(onnx_path), digest, windows, output)
    net = NETWORKS.get(q.xml, (1, 1, window, window, window), output, "int8")
    return net.run


def per_window(model, onnx_path: Path, window: int, limit: int,  # type: ignore[no-untyped-def]
               vol: np.ndarray, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from znni.engine.compute.execution import planning_machine
    from znni.engine.compute.graph_forward import make_graph_backend, run_graph
    from znni.model.onnx_import import load_onnx
    from znni.planner.graph.search import plan_graph

    c = (np.array(vol.shape) - window) // 2  # the volume's central window, as the runs see it
    x = vol[c[0]:c[0] + window, c[1]:c[1] + window, c[2]:c[2] + window][None, None]
    x = np.ascontiguousarray(x, dtype=np.float32) / 255  # (1, 1, W, W, W)
    graph = load_onnx(onnx_path, (window,) * 3)
    plan = plan_graph(graph, planning_machine(), limit)
    backend = make_graph_backend("cpu", plan.spectra_bytes)
    tx = torch.from_numpy(x)

    def torch_run() -> None:
        with torch.inference_mode():
            model(tx)

    runs = {"znni": lambda: run_graph(graph, x, backend, plan.primitives)}
    if model is not None:
        runs["torch"] = torch_run
    for name in RUNTIMES:
        try:
            predict = runtime_predictor(name, onnx_path)
        except ImportError:
            continue
        runs[name] = lambda predict=predict: predict(x)
    if args.bf16 and cpu_has_bf16() and "openvino" in runs:
        predict = runtime_predictor("openvino-bf16", onnx_path)
        runs["openvino-bf16"] = lambda: predict(x)
    if args.int8 and _installed("nncf") and "openvino" in runs:
        int8 = int8_window_predictor(onnx_path, vol, window)
        runs["znni-int8"] = lambda: int8(x)
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


def _f1(found: np.ndarray, truth: np.ndarray) -> float:
    hits = float(np.sum(found & truth))
    return 2 * hits / max(1.0, float(found.sum() + truth.sum()))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return "unknown CPU"


def cpu_has_bf16() -> bool:
    from znni.primitives.cpu.openvino_network import cpu_has_bf16 as has

    return has()


RUNS = {  # name: (label, runtime or "znni", precision, window: "same" or "auto")
    "monai": ("MONAI on torch", "torch", "f32", "same"),
    "onnxruntime": ("MONAI + onnxruntime", "onnxruntime", "f32", "same"),
    "openvino": ("MONAI + OpenVINO f32", "openvino", "f32", "same"),
    "znni": ("znni segment (same window)", "znni", "fp32", "same"),
    "znni-auto": ("znni segment (planner's window)", "znni", "fp32", "auto"),
    "openvino-bf16": ("MONAI + OpenVINO bf16", "openvino", "bf16", "same"),
    "znni-bf16": ("znni bf16 (same window)", "znni", "bf16", "same"),
    "znni-auto-bf16": ("znni bf16 (planner's window)", "znni", "bf16", "auto"),
    "openvino-int8": ("MONAI + OpenVINO int8 (NNCF)", "openvino", "int8", "same"),
    "znni-int8": ("znni int8 (same window)", "znni", "int8", "same"),
    "znni-auto-int8": ("znni int8 (planner's window)", "znni", "int8", "auto"),
}
PAIRS = (("monai", "znni"), ("onnxruntime", "znni"), ("openvino", "znni"),
         ("openvino", "znni-auto"), ("openvino-bf16", "znni-bf16"),
         ("openvino-bf16", "znni-auto-bf16"), ("znni", "znni-bf16"),
         ("openvino-int8", "znni-int8"), ("openvino-int8", "znni-auto-int8"),
         ("znni", "znni-int8"), ("znni-auto", "znni-auto-int8"),
         ("openvino", "znni-auto-int8"))


def run_one(name: str, folder: Path, args: argparse.Namespace) -> dict:
    """One whole process (benchmarks/_unet_processes.py)."""
    _, runtime, precision, which = RUNS[name]
    window = args.window if which == "same" else None
    if runtime == "znni":
        # random weights: int8's error means nothing there (its refusal is not the point)
        limit = args.max_error or ("1" if args.onnx is None else None)
        extra = ("--max-error", limit) if precision == "int8" and limit else ()
        return run_znni(folder, name, window, args.overlap, args.memory_limit, precision,
                        extra)
    return run_user(folder, name, runtime, precision, args.window, args.overlap, args.model,
                    args.features)


def run_names(args: argparse.Namespace) -> list[str]:
    names = ["znni", *(["monai"] if args.onnx is None else []),
             *(n for n in RUNTIMES if _installed(n))]
    if args.auto:
        names.append("znni-auto")
    if args.bf16 and cpu_has_bf16():  # bf16 units: OpenVINO's and znni's bf16 runs too
        names += ["openvino-bf16", "znni-bf16", *(["znni-auto-bf16"] if args.auto else [])]
    if args.int8 and _installed("nncf") and _installed("openvino"):
        names += ["openvino-int8", "znni-int8", *(["znni-auto-int8"] if args.auto else [])]
    return names


def input_volume(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray | None]:
    """(uint8 volume, its true membranes or None): noise, or with --em synthetic EM."""
    shape = (args.size,) * 3
    if not args.em:
        return np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8), None
    from znni.cli.demo_data import DEMO_SHAPE, synthetic_em

    cells = max(8, round(70 * args.size**3 / np.prod(DEMO_SHAPE)))  # the demo's density
    return synthetic_em(shape, n_cells=cells, seed=3)


def measure(args: argparse.Namespace, folder: Path
            ) -> tuple[dict, dict, dict, object, Path, np.ndarray]:
    """Every run's whole processes (alternated, `--reps` rounds), their outputs' errors
    against MONAI on torch, and the window znni's planner chose."""
    import zarr

    if args.onnx is None:
        model, onnx_path = build(folder, _features(args.features), args.window, args.model)
    else:
        import shutil

        model, onnx_path = None, folder / "basicunet.onnx"
        shutil.copy(args.onnx, onnx_path)
    vol, truth = input_volume(args)
    zarr.create_array(str(folder / "in.zarr"), data=vol, chunks=(64, 64, 64))
    names = run_names(args)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.reps):
        for name in list(names):
            try:
                runs[name].append(run_one(name, folder, args))
            except RuntimeError as e:  # int8 above --max-error: its sentence, not a crash
                if RUNS[name][2] != "int8" or "(exit 2)" not in str(e):
                    raise
                print(f"{RUNS[name][0]} refused: {str(e).splitlines()[-1]}")
                names.remove(name)
                del runs[name]
    outputs = {n: zarr.open_array(runs[n][-1]["output"], mode="r") for n in names}
    ref = outputs["monai" if args.onnx is None else "openvino"][:]
    errors = {n: (*_errors(a[:], ref), float(np.mean((a[0] > 0.5) != (ref[0] > 0.5))))
              for n, a in outputs.items()}
    if truth is not None:
        for n, a in outputs.items():
            print(f"{n}: F1 of channel 0 > 0.5 against the true membranes "
                  f"{_f1(a[0] > 0.5, truth):.3f}")
    chosen = {n: a.attrs["znni"]["window"]["window"] for n, a in outputs.items()
              if n.startswith("znni")}
    return runs, errors, chosen, model, onnx_path, vol


def report(args: argparse.Namespace, runs: dict, errors: dict, chosen: dict,
           window: dict) -> None:
    vox, gib = args.size**3, 2**30
    med = {n: statistics.median(r["seconds"] for r in rs) for n, rs in runs.items()}
    inner = {n: statistics.median(r["inner_seconds"] for r in rs) for n, rs in runs.items()}
    rss = {n: max(r["rss_bytes"] for r in rs) for n, rs in runs.items()}
    name = "UNet" if args.model == "unet" else "BasicUNet"
    print(f"{name}{_features(args.features)}, {args.size}^3 uint8 Zarr in and float32 Zarr "
          f"out, window {args.window}^3, overlap {args.overlap}, gaussian; {cpu_model()}, "
          f"{os.cpu_count()} cores; whole processes, medians of {args.reps}; znni memory "
          f"limit {args.memory_limit_bytes / gib:.1f} GiB")
    ref = "monai" if "monai" in med else "openvino"
    print(f"{'run':48s} {'process s':>9s} {'loop s':>7s} {'voxels/s':>10s} {'peak RSS':>9s} "
          f"{'ref/run':>8s} {'max / mean diff, labels changed vs ' + RUNS[ref][0]:>30s}")
    for n, t in med.items():
        label = RUNS[n][0] + (f" {tuple(chosen[n])}" if RUNS[n][3] == "auto" else "")
        print(f"{label:48s} {t:9.2f} {inner[n]:7.2f} {vox / t:10,.0f} {rss[n] / gib:7.2f}Gi "
              f"{med[ref] / t:7.2f}x {errors[n][0]:12.1e} / {errors[n][1]:.1e}, "
              f"{100 * errors[n][2]:.2f}%")
    print("loop s: MONAI's sliding_window_inference alone (after its imports, compile and "
          "read; before its write), znni's job from its plan to its last write")
    for peer, ours in PAIRS:
        if peer in med and ours in med:
            print(f"{RUNS[ours][0]} vs {RUNS[peer][0]}: {med[peer] / med[ours]:.2f}x whole "
                  f"process; {inner[peer] / inner[ours]:.2f}x loop against job")
    print(f"one {args.window}^3 window: " + ", ".join(
        f"{k} {v:.3f} s" for k, v in window.items()) +
        (f"; torch/znni {window['torch'] / window['znni']:.2f}x" if "torch" in window else ""))
    for fast in ("openvino-bf16", "znni-int8"):
        if fast in window:
            print(f"one window, {fast} against OpenVINO f32 (what znni's fp32 compiles): "
                  f"{window['openvino'] / window[fast]:.2f}x; against znni's fp32 plan "
                  f"{window['znni'] / window[fast]:.2f}x")


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
    ap.add_argument("--no-int8", dest="int8", action="store_false",
                    help="skip the int8 runs (they run where NNCF and OpenVINO are installed)")
    ap.add_argument("--onnx", help="run this ONNX model (1 input channel) instead of a "
                    "seeded MONAI one; no torch run")
    ap.add_argument("--max-error", default=None,
                    help="znni int8's --max-error (default: 1 on random weights, znni's "
                    "own default with --onnx; a run above it is reported as refused)")
    ap.add_argument("--em", action="store_true",
                    help="synthetic EM (the demo's generator) instead of noise")
    args = ap.parse_args()
    if args.features is None:
        args.features = "16,32,64,128" if args.model == "unet" else "16,16,32,64,128,16"
    from znni.engine.units import parse_bytes

    args.memory_limit_bytes = parse_bytes(args.memory_limit)
    with tempfile.TemporaryDirectory() as tmp:
        runs, errors, chosen, model, onnx_path, vol = measure(args, Path(tmp))
        window = per_window(model, onnx_path, args.window, args.memory_limit_bytes, vol, args)
    report(args, runs, errors, chosen, window)


if __name__ == "__main__":
    main()
