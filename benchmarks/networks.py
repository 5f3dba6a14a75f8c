"""Network benchmark: dense output voxels/s of znni (CpuBackend, MPF) vs PyTorch.

Default: for each ZNNi network (benchmarks/networks/*.json, random weights) the
planner's best CPU plan on this machine's detected profile within --limit (16 GiB)
runs in a child process (peak RSS = its VmHWM): one first pass (FFTW plans, kept
spectra), then --reps timed passes. The peer is the dense-equivalent PyTorch network
(stride-1 dilated max filters and convs) on the same patch, timed per layer on
z-slabs and scaled per output plane (see _dense_torch.py); znni and torch outputs
are compared on the smallest patch where the whole torch network is affordable.
--small: the old mode, one hand-picked small patch per network with the whole torch
network (slabs when over its budget) and an output comparison. --quick: --small, n337
on its smallest patch.
Run: `python benchmarks/networks.py [--small|--quick]` or `znni bench networks ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from math import prod
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, median_s, print_table, torch_or_none  # noqa: E402
from _dense_torch import dense_layers, torch_dense, torch_slabs  # noqa: E402

HERE = Path(__file__).resolve().parent / "networks"
NETS = ("n337", "n537", "n726", "n926")
# --small: dense output edge per network, the largest we could afford on 2 busy cores.
DEFAULT_OUTPUT = {"n337": 24, "n537": 8, "n726": 12, "n926": 4}
SLOW_S = 20.0  # a peer run longer than this is timed once
TORCH_FLOPS_PER_S = 1.2e11  # only to skip a whole-network peer run over its budget
METHOD = (
    "torch = dense-equivalent PyTorch network on the znni patch, each conv(+ReLU) and "
    "max filter timed on a z-slab of its real (C, y, x) input extent on that patch "
    "(random values), seconds scaled by output planes / timed planes, summed over layers"
)


def load_random(name: str, tmp: Path):  # type: ignore[no-untyped-def]
    """The spec with He-initialised random weights written next to a copy of it."""
    from znni.model import load_network

    spec = json.loads((HERE / f"{name}.json").read_text())
    params = he_params(spec, seed=0)
    (tmp / f"{name}.json").write_text(json.dumps(spec))
    np.savez(tmp / spec["weights"], **params)
    return load_network(tmp / f"{name}.json"), spec, params


def he_params(spec: dict, seed: int) -> dict[str, np.ndarray]:
    """He-initialised random weights (and small biases) for a spec's convs, seeded."""
    rng = np.random.default_rng(seed)
    params, cin = {}, spec["in_channels"]
    for i, layer in enumerate(spec["layers"]):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], cin, *layer["kernel"])
            std = np.sqrt(2.0 / prod(shape[1:]))
            params[f"{i}.weight"] = (std * rng.standard_normal(shape)).astype(np.float32)
            params[f"{i}.bias"] = (0.01 * rng.standard_normal(shape[0])).astype(np.float32)
            cin = shape[0]
    return params


def torch_flops(spec: dict, size) -> float:  # type: ignore[no-untyped-def]
    return sum(lay.flops for lay in dense_layers(spec, tuple(size)) if lay.kind == "conv")


def agree(out: np.ndarray, ref: np.ndarray) -> str:
    return "yes" if np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()) else "NO"


def whole_torch(torch, spec: dict, params: dict, x: np.ndarray, reps: int):  # type: ignore[no-untyped-def]
    """(seconds, output) of the whole dense-equivalent torch network on x."""
    model, tx = torch_dense(torch, spec, params), torch.from_numpy(x)
    with torch.inference_mode():
        t0 = time.perf_counter()
        ref = model(tx).numpy()
        t = time.perf_counter() - t0
        if t <= SLOW_S:
            t = median_s(lambda: model(tx), reps, warmup=0)
    return t, ref


