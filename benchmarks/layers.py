"""Conv layer benchmark: znni CPU primitives vs PyTorch CPU conv3d (oneDNN) and our reference.

Shapes: the seven (Cin, Cout, k, n) of the ZNNi paper plus every distinct conv layer
of the four ZNNi networks at n = 64, batch 1. Times are medians measured in
this run (the chosen primitive and torch alternately, for their ratio); kept
kernel spectra are computed before timing (they are reused across patches),
FFTW plans come from wisdom. Run: `python benchmarks/layers.py`
or `znni bench layers [--quick]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, fmt_s, median_s, print_table, torch_conv, torch_or_none  # noqa: E402

ANCHOR_SHAPES = [
    (40, 40, 3, 64),
    (80, 80, 5, 64),
    (40, 40, 7, 64),
    (80, 80, 5, 96),
    (1, 40, 5, 96),
    (40, 3, 5, 64),
    (32, 32, 3, 128),
]
NETWORK_SHAPES = [(1, 80, k, 64) for k in (2, 4, 6, 8)] + [
    (ci, co, k, 64) for k in (3, 5, 7, 9) for ci, co in ((80, 80), (80, 3))
]
QUICK_SHAPES = [(8, 8, 3, 24), (16, 16, 5, 24), (8, 8, 7, 24), (1, 8, 5, 32), (8, 3, 5, 24)]
SLOW_S = 2.0  # above this, one timed run instead of a median of `reps`


def _time(fn, reps: int) -> float:
    first = median_s(fn, 1, warmup=0)
    return first if first > SLOW_S else median_s(fn, reps, warmup=0)


def _paired(fn_a, fn_b, reps: int) -> tuple[float, float]:
    """Medians of a and b timed alternately (a, b, a, b, ...): drift in the shared machine's
    speed hits both alike, so their ratio is steadier than that of separate medians."""
    ta, tb = [], []
    for _ in range(reps):
        ta.append(_time(fn_a, 1))
        tb.append(_time(fn_b, 1))
    return statistics.median(ta), statistics.median(tb)


def bench_shape(backend, torch, shape, reps: int, reference: bool) -> list[str]:
    from znni.primitives.reference import conv3d_reference

    cin, cout, k, n = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cin, n, n, n)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, k, k, k)) / np.sqrt(cin * k**3)).astype(np.float32)
    b = np.zeros(cout, np.float32)
    chosen = backend.choose(x, w, b, None)
    times: dict[str, float | None] = {}
    for prim in ("direct", "fft-keep", "fft-recompute"):
        if prim != chosen and backend.estimate(prim, x.shape, w.shape) > 30.0:
            times[prim] = None
            continue
        backend.conv3d(x, w, b, None, prim)  # plans, kept spectra
        times[prim] = _time(lambda p=prim: backend.conv3d(x, w, b, None, p), reps)
    t_ref = _time(lambda: conv3d_reference(x, w, b), 1) if reference else None
    t_torch = t_pair = None
    if torch is not None:
        run_torch = torch_conv(torch, x, w, b)
        run_torch()  # warm oneDNN's primitive cache
        pairs = 1 if (times[chosen] or 0.0) > SLOW_S else reps
        t_pair, t_torch = _paired(lambda: backend.conv3d(x, w, b, None, chosen), run_torch, pairs)
    t = times[chosen]
    return [
        f"({cin},{cout},{k},{n})",
        chosen,
        *(fmt_s(times[p]) for p in ("direct", "fft-keep", "fft-recompute")),
        fmt_s(t_torch),
        fmt_s(t_ref),
        fmt_ratio(t_pair, t_torch),
        fmt_ratio(t, t_ref),
    ]


def blas_core() -> str:
    """OpenBLAS's kernel family, and whether OPENBLAS_CORETYPE forced it (it changes GEMM speed).

    On the 2-core AVX-512 machine, forcing Haswell (AVX2) kernels makes direct conv ~1.3x slower.
    """
    from threadpoolctl import threadpool_info

    arch = next((i.get("architecture") for i in threadpool_info() if i["user_api"] == "blas"), None)
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"{arch or 'unknown'}" + (f" (OPENBLAS_CORETYPE={forced})" if forced else " (detected)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, a smoke run")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per median")
    ap.add_argument("--threads", type=int, default=None, help="default: usable cores")
    ap.add_argument("--effort", default="FFTW_MEASURE", help="FFTW planner effort")
    ap.add_argument("--spectra-gib", type=float, default=8.0, help="kept spectra cache bound")
    ap.add_argument("--no-reference", action="store_true", help="skip the slow reference path")
    ap.add_argument("--only", default="all", choices=["all", "anchors", "networks"])
    ap.add_argument("--shape", action="append", default=[], help="CIN,COUT,K,N (repeatable)")
    args = ap.parse_args(argv)

    from znni.primitives.cpu import CpuBackend

    torch = torch_or_none()
    backend = CpuBackend(
        threads=args.threads,
        fft_effort=args.effort,
        spectra_cache_bytes=int(args.spectra_gib * 2**30),
        persist_choices=False,
    )
    if torch is not None:
        torch.set_num_threads(backend.threads)
    if args.shape:
        shapes = [tuple(int(v) for v in sh.split(",")) for sh in args.shape]
    elif args.quick:
        shapes = QUICK_SHAPES
    else:
        shapes = {"anchors": ANCHOR_SHAPES, "networks": NETWORK_SHAPES}.get(
            args.only, ANCHOR_SHAPES + NETWORK_SHAPES
        )
    print(
        f"# conv layers, batch 1, {backend.threads} threads, {args.effort}, torch "
        f"{torch.__version__ if torch else 'not installed'}; medians of {args.reps} "
        f"(one run above {SLOW_S:.0f} s); BLAS {blas_core()}; seconds; torch and chosen/torch "
        f"from the chosen primitive and torch timed alternately"
    )
    rows = []
    for shape in shapes:
        rows.append(bench_shape(backend, torch, shape, args.reps, not args.no_reference))
        print("  done", rows[-1][0], file=sys.stderr, flush=True)
        backend.spectra.clear()
    header = ["(Cin,Cout,k,n)", "chosen", "direct", "fft-keep", "fft-recompute"]
    header += ["torch", "reference", "chosen/torch", "chosen/reference"]
    print_table(header, rows)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
