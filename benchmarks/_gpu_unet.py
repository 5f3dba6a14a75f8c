"""benchmarks/gpu.py, parts (b)-(d): MONAI's BasicUNet over a volume, `znni segment
--device gpu` against MONAI `sliding_window_inference` on torch's device, in fp32 and fp16;
the planner's predicted window time against the measured one; fp16's error against fp32.

Each run is its own child process (its own CUDA context and memory, its own timeout):
- znni: `znni segment MODEL.onnx IN.zarr OUT.zarr --device gpu --window W --overlap O
  --precision P` run twice in one process through znni.cli.main: cold (CUDA context,
  cuDNN plans, kernel compiles) and warm; the warm run is the figure. A third run is
  traced (_gpu_overlap.py: how much of the uploads and downloads the compute hides).
  Then one batch of the planner's windows through the device graph (compute only, input
  already on the device) for the measured window time.
- MONAI: the same weights on torch's device, `sliding_window_inference(x, W, sw_batch,
  model, overlap=O, mode="gaussian", sigma_scale=0.125)` after a warm-up run, for
  sw_batch 1 and 4 (the faster is the peer); fp16 is torch.autocast(float16). Its timed
  region starts with the volume in host memory and ends with the output back there; znni's
  also reads and writes the Zarr arrays.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SEGMENT_UNSUPPORTED = 3  # a child's exit code: this znni build refuses the GPU segment


def build(folder: Path, features: tuple[int, ...], size: int, window: int) -> Path:
    """The seeded BasicUNet (ONNX export and state dict) and a random uint8 volume."""
    import torch
    import zarr
    from monai.networks.nets import BasicUNet

    torch.manual_seed(0)
    model = BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=features).eval()
    torch.save(model.state_dict(), folder / "basicunet.pt")
    path = folder / "basicunet.onnx"
    with contextlib.redirect_stderr(open(os.devnull, "w")):  # the exporter's warnings
        torch.onnx.export(model, (torch.zeros(1, 1, window, window, window),), path,
                          input_names=["x"], dynamo=False,
                          dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    vol = np.random.default_rng(0).integers(0, 256, (size,) * 3, dtype=np.uint8)
    chunk = min(size, 64)
    arr = zarr.create_array(str(folder / "in.zarr"), shape=vol.shape, chunks=(chunk,) * 3,
                            dtype="uint8", overwrite=True)
    arr[:] = vol
    np.save(folder / "in.npy", vol)
    return path


def run_child(args: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """benchmarks/gpu.py --child ARGS in a fresh process; its last stdout line is JSON."""
    cmd = [sys.executable, str(HERE / "gpu.py"), "--child", json.dumps(args)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        result.setdefault("error", f"exit {done.returncode}: " + " / ".join(tail))
        result["returncode"] = done.returncode
    return result


def child(args: dict[str, Any]) -> int:
    if args["kind"] == "znni":
        result = znni_child(args)
    else:
        result = monai_child(args)
    print(json.dumps(result), flush=True)
    return SEGMENT_UNSUPPORTED if result.get("unsupported") else 0


def segment_argv(args: dict[str, Any], out: Path) -> list[str]:
    w = args["window"]
    return ["segment", str(Path(args["folder"]) / "basicunet.onnx"),
            str(Path(args["folder"]) / "in.zarr"), str(out), "--device", "gpu",
            "--window", f"{w},{w},{w}", "--overlap", str(args["overlap"]),
            "--scale", repr(1 / 255), "--precision", args["precision"], "--quiet",
            "--overwrite"]


def znni_child(args: dict[str, Any]) -> dict[str, Any]:
    from znni.cli import main

    out = Path(args["folder"]) / f"znni-{args['precision']}.zarr"
    times = []
    for _ in range(2):  # cold, warm
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err):
            rc = main(segment_argv(args, out))
        times.append(time.perf_counter() - t0)
        if rc != 0:
            msg = err.getvalue().strip().splitlines()
            return {"unsupported": rc == 2, "error": f"znni segment exit {rc}: "
                    + (msg[-1] if msg else "no message")}
    result: dict[str, Any] = {"cold_s": times[0], "warm_s": times[1], "output": str(out)}
    result.update(provenance(out))
    result.update({k: v for k, v in traced_run(args, out).items() if v is not None})
    result.update(window_compute(args))
    return result


def traced_run(args: dict[str, Any], out: Path) -> dict[str, Any]:
    """A third run with a marker on its stream before and after every upload, download and
    launch (_gpu_overlap.py): how much of the copying the compute hides."""
    try:
        from _gpu_common import standin
        from _gpu_overlap import Tracer

        from znni.cli import main

        if standin():
            from znni.primitives.gpu.device import HostDevice as cls
        else:
            from znni.primitives.gpu.cupy_device import CupyDevice as cls
        err = io.StringIO()
        with Tracer(cls) as tracer, contextlib.redirect_stderr(err):
            main([a for a in segment_argv(args, out) if a != "--quiet"])
        return {"overlap": tracer.summary(), **ran_line(err.getvalue())}
    except Exception as e:  # noqa: BLE001 - reported beside the figures, never fatal
        return {"overlap_error": f"{type(e).__name__}: {e}"[:300]}


def ran_line(stderr: str) -> dict[str, Any]:
    """What `znni segment` (without --quiet) says really ran on the device: its line
    "device NAME: convs cudnn x46, ...; peak ... [; out of memory ...][; fallbacks: ...]"."""
    for line in stderr.splitlines():
        if line.startswith("device ") and ": convs " in line:
            convs = line.split(": convs ", 1)[1].split(";", 1)[0]
            return {"convs_ran": convs, "device_line": line.strip()}
    return {}


def provenance(out: Path) -> dict[str, Any]:
    """What the output's provenance says ran: the precision, the planned conv primitives,
    and (where this build records them) the primitives that really ran."""
    import zarr

    meta = dict(zarr.open_array(str(out), mode="r").attrs.get("znni", {}))
    plan = meta.get("plan") or {}
    ran = meta.get("convs_ran") or (meta.get("gpu") or {}).get("convs_ran")
    return {"recorded_precision": meta.get("precision"),
            "planned_convs": _count(list((plan.get("primitives") or {}).values())),
            "convs_ran": ", ".join(f"{k} {v}" for k, v in sorted(ran.items())) if ran else None}


def _count(names: list[str]) -> str:
    return ", ".join(f"{n} {names.count(n)}" for n in sorted(set(names))) or "-"


def window_compute(args: dict[str, Any]) -> dict[str, Any]:
    """Median seconds per window of one batch of the planner's windows through the device
    graph, input already on the device (compute only, as the planner predicts it)."""
    try:
        from _gpu_common import make_device, release_pools

        from znni.engine.compute.graph_device import run_graph_device
        from znni.model.onnx_import import load_onnx
        from znni.primitives.gpu.graph_device import DeviceGraphOps

        w, batch = args["window"], int(args.get("batch") or 1)
        graph = load_onnx(Path(args["folder"]) / "basicunet.onnx", (w, w, w))
        release_pools()  # what the segment runs left in CuPy's pool
        device = make_device()
        ops = DeviceGraphOps(device, args["precision"])
        x = ops.to_device(np.random.default_rng(1).random((batch, 1, w, w, w), np.float32))
        prims = args.get("primitives") or None
        times = []
        for _ in range(4):  # the first is the warm-up
            t0 = time.perf_counter()
            ops.free(run_graph_device(graph, x, ops, prims))
            device.synchronize()
            times.append(time.perf_counter() - t0)
        return {"window_s": sorted(times[1:])[1] / batch, "window_batch": batch}
    except Exception as e:  # noqa: BLE001 - reported beside the figures, never fatal
        return {"window_error": f"{type(e).__name__}: {e}"[:300]}


def monai_child(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from _gpu_common import torch_setup
    from monai.inferers import sliding_window_inference
    from monai.networks.nets import BasicUNet

    folder, w, p = Path(args["folder"]), args["window"], args["precision"]
    tdev, tname = torch_setup(torch)
    model = BasicUNet(spatial_dims=3, in_channels=1, out_channels=2,
                      features=tuple(args["features"])).eval()
    model.load_state_dict(torch.load(folder / "basicunet.pt"))
    model = model.to(tdev)
    x_host = torch.from_numpy(np.load(folder / "in.npy")[None, None].astype(np.float32) / 255)

    def run(batch: int) -> Any:
        ctx = torch.autocast(tdev, dtype=torch.float16) if p == "fp16" else \
            contextlib.nullcontext()
        with torch.inference_mode(), ctx:
            y = sliding_window_inference(x_host.to(tdev), (w,) * 3, batch, model,
                                         overlap=args["overlap"], mode="gaussian",
                                         sigma_scale=0.125)
            return y.float().cpu()

    result: dict[str, Any] = {"device": tname}
    for batch in (1,) if tdev == "cpu" else (4, 1):  # warm-up: CUDA context, cuDNN autotuning
        run(batch)
    for batch in (1, 4):
        t0 = time.perf_counter()
        y = run(batch)
        result[f"sw_batch_{batch}_s"] = time.perf_counter() - t0
        if batch == 1:
            np.save(folder / f"monai-{p}.npy", y[0].numpy())
    return result


def plan_json(folder: Path, window: int, overlap: float, precision: str,
              timeout_s: float) -> dict[str, Any]:
    """`znni plan MODEL --device gpu --window W --input IN.zarr --json [--precision P]`."""
    base = [sys.executable, "-m", "znni.cli", "plan", str(folder / "basicunet.onnx"),
            "--device", "gpu", "--window", f"{window},{window},{window}", "--overlap",
            str(overlap), "--input", str(folder / "in.zarr"), "--json"]
    done = None
    for extra in (["--precision", precision], []):
        if not extra and precision != "fp32":
            break  # a plan without --precision is an fp32 plan
        try:
            done = subprocess.run(base + extra, capture_output=True, text=True,
                                  timeout=timeout_s,
                                  env={**os.environ, "PYTHONPATH": _pythonpath()})
        except subprocess.TimeoutExpired:
            return {"error": f"znni plan: timed out after {timeout_s:.0f} s"}
        if done.returncode == 0 or "--precision" not in done.stderr:
            break
    if done is None or done.returncode != 0:
        msg = (done.stderr.strip().splitlines() or ["no message"])[-1] if done else "not run"
        return {"error": f"znni plan: {msg}"}
    return json.loads(done.stdout)


def _pythonpath() -> str:
    src = str(HERE.parent / "src")
    return os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)


def compare(folder: Path, a: str, b: str) -> tuple[float, float] | None:
    """(max |a - b|, that over max |b|) of two outputs (znni-P.zarr or monai-P.npy)."""
    try:
        x, y = _load(folder, a), _load(folder, b)
    except (OSError, ValueError, FileNotFoundError):
        return None
    diff = float(np.max(np.abs(x.astype(np.float64) - y)))
    return diff, diff / max(float(np.max(np.abs(y))), 1e-30)


def _load(folder: Path, name: str) -> np.ndarray:
    if name.endswith(".npy"):
        return np.load(folder / name)
    import zarr

    return np.asarray(zarr.open_array(str(folder / name), mode="r")[:], dtype=np.float32)
