"""Planner accuracy: predicted vs measured peak RSS, patch time, and regret.

    .venv/bin/python benchmarks/planner.py memory            # n337, n537 at 3 sizes each
    .venv/bin/python benchmarks/planner.py time [--limit 3GiB]   # chosen plans, 4 networks
    .venv/bin/python benchmarks/planner.py regret [--limit 3GiB] # chosen vs >= 8 alternatives
    .venv/bin/python benchmarks/planner.py limit [--limit 2GiB]  # a run under a tight limit
    .venv/bin/python benchmarks/planner.py graph [--reps 3]      # U-Nets: graph_planner.py
    .venv/bin/python benchmarks/planner.py job [--case ...]      # whole runs: _planner_job.py

Every measurement runs in a fresh child process (so VmHWM is that run's peak RSS)
on the real CpuBackend with random weights; the profile is this machine's
(calibrated once, cached). Ratios are measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from math import prod
from pathlib import Path

import numpy as np

from znni.engine.units import parse_bytes
from znni.model.network import network_shapes_only
from znni.planner.costs import layer_seconds
from znni.planner.detect import detect_machine
from znni.planner.machine import MachineProfile
from znni.planner.memory import (
    layer_memory,
    pass_peak_bytes,
    weights_bytes,
    workspace_cache_bytes,
)
from znni.planner.plan import Plan
from znni.planner.search import build, evaluate, make_plan
from znni.planner.stages import Stage, fused

NETS = Path(__file__).resolve().parent / "networks"


def network(name: str):  # type: ignore[no-untyped-def]
    return network_shapes_only(json.loads((NETS / f"{name}.json").read_text()), name)


def child(args: argparse.Namespace) -> None:
    """Run `patches` dense passes of a plan; print JSON with peak RSS and seconds per patch."""
    from znni.primitives.base import Conv
    from znni.primitives.cpu import CpuBackend
    from znni.primitives.dense import dense_forward, forward_range, fuse_activations

    plan = Plan.from_dict(json.loads(Path(args.plan).read_text()))
    net = network(plan.network)
    rng = np.random.default_rng(0)
    ops = [
        Conv(
            (rng.standard_normal(op.weight.shape, dtype=np.float32) * 0.05),
            np.zeros(op.out_channels, np.float32),
        )
        if isinstance(op, Conv)
        else op
        for op in net.ops
    ]
    backend = CpuBackend(
        spectra_cache_bytes=plan.spectra_cache_bytes,
        workspace_bytes=plan.workspace_cache_bytes,
        persist_choices=False,
    )
    times, layer_s = [], [0.0] * len(ops)
    for _ in range(args.patches or 2):
        x = rng.random((plan.batch, 1, *plan.input_size), dtype=np.float32)
        t0 = time.perf_counter()
        y = dense_forward(ops, x, backend, plan.primitives)
        times.append(time.perf_counter() - t0)
        del x, y
    if not args.no_layers:  # one more pass op by op (activations fused into their conv)
        x = rng.random((plan.batch, 1, *plan.input_size), dtype=np.float32)
        for i, _, act in fuse_activations(ops):
            t0 = time.perf_counter()
            x, _ = forward_range(ops, x, backend, plan.primitives, i, i + (2 if act else 1))
            layer_s[i] = time.perf_counter() - t0
        del x
    hwm = next(
        int(line.split()[1]) * 1024
        for line in open("/proc/self/status")
        if line.startswith("VmHWM")
    )
    print(json.dumps({"peak_rss_bytes": hwm, "seconds": times, "layer_seconds": layer_s}))


def measure(plan: Plan, patches: int, layers: bool = False) -> dict:
    """Seconds of `patches` passes (and, with `layers`, of each op in one more pass)."""
    path = Path("/tmp") / f"znni-plan-{plan.network}-{plan.input_size[0]}.json"
    path.write_text(json.dumps(plan.to_dict()))
    out = subprocess.run(
        [sys.executable, __file__, "child", "--plan", str(path), "--patches", str(patches)]
        + ([] if layers else ["--no-layers"]),
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"child exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plan_at(net, machine: MachineProfile, size: int, limit: int) -> Plan:  # type: ignore[no-untyped-def]
    plans = evaluate(net, machine, "cpu", net.layer_shapes((size,) * 3), host_bytes=limit,
                     gpu_bytes=0)
    if not plans:
        raise ValueError(f"{net.name} at {size}^3 does not fit in {limit} bytes")
    return plans[0]


def memory(machine: MachineProfile, limit: int) -> None:
    print("net  | input | primitives (conv)                  | predicted GiB | RSS GiB | ratio")
    for name, sizes in (("n537", (170, 178, 186)), ("n337", (100, 124, 132))):
        net = network(name)
        for n in sizes:
            plan = plan_at(net, machine, n, limit)
            got = measure(plan, 2)
            convs = ",".join(p[:5] for p in plan.primitives if p)
            print(
                f"{name} | {n:5d} | {convs:34s} | {plan.peak_bytes / 2**30:13.2f} | "
                f"{got['peak_rss_bytes'] / 2**30:7.2f} | "
                f"{got['peak_rss_bytes'] / plan.peak_bytes:.2f}"
            )


def timing(machine: MachineProfile, limit: int,
           nets: tuple[str, ...] = ("n337", "n537", "n726", "n926"), patches: int = 3) -> None:
    print(f"net  | input | predicted s | measured s (min of {patches - 1} after warm-up) | ratio")
    for name in nets:
        try:
            plan = make_plan(network(name), machine=machine, device="cpu",
                             memory_limit_bytes=limit)
        except ValueError as e:  # e.g. n537's smallest patch needs more than the limit
            print(f"{name} | skipped: {e}")
            continue
        got = measure(plan, max(2, patches), layers=True)
        t = min(got["seconds"][1:])
        print(
            f"{name} | {plan.input_size[0]:5d} | {plan.predicted_patch_s:11.2f} | "
            f"{t:10.2f} | {t / plan.predicted_patch_s:.2f}"
        )
        for lp, s in zip(plan.layers, got["layer_seconds"], strict=True):
            if lp.predicted_s or s > 0.01:
                print(f"    op {lp.index:2d} {lp.kind:8s} {lp.primitive or '':14s} "
                      f"predicted {lp.predicted_s:8.3f} s  measured {s:8.3f} s")


def forced(net, machine: MachineProfile, chosen: Plan, prims: tuple, limit: int) -> Plan | None:  # type: ignore[no-untyped-def]
    """The chosen patch with these conv primitives, costed like the planner costs its own
    plans; None when it does not fit `limit` (an alternative must obey the same limit)."""
    shapes = net.layer_shapes(chosen.input_size, chosen.batch)
    fixed = machine.base_rss_bytes + weights_bytes(shapes)
    budget = limit - fixed - 2 * shapes[-1].out_bytes
    ws = workspace_cache_bytes(budget)
    peak, per_layer = pass_peak_bytes(shapes, list(prims), threads=machine.cores,
                                      fixed_bytes=fixed, workspace_bytes=ws)
    if peak > limit:
        return None
    kept = sum(layer_memory(sh, q).kept_bytes for sh, q in zip(shapes, prims, strict=True))
    seconds = [0.0 if fused(shapes, i) else
               layer_seconds(sh, q, machine, spectra_budget=kept if q == "fft-keep" else None)
               for i, (sh, q) in enumerate(zip(shapes, prims, strict=True))]
    stage = Stage("cpu", tuple(shapes), tuple(prims), tuple(seconds), tuple(per_layer))
    return build(net, machine, "cpu", shapes, split_op=None, stages=[stage],
                 patch_s=stage.seconds, peak=peak, gpu_peak=0,
                 out_voxels=shapes[-1].batch_out * prod(shapes[-1].size_out),
                 host_bytes=limit, gpu_bytes=0)


def alternatives(net, machine: MachineProfile, chosen: Plan, limit: int) -> list[Plan]:  # type: ignore[no-untyped-def]
    """Other patch sizes (the planner's best at each), then the chosen patch with every conv
    forced to one primitive, then with single layers flipped; all within `limit`."""
    n0, p = chosen.input_size[0], max(net.pool_product)
    alts = [plan_at(net, machine, n, limit) for n in (n0 - 3 * p, n0 - 2 * p, n0 - p)
            if n > net.fov[0]]
    candidates = [tuple(q if c else None for c in chosen.primitives)
                  for q in ("direct", "fft-recompute", "fft-keep")]
    for i, q in enumerate(chosen.primitives):
        for other in ("direct", "fft-recompute", "fft-keep"):
            if q and other != q:
                candidates.append(chosen.primitives[:i] + (other,) + chosen.primitives[i + 1:])
    for prims in candidates:
        if len(alts) >= 8:
            break
        plan = forced(net, machine, chosen, prims, limit)
        if plan is not None and prims != chosen.primitives:
            alts.append(plan)
    return alts


def regret(machine: MachineProfile, limit: int, nets: tuple[str, ...] = ("n337", "n726")) -> None:
    for name in nets:
        net = network(name)
        chosen = make_plan(net, machine=machine, device="cpu", memory_limit_bytes=limit)
        alts = alternatives(net, machine, chosen, limit)
        rows = []
        for label, plan in [("chosen", chosen)] + [(f"alt{i}", a) for i, a in enumerate(alts)]:
            got = measure(plan, 2)
            vox = np.prod(plan.output_size) * plan.batch / min(got["seconds"][1:])
            rows.append((label, plan, vox))
            print(
                f"{name} {label:6s} {plan.input_size[0]:4d} "
                f"{','.join(x[:5] for x in plan.primitives if x):40s} "
                f"pred {plan.predicted_voxels_per_second:9.0f} meas {vox:9.0f} vox/s "
                f"peak {got['peak_rss_bytes'] / 2**30:5.2f} GiB",
                flush=True,
            )
        best = max(v for _, _, v in rows)
        print(f"{name}: chosen = {rows[0][2] / best:.2f} of the best measured ({len(alts)} alts, "
              f"all within {limit / 2**30:.2f} GiB)")


def tight(machine: MachineProfile, limit: int) -> None:
    plan = make_plan(network("n337"), machine=machine, device="cpu", memory_limit_bytes=limit)
    got = measure(plan, 2)
    print(
        f"n337 limit {limit / 2**30:.2f} GiB: plan {plan.input_size[0]}^3, predicted "
        f"{plan.peak_bytes / 2**30:.2f} GiB, measured peak RSS "
        f"{got['peak_rss_bytes'] / 2**30:.2f} GiB, under limit: "
        f"{got['peak_rss_bytes'] <= limit}"
    )


def main() -> None:
    if sys.argv[1:2] == ["job"]:  # whole runs predicted against measured: _planner_job.py
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import _planner_job

        _planner_job.main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["graph"]:  # U-Nets (ONNX graphs): benchmarks/graph_planner.py
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import graph_planner

        sys.argv = [graph_planner.__file__, *sys.argv[2:]]
        graph_planner.main()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("memory", "time", "regret", "limit", "child", "graph"))
    ap.add_argument("--limit", default="3GiB")
    ap.add_argument("--plan")
    ap.add_argument("--patches", type=int, help="child: passes (default 2); time: passes per "
                    "plan, the first a warm-up (default 3)")
    ap.add_argument("--no-layers", action="store_true", help="child: skip the op-by-op pass")
    ap.add_argument("--nets", help="time / regret: networks, comma-separated "
                    "(default: all four / n337,n726)")
    args = ap.parse_args()
    if args.what == "child":
        child(args)
        return
    machine = detect_machine()
    limit = parse_bytes(args.limit)
    nets = tuple(args.nets.split(",")) if args.nets else None
    if args.what == "time":  # --patches: passes per plan, the first a warm-up (default 3)
        timing(machine, limit, nets or ("n337", "n537", "n726", "n926"), args.patches or 3)
        return
    if args.what == "regret":
        regret(machine, limit, nets or ("n337", "n726"))
        return
    {"memory": memory, "time": timing, "limit": tight}[args.what](machine, limit)


if __name__ == "__main__":
    main()
