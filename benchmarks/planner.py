"""Planner accuracy: predicted vs measured peak RSS, patch time, and regret.

    .venv/bin/python benchmarks/planner.py memory            # n337, n537 at 3 sizes each
    .venv/bin/python benchmarks/planner.py time [--limit 3GiB]   # chosen plans, 4 networks
    .venv/bin/python benchmarks/planner.py regret [--limit 3GiB] # chosen vs >= 8 alternatives
    .venv/bin/python benchmarks/planner.py limit [--limit 2GiB]  # a run under a tight limit

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
from dataclasses import replace
from pathlib import Path

import numpy as np

from znni.engine.units import parse_bytes
from znni.planner.machine import MachineProfile
from znni.planner.network import network_shapes_only
from znni.planner.plan import Plan, make_plan
from znni.planner.search import evaluate

NETS = Path(__file__).resolve().parent / "networks"


def network(name: str):  # type: ignore[no-untyped-def]
    return network_shapes_only(json.loads((NETS / f"{name}.json").read_text()), name)


def child(args: argparse.Namespace) -> None:
    """Run `patches` dense passes of a plan; print JSON with peak RSS and seconds per patch."""
    from znni.primitives.base import Conv
    from znni.primitives.cpu import CpuBackend
    from znni.primitives.dense import dense_forward

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
    times = []
    for _ in range(args.patches):
        x = rng.random((plan.batch, 1, *plan.input_size), dtype=np.float32)
        t0 = time.perf_counter()
        y = dense_forward(ops, x, backend, plan.primitives)
        times.append(time.perf_counter() - t0)
        del x, y
    hwm = next(
        int(line.split()[1]) * 1024
        for line in open("/proc/self/status")
        if line.startswith("VmHWM")
    )
    print(json.dumps({"peak_rss_bytes": hwm, "seconds": times}))


def measure(plan: Plan, patches: int) -> dict:
    path = Path("/tmp") / f"znni-plan-{plan.network}-{plan.input_size[0]}.json"
    path.write_text(json.dumps(plan.to_dict()))
    out = subprocess.run(
        [sys.executable, __file__, "child", "--plan", str(path), "--patches", str(patches)],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"child exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plan_at(net, machine: MachineProfile, size: int, limit: int) -> Plan:  # type: ignore[no-untyped-def]
    plans = evaluate(net, machine, "cpu", net.layer_shapes((size,) * 3), limit, 0)
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


def timing(machine: MachineProfile, limit: int) -> None:
    print("net  | input | predicted s | measured s (min of 2 after warm-up) | ratio")
    for name in ("n337", "n537", "n726", "n926"):
        try:
            plan = make_plan(network(name), machine=machine, device="cpu",
                             memory_limit_bytes=limit)
        except ValueError as e:  # e.g. n537's smallest patch needs more than the limit
            print(f"{name} | skipped: {e}")
            continue
        got = measure(plan, 3)
        t = min(got["seconds"][1:])
        print(
            f"{name} | {plan.input_size[0]:5d} | {plan.predicted_patch_s:11.2f} | "
            f"{t:10.2f} | {t / plan.predicted_patch_s:.2f}"
        )


def regret(machine: MachineProfile, limit: int) -> None:
    for name in ("n337", "n726"):
        net = network(name)
        chosen = make_plan(net, machine=machine, device="cpu", memory_limit_bytes=limit)
        n0 = chosen.input_size[0]
        p = max(net.pool_product)
        alts = [
            plan_at(net, machine, n, limit)
            for n in (n0 - 3 * p, n0 - 2 * p, n0 - p)
            if n > net.fov[0]
        ]
        for forced in ("direct", "fft-recompute", "fft-keep"):
            prims = tuple(forced if q else None for q in chosen.primitives)
            alts.append(
                replace(
                    chosen,
                    primitives=prims,
                    spectra_cache_bytes=4 * 2**30 if forced == "fft-keep" else 0,
                )
            )
        for i, q in enumerate(chosen.primitives):  # flip the heaviest layers one at a time
            if q and len(alts) < 10 and i > 0:
                other = "fft-recompute" if q != "fft-recompute" else "direct"
                alts.append(
                    replace(
                        chosen,
                        primitives=chosen.primitives[:i] + (other,) + chosen.primitives[i + 1 :],
                    )
                )
        rows = []
        for label, plan in [("chosen", chosen)] + [(f"alt{i}", a) for i, a in enumerate(alts)]:
            got = measure(plan, 2)
            vox = np.prod(plan.output_size) * plan.batch / min(got["seconds"][1:])
            rows.append((label, plan, vox))
            print(
                f"{name} {label:6s} {plan.input_size[0]:4d} "
                f"{','.join(x[:5] for x in plan.primitives if x):40s} "
                f"pred {plan.predicted_voxels_per_second:9.0f} meas {vox:9.0f} vox/s",
                flush=True,
            )
        best = max(v for _, _, v in rows)
        print(f"{name}: chosen = {rows[0][2] / best:.2f} of the best measured ({len(alts)} alts)")


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
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("memory", "time", "regret", "limit", "child"))
    ap.add_argument("--limit", default="3GiB")
    ap.add_argument("--plan")
    ap.add_argument("--patches", type=int, default=2)
    args = ap.parse_args()
    if args.what == "child":
        child(args)
        return
    machine = MachineProfile.detect()
    limit = parse_bytes(args.limit)
    {"memory": memory, "time": timing, "regret": regret, "limit": tight}[args.what](machine, limit)


if __name__ == "__main__":
    main()
