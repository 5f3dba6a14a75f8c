"""A valid U-Net in exact mode: whole `znni segment` vs PyTorch over the same output tiles.

    .venv/bin/python benchmarks/valid_unet.py [--size 128] [--features 12,24,48] [--reps 3]
                                              [--tile N] [--memory-limit 8GiB]

A funkelab-style 3D U-Net (valid 3^3 convs, two per level, 2^3 max pools,
2^3 transposed convs, centre crops and concats; no padding anywhere) exported to
ONNX is window-independent, so znni tiles its output on the downsampling grid with
no overlap and no blending. znni runs end to end (Zarr in, Zarr out, ledger) with
the tile its planner picks (or --tile); PyTorch (eager, all cores) then runs the
same network over exactly the same output tiles, each from its input tile of the
border-extended volume held in memory (so PyTorch pays no I/O). Runs alternate,
medians of --reps; the outputs are compared. Every run is a child process, so
peak RSS is reported per run.
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


def make_net(features: tuple[int, ...]):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    def two(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv3d(cin, cout, 3), nn.ReLU(), nn.Conv3d(cout, cout, 3),
                             nn.ReLU())

    class ValidUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            f = features
            self.down = nn.ModuleList([two(1, f[0])] + [two(f[i - 1], f[i])
                                                        for i in range(1, len(f))])
            self.up = nn.ModuleList([nn.ConvTranspose3d(f[i], f[i - 1], 2, stride=2)
                                     for i in range(len(f) - 1, 0, -1)])
            self.merge = nn.ModuleList([two(2 * f[i - 1], f[i - 1])
                                        for i in range(len(f) - 1, 0, -1)])
            self.out = nn.Conv3d(f[0], 2, 1)

        def forward(self, x):  # type: ignore[no-untyped-def]
            skips = []
            for i, block in enumerate(self.down):
                x = block(x if i == 0 else nn.functional.max_pool3d(x, 2))
                skips.append(x)
            for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1]), strict=True):
                u = up(x)
                o = [(s - t) // 2 for s, t in zip(skip.shape[2:], u.shape[2:], strict=True)]
                crop = skip[:, :, o[0]:o[0] + u.shape[2], o[1]:o[1] + u.shape[3],
                            o[2]:o[2] + u.shape[4]]
                x = merge(torch.cat([crop, u], 1))
            return torch.sigmoid(self.out(x))

    torch.manual_seed(0)
    return ValidUNet().eval()


def run_znni(folder: Path, tile: int | None, limit: int) -> dict:
    import zarr

    from znni.engine.job import SegmentJob
    from znni.engine.segment import segment
    from znni.model.loading import load_model

    model = load_model(folder / "valid.onnx", scale=1 / 255)
    job = SegmentJob(model, str(folder / "in.zarr"), str(folder / "znni.zarr"), overwrite=True,
                     window=(tile,) * 3 if tile else None, memory_limit_bytes=limit)
    t0 = time.perf_counter()
    report = segment(job, quiet=True)
    seconds = time.perf_counter() - t0
    np.save(folder / "znni.npy", zarr.open_array(str(folder / "znni.zarr"), mode="r")[:])
    plan = report.plan or {}
    return {"seconds": seconds, "tile": plan["tile"], "tile_output": plan["tile_output"],
            "context": plan["context"], "size_factor": plan["size_factor"]}


def run_torch(folder: Path, features: tuple[int, ...], plan: dict) -> dict:
    """The network over znni's output tiles (origin-aligned, step = tile output on the grid),
    each from the reflect-extended volume in memory."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    net = make_net(features)
    net.load_state_dict(torch.load(folder / "valid.pt"))
    vol = np.load(folder / "in.npy").astype(np.float32) / 255
    tile, out, ctx, f = plan["tile"], plan["tile_output"], plan["context"], plan["size_factor"]
    steps = [out[a] // f[a] * f[a] for a in range(3)]
    starts = [list(range(0, max(1, vol.shape[a] - out[a] + steps[a]), steps[a]))
              for a in range(3)]
    lo = [c // 2 for c in ctx]
    hi = [starts[a][-1] + tile[a] - lo[a] - vol.shape[a] for a in range(3)]
    x = np.pad(vol, [(lo[a], max(0, hi[a])) for a in range(3)], mode="reflect")
    y = np.empty((2, *(starts[a][-1] + out[a] for a in range(3))), np.float32)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for z in starts[0]:
            for yy in starts[1]:
                for xx in starts[2]:
                    t = torch.from_numpy(x[None, None, z:z + tile[0], yy:yy + tile[1],
                                           xx:xx + tile[2]])
                    y[:, z:z + out[0], yy:yy + out[1], xx:xx + out[2]] = net(t)[0].numpy()
    seconds = time.perf_counter() - t0
    np.save(folder / "torch.npy", y[:, :vol.shape[0], :vol.shape[1], :vol.shape[2]])
    return {"seconds": seconds, "tiles": len(starts[0]) * len(starts[1]) * len(starts[2])}


def spawn(args: argparse.Namespace, folder: Path, name: str, plan: dict | None) -> dict:
    """One run in a child process: its result plus its peak RSS in bytes."""
    cmd = [sys.executable, __file__, "--child", name, "--folder", str(folder),
           "--features", args.features, "--memory-limit", args.memory_limit,
           "--plan", json.dumps(plan or {})] + (["--tile", str(args.tile)] if args.tile else [])
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} run failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def prepare(args: argparse.Namespace, folder: Path) -> None:
    import torch
    import zarr

    net = make_net(_features(args.features))
    torch.save(net.state_dict(), folder / "valid.pt")
    torch.onnx.export(net, (torch.zeros(1, 1, 92, 92, 92),), folder / "valid.onnx",
                      input_names=["x"], dynamo=False,
                      dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    vol = np.random.default_rng(0).integers(0, 256, (args.size,) * 3).astype(np.uint8)
    np.save(folder / "in.npy", vol)
    zarr.create_array(str(folder / "in.zarr"), data=vol, chunks=(64, 64, 64))


def _features(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--features", default="12,24,48")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tile", type=int, default=None, help="znni's tile (default: planner's)")
    ap.add_argument("--memory-limit", default="8GiB")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from znni.engine.units import parse_bytes

    limit = parse_bytes(args.memory_limit)
    if args.child:
        folder = Path(args.folder)
        result = (run_znni(folder, args.tile, limit) if args.child == "znni"
                  else run_torch(folder, _features(args.features), json.loads(args.plan)))
        print(json.dumps({**result, "rss_bytes": peak_rss_bytes()}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prepare(args, folder)
        z_runs, t_runs = [], []
        for _ in range(args.reps):
            z_runs.append(spawn(args, folder, "znni", None))
            t_runs.append(spawn(args, folder, "torch", z_runs[-1]))
        got, ref = np.load(folder / "znni.npy"), np.load(folder / "torch.npy")
        err = float(np.abs(got - ref).max())
    zs = statistics.median(r["seconds"] for r in z_runs)
    ts = statistics.median(r["seconds"] for r in t_runs)
    z0, gib = z_runs[0], 2**30
    print(f"valid U-Net features {_features(args.features)}, {args.size}^3 uint8, tile "
          f"{z0['tile']} -> output {z0['tile_output']} (context {z0['context']}), "
          f"{t_runs[0]['tiles']} tiles; {os.cpu_count()} cores; medians of {args.reps}")
    print(f"znni segment (exact, end to end) {zs:7.2f} s  peak RSS "
          f"{max(r['rss_bytes'] for r in z_runs) / gib:.2f} GiB (limit "
          f"{limit / gib:.1f} GiB)")
    print(f"PyTorch over the same tiles      {ts:7.2f} s  peak RSS "
          f"{max(r['rss_bytes'] for r in t_runs) / gib:.2f} GiB")
    print(f"znni / PyTorch speed: {ts / zs:.2f}x   max abs difference {err:.1e}")


if __name__ == "__main__":
    main()