def bench_small(name: str, args, torch) -> list[str]:  # type: ignore[no-untyped-def]
    """The small-patch mode: one patch, whole torch network where affordable."""
    from znni.primitives import ReferenceBackend, dense_forward
    from znni.primitives.cpu import CpuBackend

    with tempfile.TemporaryDirectory() as tmp:
        net, spec, params = load_random(name, Path(tmp))
    p = net.pool_product[0]
    edge = args.output or (p if args.quick else DEFAULT_OUTPUT[name])
    size = net.input_size_for((edge, edge, edge))
    out_vox = prod(net.output_size(size))
    x = np.random.default_rng(1).random((1, 1, *size), dtype=np.float32)
    backend = CpuBackend(
        threads=args.threads,
        fft_effort=args.effort,
        spectra_cache_bytes=int(args.spectra_gib * 2**30),
        persist_choices=False,
    )
    tracemalloc.start()
    t0 = time.perf_counter()
    out = dense_forward(net.ops, x, backend)  # plans, spectra, per-layer choice
    first_s = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    t_z = median_s(lambda: dense_forward(net.ops, x, backend), args.reps, warmup=0)
    chosen = sorted(set(backend.chooser.choices.values()))
    backend.close()
    t_t, agreed, t_slab = None, "-", None
    if torch is not None and torch_flops(spec, size) / TORCH_FLOPS_PER_S <= args.torch_budget_s:
        t_t, ref = whole_torch(torch, spec, params, x, args.reps)
        agreed = agree(out, ref)
        if args.check_slabs:
            t_slab = slab_seconds(torch, spec, params, size, args)
    elif torch is not None:  # too slow whole: the same network per layer on z-slabs, scaled
        t_t, agreed = slab_seconds(torch, spec, params, size, args), "slabs"
    t_r = None
    if args.reference:
        t_r = median_s(lambda: dense_forward(net.ops, x, ReferenceBackend()), 1, warmup=0)
    rate = lambda t: "-" if t is None else f"{out_vox / t:,.0f}"  # noqa: E731
    row = [name, "x".join(map(str, size)), f"{edge}^3", f"{first_s:.1f}", f"{t_z:.2f}",
           rate(t_z), rate(t_t), rate(t_r), fmt_ratio(t_t, t_z), fmt_ratio(t_r, t_z),
           f"{peak / 2**30:.2f}", agreed, ",".join(chosen)]
    return row + ([fmt_ratio(t_slab, t_t)] if args.check_slabs else [])


def slab_seconds(torch, spec: dict, params: dict, size, args) -> float:  # type: ignore[no-untyped-def]
    """The torch network's seconds on a patch by the z-slab method; per-layer detail
    goes to stderr (the table stays on stdout)."""
    timings = torch_slabs(torch, spec, params, tuple(size), args.torch_budget_s,
                          int(args.slab_gib * 2**30))
    for s in timings:
        lay = s.layer
        print(f"    torch op {lay.index:2d} {lay.kind:7s} dil {lay.dilation[0]} "
              f"out {'x'.join(map(str, lay.size_out))}: 1 plane {s.one_plane_s:.3f} s, "
              f"{s.planes} planes {s.slab_s:.2f} s, scaled {s.scaled_s:.1f} s",
              file=sys.stderr, flush=True)
    return sum(s.scaled_s for s in timings)


