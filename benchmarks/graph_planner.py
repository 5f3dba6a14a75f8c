"""The graph planner's predictions against measurements, on U-Nets exported to ONNX.

    .venv/bin/python benchmarks/graph_planner.py [--windows 64,96] [--reps 3]
                                                 [--limit 8GiB]

MONAI's BasicUNet and UNet (windows 64^3 and 96^3) and benchmarks/valid_unet.py's
valid U-Net (exact-mode tiles 92^3 and 132^3).

For each network and window: the planner's per-window time and peak memory
(planner.graph.search on this machine's calibrated profile; `znni plan` calibrates
once) against the measured median time of `--reps` passes with the planned
primitives, and the measured peak over a first pass in a fresh backend, in a child
process: its peak resident set (VmHWM, reset once the backend exists) less its resident
set then, so OpenVINO's and BLAS's own buffers count as well as numpy's (tracemalloc,
used before, sees only numpy's). The child first runs the network once on its smallest
window (imports, BLAS buffers, thread stacks: the process's base, not the window's), then
gives that pass's freed heap back (malloc_trim), so it is not reused unseen; the measured
pass runs as `segment` runs, with the heap kept (primitives/cpu/heap.py). Also
the time with the backend's own per-layer choice, for comparison. Goals: time within
±25%, peak within ±15%.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import peak_rss_bytes, print_table, reset_peak_rss  # noqa: E402

NETWORKS = {  # label: (kind, features, windows when --windows is not given)
    "BasicUNet(16,16,32,64,128,16)": ("basic", (16, 16, 32, 64, 128, 16), (64, 96)),
    "UNet(16,32,64,128; res 2; batch)": ("unet", (16, 32, 64, 128), (64, 96)),
    "valid U-Net(12,24,48) (exact)": ("valid", (12, 24, 48), (92, 132)),
}


def export(kind: str, features: tuple[int, ...], folder: Path) -> Path:
    import torch
    from monai.networks.nets import BasicUNet, UNet

    torch.manual_seed(0)
    if kind == "valid":  # benchmarks/valid_unet.py's funkelab-style network
        from valid_unet import make_net

        net = make_net(features)
    elif kind == "basic":
        net = BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=features)
    else:
        net = UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=features,
                   strides=(2,) * (len(features) - 1), num_res_units=2, norm="batch")
    path = folder / f"{kind}.onnx"
    size = 92 if kind == "valid" else 32
    torch.onnx.export(net.eval(), (torch.zeros(1, 1, size, size, size),), path, input_names=["x"],
                      dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return path


def measure(graph, plan, reps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(planned-primitives time, backend-choice time)."""
    from znni.engine.compute.graph_forward import make_graph_backend, run_graph

    x = np.random.default_rng(0).random((1, 1, *graph.window), dtype=np.float32)
    backend = make_graph_backend("cpu", plan.spectra_bytes)
    run_graph(graph, x, backend, plan.primitives)
    own = make_graph_backend("cpu", plan.spectra_bytes)
    run_graph(graph, x, own)  # the backend chooses (and times) its primitives once
    times: dict[str, list[float]] = {"plan": [], "own": []}
    for _ in range(reps):
        for key, be, prims in (("plan", backend, plan.primitives), ("own", own, None)):
            t0 = time.perf_counter()
            run_graph(graph, x, be, prims)
            times[key].append(time.perf_counter() - t0)
    return statistics.median(times["plan"]), statistics.median(times["own"])


def peak_child(path: str, window: int, limit: str) -> None:
    """In a fresh process: the resident bytes one first pass adds (input included)."""
    from znni.engine.compute.graph_forward import make_graph_backend, run_graph
    from znni.engine.units import parse_bytes
    from znni.model.loading import load_model
    from znni.model.onnx_import import load_onnx
    from znni.planner.detect import detect_machine
    from znni.planner.graph.search import plan_graph

    small = load_onnx(Path(path), load_model(Path(path)).min_window)
    run_graph(small, np.zeros((1, 1, *small.window), np.float32), make_graph_backend("cpu", 0))
    graph = load_onnx(Path(path), (window,) * 3)
    plan = plan_graph(graph, detect_machine(), parse_bytes(limit))
    backend = make_graph_backend("cpu", plan.spectra_bytes)
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)  # the small pass's heap goes back
    reset_peak_rss()
    base = peak_rss_bytes("VmRSS")
    x = np.random.default_rng(0).random((1, 1, *graph.window), dtype=np.float32)
    run_graph(graph, x, backend, plan.primitives)
    print(json.dumps({"peak_bytes": peak_rss_bytes() - base}))


def measure_peak(path: Path, window: int, limit: str) -> int:
    cmd = [sys.executable, __file__, "--peak-child", f"{path}:{window}", "--limit", limit]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", default=None,
                    help="windows for every network (default: 64,96; 92,132 for the valid one)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit", default="8GiB")
    ap.add_argument("--peak-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peak_child:
        path, window = args.peak_child.rsplit(":", 1)
        peak_child(path, int(window), args.limit)
        return
    from znni.engine.units import parse_bytes
    from znni.model.onnx_import import load_onnx
    from znni.planner.detect import detect_machine
    from znni.planner.graph.search import plan_graph

    machine = detect_machine()
    limit = parse_bytes(args.limit)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, (kind, features, windows) in NETWORKS.items():
            path = export(kind, features, Path(tmp))
            for w in ([int(v) for v in args.windows.split(",")] if args.windows else windows):
                graph = load_onnx(path, (w, w, w))
                plan = plan_graph(graph, machine, limit)
                t_plan, t_own = measure(graph, plan, args.reps)
                peak = measure_peak(path, w, args.limit)
                rows.append([label, f"{w}^3", f"{plan.predicted_window_s:.3f}", f"{t_plan:.3f}",
                             f"{t_plan / plan.predicted_window_s:.2f}", f"{t_own:.3f}",
                             f"{plan.peak_bytes / 2**20:.0f}", f"{peak / 2**20:.0f}",
                             f"{peak / plan.peak_bytes:.2f}"])
    print(f"machine {machine.name} (calibrated: {machine.calibrated}), limit {args.limit}")
    print_table(["network", "window", "pred s", "meas s", "meas/pred", "own-choice s",
                 "pred MiB", "meas MiB", "meas/pred"], rows)


if __name__ == "__main__":
    main()
