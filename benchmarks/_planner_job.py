"""`benchmarks/planner.py job`: the whole run predicted against measured (issue 39).

    .venv/bin/python benchmarks/planner.py job [--case NET:WIDTH:SHAPE:LIMIT ...]
        e.g. n337:24:100,130,150:4GiB
    .venv/bin/python benchmarks/planner.py job --held-out 8 --seed 52

--held-out N draws cases no one tuned on (seeded): a ZNNi net, width 16-48, each axis
64-320, limit 2-8 GiB, and keeps the first N whose predicted whole run is at most
--max-predicted seconds (default 150: n926 at width 47 over 200x300x80 is predicted at
5 hours on 2 cores; the cut is on the prediction, never on a measured ratio, and the
skipped draws are printed). Each runs first in a cache holding this machine's
calibration and no FFTW wisdom at all (a first run), then again (a rerun), and the
whole-run time and the peak RSS (wait4's ru_maxrss of the segment process) are set
against the prediction; the whole distribution is printed, not a chosen table.

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
import os
import shutil
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


def held_out_cases(n: int, seed: int) -> list[str]:
    """N cases drawn from the held-out ranges (module docstring)."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(n):
        net = str(rng.choice(["n337", "n537", "n726", "n926"]))
        width = int(rng.integers(16, 49))
        shape = ",".join(str(int(v)) for v in rng.integers(64, 321, size=3))
        limit = f"{int(rng.integers(2, 9))}GiB"
        cases.append(f"{net}:{width}:{shape}:{limit}")
    return cases


def timed_process(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one whole process (os.wait4's rusage)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return wall, usage.ru_maxrss * 1024  # Linux: kilobytes


def held_out_rows(case: str, tmp: Path, calibration: list[Path]) -> list[str]:
    """A case's first run (no FFTW wisdom) and rerun: predicted against measured."""
    name, width, shape_s, limit = case.split(":")
    spec = write_network(name, int(width), tmp)
    inp = write_volume(tuple(int(v) for v in shape_s.split(",")), tmp)
    cache = tmp / f"cache-{name}-{width}-{shape_s}"
    (cache / "znni").mkdir(parents=True)
    for path in calibration:  # this machine's calibration only: no wisdom, no choices
        shutil.copy(path, cache / "znni" / path.name)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    common = ["--memory-limit", limit]
    rows = []
    for which in ("first", "rerun"):
        planned = subprocess.run([*ZNNI, "plan", str(spec), "--input", str(inp), *common,
                                  "--json"], check=True, capture_output=True, text=True,
                                 env=env)
        job = json.loads(planned.stdout)["job_seconds"]
        out = tmp / f"out-{name}-{shape_s}.zarr"
        wall, rss = timed_process([*ZNNI, "segment", str(spec), str(inp), str(out), *common,
                                   "--overwrite", "--quiet"], env)
        rows.append(f"| {name} w{width} | {shape_s.replace(',', 'x')} | {limit} | {which} | "
                    f"{job['blocks']} | {job['fftw_planning_s']:.1f} | {job['total_s']:.1f} | "
                    f"{wall:.1f} | **{wall / job['total_s']:.2f}** | "
                    f"{job['peak_bytes'] / 2**30:.2f} | {rss / 2**30:.2f} | "
                    f"**{rss / job['peak_bytes']:.2f}** |")
        shutil.rmtree(out, ignore_errors=True)
    return rows


def predicted_total(case: str, tmp: Path) -> float:
    """The case's whole run as `znni plan --input` predicts it here (infinite where no plan
    fits the limit: the CLI's exit 2)."""
    name, width, shape_s, limit = case.split(":")
    spec = write_network(name, int(width), tmp)
    inp = write_volume(tuple(int(v) for v in shape_s.split(",")), tmp)
    planned = subprocess.run([*ZNNI, "plan", str(spec), "--input", str(inp), "--memory-limit",
                              limit, "--json"], capture_output=True, text=True)
    if planned.returncode == 2:
        return float("inf")
    planned.check_returncode()
    return float(json.loads(planned.stdout)["predicted_job_seconds"])


def kept_cases(n: int, seed: int, max_s: float, tmp: Path) -> list[str]:
    """The first N drawn cases predicted at most `max_s` (at most 20 N draws)."""
    kept: list[str] = []
    for case in held_out_cases(20 * n, seed):
        total = predicted_total(case, tmp)
        print(f"drawn {case}: predicted {total:.0f} s" + ("" if total <= max_s else
                                                         ", skipped (over the cap)"))
        if total <= max_s:
            kept.append(case)
        if len(kept) == n:
            break
    return kept


def held_out(n: int, seed: int, max_s: float) -> None:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "znni"
    calibration = sorted(base.glob("machine-*.json"))
    if not calibration:
        raise SystemExit("no calibration in the cache: run `znni plan NETWORK` once first")
    times: list[float] = []
    peaks: list[float] = []
    with tempfile.TemporaryDirectory() as name:
        cases = kept_cases(n, seed, max_s, Path(name))
        print("| network | volume | limit | run | blocks | FFTW planning predicted s | "
              "predicted s | measured s | time measured/predicted | predicted peak GiB | "
              "peak RSS GiB | peak measured/predicted |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for case in cases:
            for line in held_out_rows(case, Path(name), calibration):
                print(line, flush=True)
                times.append(float(line.split("**")[1]))
                peaks.append(float(line.split("**")[3]))
    for what, ratios, band in (("time", times, 0.2), ("peak", peaks, 0.15)):
        inside = sum(1 for r in ratios if 1 - band <= r <= 1 + band)
        print(f"{what} within +-{band:.0%}: {inside} of {len(ratios)} runs; sorted: "
              + ", ".join(f"{r:.2f}" for r in sorted(ratios)))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", metavar="NET:WIDTH:SHAPE:LIMIT")
    ap.add_argument("--held-out", type=int, metavar="N", help="N drawn cases, first run and "
                    "rerun each (module docstring)")
    ap.add_argument("--seed", type=int, default=52)
    ap.add_argument("--max-predicted", type=float, default=150.0, metavar="S")
    args = ap.parse_args(argv)
    if args.held_out:
        held_out(args.held_out, args.seed, args.max_predicted)
        return
    print("| network | volume | limit | patch | blocks | patches | computed/ideal | "
          "predicted s | measured s | measured/predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as name:
        for case in args.case or CASES:
            print(row(case, Path(name)), flush=True)
