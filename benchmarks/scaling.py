"""docs/scaling.md's table: a 1.4 PB EM volume on N nodes, from the cluster model.

    .venv/bin/python benchmarks/scaling.py [--side 112000] [--nodes 100,1000,10000]
        [--profiles this,ci-2core,h100-host] [--nets demo,n537,basicunet] [--deadline-days 7]

A uint8 cube of SIDE^3 voxels (112,000^3 = 1.405e15 bytes) in 64^3 chunks, the output
uint8 (float32 would be 4x the bytes). Per network and machine profile: the plan
`znni segment` would make for one node (planner.search.make_plan within the pass budget of
half the profile's memory, PLAN_FRACTION of it for the pass; graph models: the window
engine.compute.graph_plan chooses), the block layout it cuts (compute.layout's
choose_block_layout, the same arithmetic; segment's search over smaller passes is not run
at this scale), the blocks priced by class (planner/block_costs.py), and the job on N
nodes (planner/cluster.py: one worker a node, the store unbounded, no queue wait). Printed:
node-hours, wall time and the aggregate store bandwidth above which the job stays
compute-bound. `this` is this machine's calibrated profile (detect_machine: cached rates);
`h100-host` is the shipped, uncalibrated H100 profile. Nothing runs: arithmetic only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

NETS = Path(__file__).resolve().parent / "networks"


def load_net(name: str, tmp: Path) -> Any:
    from znni.model.loading import load_model
    from znni.model.network import network_shapes_only

    if name == "demo":
        from znni.cli.demo_data import demo_network

        spec, _ = demo_network()
        return network_shapes_only(spec, "demo-membranes")
    if name == "basicunet":
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from unets import make_model

        path = tmp / "basicunet.onnx"
        torch.manual_seed(0)
        model = make_model("basicunet", (32, 32, 64, 128, 256, 32))  # MONAI's default
        torch.onnx.export(model, (torch.zeros(1, 1, 64, 64, 64),), path, input_names=["x"],
                          dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
        return load_model(path)
    return network_shapes_only(json.loads((NETS / f"{name}.json").read_text()), name)


def profile(name: str) -> Any:
    from znni.planner.detect import detect_machine
    from znni.planner.machine import MachineProfile

    return detect_machine(calibrate=None) if name == "this" else MachineProfile.load(name)


def sequential_costs(net: Any, machine: Any, region: tuple[int, int, int]) -> tuple[Any, ...]:
    """(BlockCosts, JobFixed, what) of a sequential network's job on one node."""
    from znni.engine.compute.layout import (
        choose_block_layout,
        input_cache_bytes,
        memory_budget_bytes,
    )
    from znni.engine.compute.layout import pass_budget_bytes as pass_budget
    from znni.engine.io.volume import output_chunks
    from znni.planner.block_costs import block_costs
    from znni.planner.cluster import JobFixed
    from znni.planner.jobtime import FIRST_PASS_JOB_S_PER_BYTE, STARTUP_S
    from znni.planner.search import make_plan

    budget = memory_budget_bytes(None, machine.memory_bytes)
    plan = make_plan(net, machine=machine, device="auto",
                     memory_limit_bytes=pass_budget(None, machine.memory_bytes),
                     max_output=region)
    chunks = output_chunks(None, None, region, net.out_channels, "uint8", "the output")
    layout = choose_block_layout(net, chunks, plan.output_size, region, budget, 1,
                                 plan.peak_bytes, max(1, plan.batch))
    costs = block_costs(plan, net, layout.edges, in_bytes=1, out_dtype="uint8")
    fixed = JobFixed(STARTUP_S, FIRST_PASS_JOB_S_PER_BYTE * plan.peak_bytes, plan.peak_bytes,
                     input_cache_bytes(budget))
    what = (f"{plan.algorithm}, patch {'x'.join(map(str, plan.output_size))}, block "
            f"{'x'.join(map(str, layout.step))}")
    return costs, fixed, what


