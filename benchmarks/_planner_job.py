"""`benchmarks/planner.py job`: the whole run predicted against measured (issue 39).

    .venv/bin/python benchmarks/planner.py job [--case NET:WIDTH:SHAPE:LIMIT ...]
        e.g. n337:24:100,130,150:4GiB

Per case: a random uint8 volume of SHAPE in 64^3 chunks and the ZNNi network NET with
WIDTH channels per hidden layer (random weights), or NET basicunet: MONAI's BasicUNet with
features (W, W, 2W, 4W, 8W, W) exported to ONNX (windows planned, patch column: window);
`znni plan --input --json` gives predicted_job_seconds and the layout's computed and ideal
output voxels, then the whole `znni segment` process is timed (wall, from before its
interpreter starts to its exit). Rows run in order in one cache directory, so a patch
shape an earlier row ran is warm for a later one, as the prediction knows. Ratios are
measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NETS = Path(__file__).resolve().parent / "networks"
ZNNI = [sys.executable, "-m", "znni.cli"]
CASES = ("n337:24:96,96,96:4GiB", "n337:24:100,130,150:4GiB", "n337:24:100,130,150:1500MiB",
         "n337:24:133,157,190:3GiB")


def write_network(name: str, width: int, out: Path) -> Path:
    """NET's spec with WIDTH channels per hidden conv and random weights beside it."""
    raw = json.loads((NETS / f"{name}.json").read_text())
    convs = [layer for layer in raw["layers"] if layer["kind"] == "conv"]
    for layer in convs[:-1]:
        layer["out_channels"] = width
    rng, params, cin = np.random.default_rng(0), {}, raw["in_channels"]
    for i, layer in enumerate(raw["layers"]):
        if layer["kind"] == "conv":
            k, co = layer["kernel"], layer["out_channels"]
            w = rng.standard_normal((co, cin, *k)) / np.sqrt(cin * np.prod(k))
            params[f"{i}.weight"] = w.astype(np.float32)
            params[f"{i}.bias"] = np.zeros(co, np.float32)
            cin = co
    raw["name"], raw["weights"] = f"{name}w{width}", f"{name}w{width}.npz"
    np.savez(out / raw["weights"], **params)
    path = out / f"{name}w{width}.json"
    path.write_text(json.dumps(raw))
    return path


def write_volume(shape: tuple[int, ...], out: Path) -> Path:
    import zarr

    path = out / f"v{'x'.join(map(str, shape))}.zarr"
    if not path.exists():
        a = zarr.create_array(str(path), shape=shape, chunks=(64, 64, 64), dtype="uint8")
        a[...] = np.random.default_rng(1).integers(0, 255, size=shape, dtype=np.uint8)
    return path


def write_basicunet(width: int, out: Path) -> Path:
    """MONAI's BasicUNet with features (w, w, 2w, 4w, 8w, w), exported to ONNX with dynamic
    spatial axes (benchmarks/unets.py's export; random weights, seeded)."""
    import torch
    from unets import make_model

    path = out / f"basicunet{width}.onnx"
    if not path.exists():
        torch.manual_seed(0)
        model = make_model("basicunet", (width, width, 2 * width, 4 * width, 8 * width, width))
        torch.onnx.export(model, (torch.zeros(1, 1, 64, 64, 64),), path, input_names=["x"],
                          dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return path


def row(case: str, tmp: Path) -> str:
    name, width, shape_s, limit = case.split(":")
    graph = name == "basicunet"
    spec = write_basicunet(int(width), tmp) if graph else write_network(name, int(width), tmp)
    inp = write_volume(tuple(int(v) for v in shape_s.split(",")), tmp)
    common = ["--memory-limit", limit]
    planned = subprocess.run([*ZNNI, "plan", str(spec), "--input", str(inp), *common, "--json"],
                             check=True, capture_output=True, text=True)
    plan = json.loads(planned.stdout)
    job = plan["job_seconds"]
    out = tmp / f"out-{name}-{shape_s}-{limit}.zarr"
    t0 = time.perf_counter()
    subprocess.run([*ZNNI, "segment", str(spec), str(inp), str(out), *common, "--overwrite",
                    "--quiet"], check=True)
    measured = time.perf_counter() - t0
    predicted = plan["predicted_job_seconds"]
    if graph:  # windows over the region: each computed once (blended where they overlap)
        patch, patches, computed = "x".join(map(str, plan["window"])), plan["passes"], "-"
    else:
        patch, patches = "x".join(map(str, plan["output_size"])), job["patches"]
        computed = f"{job['computed_voxels'] / job['ideal_voxels']:.2f}"
    return (f"| {name} w{width} | {shape_s.replace(',', 'x')} | {limit} | {patch} | "
            f"{job['blocks']} | {patches} | {computed} | {predicted:.1f} | "
            f"{measured:.1f} | {measured / predicted:.2f} |")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", metavar="NET:WIDTH:SHAPE:LIMIT")
    args = ap.parse_args(argv)
    print("| network | volume | limit | patch | blocks | patches | computed/ideal | "
          "predicted s | measured s | measured/predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as name:
        for case in args.case or CASES:
            print(row(case, Path(name)), flush=True)