def child(args) -> None:  # type: ignore[no-untyped-def]
    """Run a plan's patch: one first pass, `reps` timed; JSON with seconds and VmHWM."""
    from znni.engine.compute.execution import build_backends, execution_for
    from znni.planner.plan import Plan
    from znni.primitives.dense import dense_forward

    plan = Plan.from_dict(json.loads(Path(args.plan).read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        net, _, _ = load_random(plan.network, Path(tmp))
    backend, _ = build_backends(execution_for(plan, "cpu"))
    x = np.random.default_rng(1).random((plan.batch, 1, *plan.input_size), dtype=np.float32)
    t0 = time.perf_counter()
    y = dense_forward(net.ops, x, backend, plan.primitives)
    first_s = time.perf_counter() - t0
    shape = list(y.shape)
    del y
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        dense_forward(net.ops, x, backend, plan.primitives)
        times.append(time.perf_counter() - t0)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    print(json.dumps({"first_s": first_s, "seconds": times, "peak_rss_bytes": hwm,
                      "out_shape": shape}))


def run_child(plan, reps: int) -> dict:  # type: ignore[no-untyped-def]
    path = Path(tempfile.gettempdir()) / f"znni-netbench-{os.getpid()}-{plan.network}.json"
    path.write_text(json.dumps(plan.to_dict()))
    try:
        out = subprocess.run(
            [sys.executable, __file__, "child", "--plan", str(path), "--reps", str(reps)],
            capture_output=True, text=True,
        )
    finally:
        path.unlink(missing_ok=True)
    if out.returncode:
        raise RuntimeError(f"child exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def check_small(name: str, plan, args, torch) -> str:  # type: ignore[no-untyped-def]
    """znni with the plan's primitives vs the whole torch network on the smallest patch,
    when the torch model estimate fits --agree-budget-s."""
    from znni.primitives.cpu import CpuBackend
    from znni.primitives.dense import dense_forward

    with tempfile.TemporaryDirectory() as tmp:
        net, spec, params = load_random(name, Path(tmp))
    size = net.input_size_for(net.pool_product)
    if torch is None or torch_flops(spec, size) / TORCH_FLOPS_PER_S > args.agree_budget_s:
        return "-"
    x = np.random.default_rng(2).random((1, 1, *size), dtype=np.float32)
    backend = CpuBackend(fft_effort="FFTW_ESTIMATE", persist_choices=False)
    out = dense_forward(net.ops, x, backend, plan.primitives)
    backend.close()
    return f"{agree(out, whole_torch(torch, spec, params, x, 1)[1])} ({size[0]}^3)"


def bench_planned(name: str, args, torch, machine) -> list[str]:  # type: ignore[no-untyped-def]
    """The planner's best CPU plan within the limit, znni in a child vs torch slabs."""
    from znni.planner.search import make_plan

    with tempfile.TemporaryDirectory() as tmp:
        net, spec, params = load_random(name, Path(tmp))
    plan = make_plan(net, machine=machine, device="cpu", memory_limit_bytes=args.limit_bytes)
    prims = ",".join(p.replace("fft-", "") for p in plan.primitives if p)
    print(f"  {name}: plan {plan.input_size} -> {plan.output_size} batch {plan.batch} [{prims}] "
          f"predicted {plan.predicted_patch_s:.1f} s/patch, {plan.peak_bytes / 2**30:.2f} GiB; "
          f"MemAvailable {available_bytes() / 2**30:.1f} GiB", file=sys.stderr, flush=True)
    reps = args.reps
    if plan.predicted_patch_s * (1 + reps) > args.znni_budget_s:
        reps = 0
        print(f"  {name}: predicted {plan.predicted_patch_s:.0f} s/patch, {1 + args.reps} passes "
              f"exceed --znni-budget-s {args.znni_budget_s:.0f}: the first pass alone is timed "
              "(it includes FFTW planning and kernel spectra)", file=sys.stderr, flush=True)
    got = run_child(plan, reps)
    out_vox = plan.batch * prod(plan.output_size)
    t_z = min(got["seconds"]) if got["seconds"] else got["first_s"]
    peak = got["peak_rss_bytes"]
    t_s = None if torch is None else slab_seconds(torch, spec, params, plan.input_size, args)
    t_w = whole_on_patch(torch, spec, params, plan, args)
    t_t = t_w if t_w is not None else t_s
    rate = lambda t: "-" if t is None else f"{out_vox / t:,.0f}"  # noqa: E731
    return [
        name, "x".join(map(str, plan.input_size)), "x".join(map(str, plan.output_size)),
        prims, f"{plan.peak_bytes / 2**30:.2f}", f"{peak / 2**30:.2f}",
        "yes" if peak <= args.limit_bytes else "NO", f"{got['first_s']:.1f}",
        f"{t_z:.1f}" if got["seconds"] else f"{t_z:.1f} (first)", rate(t_z), rate(t_t),
        "-" if t_t is None else ("whole" if t_w is not None else "slabs"), fmt_ratio(t_t, t_z),
        fmt_ratio(t_s, t_w), check_small(name, plan, args, torch),
    ]


def whole_on_patch(torch, spec: dict, params: dict, plan, args) -> float | None:  # type: ignore[no-untyped-def]
    """Seconds of one run of the whole torch network on the plan's patch, when its model
    time fits --whole-budget-s and its three largest live tensors fit --whole-gib."""
    layers = dense_layers(spec, plan.input_size)
    live_bytes = max(lay.slab_in_bytes(lay.size_out[0]) + 2 * lay.slab_out_bytes(lay.size_out[0])
                     for lay in layers)  # input, conv output, ReLU output
    if (torch is None or plan.batch != 1 or live_bytes > args.whole_gib * 2**30
            or torch_flops(spec, plan.input_size) / TORCH_FLOPS_PER_S > args.whole_budget_s):
        return None
    x = np.random.default_rng(1).random((1, 1, *plan.input_size), dtype=np.float32)
    t, _ = whole_torch(torch, spec, params, x, 1)
    print(f"    torch whole network on the patch: {t:.1f} s", file=sys.stderr, flush=True)
    return t


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", nargs="?", default="bench", choices=("bench", "child"))
    ap.add_argument("--small", action="store_true", help="hand-picked small patches (old mode)")
    ap.add_argument("--quick", action="store_true", help="--small on the smallest valid patch")
    ap.add_argument("--nets", default=None, help="comma-separated names (quick: n337 only)")
    ap.add_argument("--limit", default="16GiB", help="planner memory limit (default mode)")
    ap.add_argument("--output", type=int, default=None, help="--small: dense output edge")
    ap.add_argument("--reps", type=int, default=None,
                    help="timed passes after the first (default 1; --small: 3)")
    ap.add_argument("--znni-budget-s", type=float, default=480.0,
                    help="default mode: time only the first pass when the planner's predicted "
                    "seconds for all passes exceed this")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--effort", default="FFTW_MEASURE", help="--small: FFTW planner effort")
    ap.add_argument("--spectra-gib", type=float, default=8.0, help="--small: kept spectra bound")
    ap.add_argument("--torch-budget-s", type=float, default=None,
                    help="torch seconds per network: slab budget (default 60), or --small: "
                    "model-time bound for the whole network (default 240)")
    ap.add_argument("--slab-gib", type=float, default=3.0, help="input+output bound per slab")
    ap.add_argument("--whole-budget-s", type=float, default=120.0,
                    help="default mode: also run the whole torch network on the patch when "
                    "its model time is below this (and it fits --whole-gib)")
    ap.add_argument("--whole-gib", type=float, default=10.0)
    ap.add_argument("--agree-budget-s", type=float, default=120.0,
                    help="default mode: compare outputs on the smallest patch when the whole "
                    "torch network's model time is below this")
    ap.add_argument("--check-slabs", action="store_true",
                    help="--small: also time the slab method where the whole network ran")
    ap.add_argument("--reference", action="store_true", help="--small: also time the reference")
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.small = args.small or args.quick
    args.reps = args.reps if args.reps is not None else (3 if args.small else 1)
    if args.torch_budget_s is None:
        args.torch_budget_s = 240.0 if args.small else 60.0
    return args


SMALL_HEADER = ["net", "input", "output", "first_s", "znni_s", "znni vox/s", "torch vox/s",
                "ref vox/s", "znni/torch", "znni/ref", "peak GiB", "agree", "primitives"]
PLAN_HEADER = ["net", "input", "output", "conv primitives", "pred GiB", "peak RSS GiB",
               "<=limit", "first_s", "znni_s", "znni vox/s", "torch vox/s", "torch by",
               "znni/torch", "slabs/whole", "agree (small patch)"]


def main(argv: list[str] | None = None) -> int:
    from znni.engine.units import parse_bytes

    args = parse(argv)
    if args.mode == "child":
        child(args)
        return 0
    args.limit_bytes = parse_bytes(args.limit)
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    tv = torch.__version__ if torch else "not installed"
    names = args.nets.split(",") if args.nets else (["n337"] if args.quick else list(NETS))
    machine = None
    if args.small:
        print(f"# dense networks, small patches, batch 1, torch {tv}, {args.effort}; "
              f"median of {args.reps}; voxels/s of dense output")
    else:
        from znni.planner.detect import detect_machine

        machine = detect_machine()
        print(f"# dense networks on the planner's best CPU plan within {args.limit} "
              f"({machine.name}, calibrated {machine.calibrated}, OPENBLAS_CORETYPE="
              f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}), torch {tv}; znni_s = best of "
              f"{args.reps} timed pass(es) after a first pass; peak RSS of the znni child\n"
              f"# {METHOD}; slab budget {args.torch_budget_s:.0f} s per network")
    rows = []
    for name in names:
        rows.append(bench_small(name, args, torch) if args.small
                    else bench_planned(name, args, torch, machine))
        print("  done", name, file=sys.stderr, flush=True)
    header = SMALL_HEADER + (["slabs/whole"] if args.check_slabs else [])
    print_table(header if args.small else PLAN_HEADER, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