def graph_costs(model: Any, machine: Any, region: tuple[int, int, int]) -> tuple[Any, ...]:
    """The same for a graph model: its window over the region, in segment's blocks (as
    engine.compute.graph_plan.with_job_time and jobtime.graph_job_seconds price them,
    without listing 10^8 blocks)."""
    from math import prod

    from znni.engine.compute.graph_plan import (
        default_block_shape,
        graph_plan,
        graph_plan_device,
    )
    from znni.engine.compute.layout import region_seconds
    from znni.engine.geometry import Box
    from znni.engine.io.volume import output_chunks
    from znni.planner.block_costs import uniform_costs
    from znni.planner.cluster import JobFixed
    from znni.planner.jobtime import READ_BYTES_PER_S, STARTUP_S, WRITE_VALUES_PER_S

    device = graph_plan_device("auto", machine)
    s = graph_plan(model, None, region, 0.25, machine, device=device)
    window = tuple(s["window"])
    chunks = output_chunks(None, None, region, model.out_channels, "uint8", "the output")
    block = default_block_shape(model, window, chunks, Box((0, 0, 0), region))
    n = prod(-(-r // b) for r, b in zip(region, block))
    read = prod(b + w for b, w in zip(block, window)) * model.in_channels
    write = prod(block) * model.out_channels
    compute = region_seconds(region, s["predicted_voxels_per_second"]) / n
    costs = uniform_costs(n, compute, read / READ_BYTES_PER_S,
                          write / WRITE_VALUES_PER_S["uint8"], read, write)
    fixed = JobFixed(STARTUP_S, 0.0, int(s.get("window_peak_bytes", 0)))
    what = (f"{device}, window {'x'.join(map(str, window))}, block "
            f"{'x'.join(map(str, block))}")
    return costs, fixed, what


def human(s: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:,.1f} {unit}"
    return f"{s:.0f} s"


def main(argv: list[str]) -> None:
    from znni.model.onnx_model import OnnxModel
    from znni.planner.cluster import Cluster, bandwidth_text, cluster_seconds, smallest_workers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=112_000)
    ap.add_argument("--nodes", default="100,1000,10000")
    ap.add_argument("--profiles", default="this,ci-2core,h100-host")
    ap.add_argument("--nets", default="demo,n537,basicunet")
    ap.add_argument("--deadline-days", type=float, default=7.0)
    a = ap.parse_args(argv)
    region = (a.side,) * 3
    print(f"volume {a.side:,}^3 uint8 = {a.side**3 / 1e15:.3f} PB\n")
    print("| network | profile | one node's plan | output voxels/s a node | blocks | N nodes "
          "| wall time | node-hours | store bandwidth to stay compute-bound | bottleneck |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    week: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.nets.split(","):
            net = load_net(name, Path(tmp))
            for prof in a.profiles.split(","):
                machine = profile(prof)
                pricing = graph_costs if isinstance(net, OnnxModel) else sequential_costs
                costs, fixed, what = pricing(net, machine, region)
                label = f"{machine.name} ({machine.cores} cores" + (
                    f", {machine.gpu.name}" if machine.gpu else "") + ")"
                for n in (int(v) for v in a.nodes.split(",")):
                    c = cluster_seconds(costs, fixed, Cluster(n, "nodes", machine.cores,
                                                              machine.memory_bytes,
                                                              machine=machine.name))
                    rate = a.side**3 / costs.total("seconds")
                    print(f"| {name} | {label} | {what} | {rate:,.0f} | {c['blocks']:,} | {n:,} | "
                          f"{human(c['total_s'])} | {c['node_hours']:,.0f} | "
                          f"{bandwidth_text(c['bandwidth_to_stay_compute_bound'])} | "
                          f"{c['bottleneck']} |", flush=True)
                found = smallest_workers(costs, fixed, Cluster(1, "nodes", machine.cores,
                                                               machine.memory_bytes,
                                                               machine=machine.name),
                                         a.deadline_days * 86400)
                week.append(f"| {name} | {label} | " + (
                    f"{found['deadline_workers']:,} | {human(found['total_s'])} | "
                    f"{found['node_hours']:,.0f} | "
                    f"{bandwidth_text(found['bandwidth_to_stay_compute_bound'])} |"
                    if found["deadline_workers"]
                    else f"none: {found['deadline_sentence']} | | | |"))
    print(f"\nthe fewest nodes that finish within {a.deadline_days:g} days (--deadline):\n")
    print("| network | profile | nodes | wall time | node-hours | store bandwidth to stay "
          "compute-bound |")
    print("|---|---|---|---|---|---|")
    print("\n".join(week))


if __name__ == "__main__":
    main(sys.argv[1:])
