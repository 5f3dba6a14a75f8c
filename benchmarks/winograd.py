"""Winograd F(4,3) and F(6,3) conv vs znni direct conv vs PyTorch CPU conv3d (oneDNN) on
U-Net layers.

3x3x3 kernels, batch 1, input n+2 per axis (output n^3). Each time is the median of
`--reps` runs, the four taken alternately (one of each per round) after one warm-up run
each, with freed memory kept in the process as `znni segment` keeps it (cpu.heap).
Errors are max|out - ref| / max(1, max|ref|) against a float64 reference (torch conv3d in
float64), inputs ~N(0, 1), weights ~N(0, 1/(Cin*27)). znni and torch use 2 threads.
Run: `python benchmarks/winograd.py`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, fmt_s, print_table, torch_conv, torch_or_none  # noqa: E402

from znni.primitives.backends import make_backend  # noqa: E402
from znni.primitives.cpu.heap import keep_freed_memory  # noqa: E402
from znni.primitives.cpu.winograd import winograd_conv3d  # noqa: E402

# the five of a BasicUNet 64^3 window, then the two big ones of a 96^3 window (F(6,3)'s case)
SHAPES = [(16, 16, 64), (32, 16, 64), (32, 32, 48), (64, 64, 32), (128, 128, 16), (16, 16, 96),
          (32, 16, 96)]


def _err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))


def bench(cin: int, cout: int, n: int, reps: int, threads: int, torch) -> list[str]:
    rng = np.random.default_rng(cin * 1000 + n)
    x = rng.standard_normal((1, cin, n + 2, n + 2, n + 2)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(cin * 27)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    backend = make_backend("cpu", threads=threads, persist_choices=False)
    pool = ThreadPoolExecutor(threads)
    runs = {
        "winograd": lambda: winograd_conv3d(x, w, b, pool=pool),
        "winograd6": lambda: winograd_conv3d(x, w, b, pool=pool, m=6),
        "direct": lambda: backend.conv3d(x, w, b, primitive="direct"),
    }
    if torch is not None:
        runs["torch"] = torch_conv(torch, x, w, b)
    outs = {k: np.asarray(f()) for k, f in runs.items()}  # warm-up, kept for the errors
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = (torch.nn.functional.conv3d(*(torch.from_numpy(a.astype(np.float64)) for a in (x, w, b)))
           .numpy() if torch is not None else outs["direct"].astype(np.float64))
    pool.shutdown()
    backend.close()
    flop = 2.0 * 27 * cin * cout * n**3
    return [f"{cin}->{cout} n={n}", fmt_s(med["winograd"]), fmt_s(med["winograd6"]),
            fmt_s(med["direct"]), fmt_s(med.get("torch")),
            fmt_ratio(med["winograd"], med["winograd6"]),
            fmt_ratio(med["direct"], med["winograd"]),
            fmt_ratio(med.get("torch"), med["winograd"]),
            f"{flop / med['winograd'] / 1e9:.0f}", f"{_err(outs['winograd'], ref):.1e}",
            f"{_err(outs['winograd6'], ref):.1e}", f"{_err(outs['direct'], ref):.1e}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    keep_freed_memory()
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(args.threads)
    rows = [bench(ci, co, n, args.reps, args.threads, torch) for ci, co, n in SHAPES]
    print_table(["layer", "F(4,3) s", "F(6,3) s", "direct s", "torch s", "F(4,3)/F(6,3)",
                 "direct/F(4,3)", "torch/F(4,3)", "F(4,3) eff. GF/s", "F(4,3) err",
                 "F(6,3) err", "direct err"], rows)


if __name__ == "__main__":
    main()
