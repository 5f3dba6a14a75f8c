"""`znni plan NETWORK.json`: what will run where, how fast and in how much memory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from znni.model.network import Network
    from znni.planner.machine import MachineProfile
    from znni.planner.plan import Plan


def add_parser(sub: argparse._SubParsersAction) -> None:
    from znni.engine.job import DEVICES

    p = sub.add_parser("plan", help="plan patch size, primitives and devices for a network")
    p.add_argument("network", help="network spec JSON (weights are not needed to plan)")
    p.add_argument("--weights", help="weights .npz (default: the spec's 'weights', if present)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--memory-limit", help="host memory budget, e.g. 12GiB (default: available)")
    p.add_argument(
        "--machine",
        help="machine profile JSON or a shipped name (ci-2core, h100-host, znni-paper); "
        "default: this machine, calibrated",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    from znni.cli.segment import add_model_options

    add_model_options(p)
    p.set_defaults(run=run)


def network_for_planning(spec_path: str, weights: str | None) -> Network:
    """The network with weights when they exist; shapes only otherwise (planning needs no
    weights)."""
    from znni.model.network import load_network, network_shapes_only
    from znni.model.spec import read_spec_file

    path = Path(spec_path)
    raw = read_spec_file(path)
    has_weights = weights is not None or (
        isinstance(raw, dict)
        and isinstance(raw.get("weights"), str)
        and (path.parent / raw["weights"]).is_file()
    )
    return load_network(path, weights) if has_weights else network_shapes_only(raw, str(path))


def run(args: argparse.Namespace) -> int:
    from znni.engine.units import parse_bytes
    from znni.model.onnx_model import OnnxModel
    from znni.planner.detect import detect_machine
    from znni.planner.machine import MachineProfile
    from znni.planner.search import make_plan

    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    if Path(args.network).suffix.lower() == ".onnx":
        from znni.cli.segment import model_from_args

        network = model_from_args(args)
    else:
        network = network_for_planning(args.network, args.weights)
    if isinstance(network, OnnxModel):
        from znni.engine.graph_plan import graph_plan

        summary = graph_plan(network, limit)
        print(json.dumps(summary, indent=2) if args.json else format_graph_plan(summary))
        return 0
    machine = MachineProfile.load(args.machine) if args.machine else detect_machine()
    plan = make_plan(network, machine=machine, device=args.device, memory_limit_bytes=limit)
    if args.json:
        print(json.dumps({"mode": "exact", **plan.to_dict()}, indent=2))
    else:
        print(EXACT_MODE + "\n" + format_plan(plan, network, machine))
    return 0


EXACT_MODE = (
    "mode: exact (a sequential network of valid convolutions and pools: computed densely "
    "with max-pooling fragments, independent of blocks and patches)"
)


def format_graph_plan(s: dict) -> str:
    """The `znni plan` text for an ONNX graph model."""
    size = "x".join
    if s["mode"] == "exact":
        what = "exact", "tiles", "planned tile"
        extra = (
            f"input context {size(map(str, s['context']))}; a tile of "
            f"{size(map(str, s['window']))} gives {size(map(str, s['tile_output']))} outputs"
        )
    else:
        what = "windowed", "windows", "planned window"
        extra = "overlapping windows blended as MONAI's sliding_window_inference"
    return "\n".join(
        [
            f"network {s['network']}: {s['in_channels']} -> {s['out_channels']} channels",
            f"mode: {what[0]} ({s['reason']})",
            extra,
            f"{what[1]}: {size(map(str, s['min_window']))} plus multiples of "
            f"{size(map(str, s['size_factor']))}"
            + (f", exactly {size(map(str, s['fixed_window']))}" if s["fixed_window"] else ""),
            f"{what[2]} {size(map(str, s['window']))} (largest within "
            f"{_gib(s['memory_budget_bytes'])}): {_gib(s['window_peak_bytes'])} per pass"
            + (f" of {s['batch']} windows" if s.get("batch", 1) > 1 else ""),
        ]
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n else "-"


def _size(t: tuple[int, int, int] | None) -> str:
    return "-" if t is None else "x".join(str(v) for v in t)


def format_plan(plan: Plan, network: Network, machine: MachineProfile) -> str:
    """The per-algorithm table (chosen one marked) and the chosen plan's layers."""
    gpu = machine.gpu
    lines = [
        f"network {network.name} (field of view {_size(network.fov)}) on machine "
        f"{machine.name}: {machine.cores} cores, {_gib(machine.memory_bytes)} host RAM, "
        + (f"GPU {gpu.name} {_gib(gpu.memory_bytes)}" if gpu else "no GPU"),
        f"host memory limit {_gib(plan.memory_limit_bytes)}",
        "",
        f"  {'algorithm':<9} {'input':>13} {'output':>13} {'S':>2} {'split':>5} "
        f"{'voxels/s':>12} {'host peak':>11} {'GPU peak':>11}",
    ]
    for alt in plan.alternatives:
        mark = "*" if alt.algorithm == plan.algorithm else " "
        if not alt.feasible:
            lines.append(f"{mark} {alt.algorithm:<9} not possible: {alt.reason}")
            continue
        split = "-" if alt.split_op is None else str(alt.split_op)
        lines.append(
            f"{mark} {alt.algorithm:<9} {_size(alt.input_size):>13} {_size(alt.output_size):>13} "
            f"{alt.batch:>2} {split:>5} {alt.predicted_voxels_per_second:>12,.0f} "
            f"{_gib(alt.peak_bytes):>11} {_gib(alt.gpu_peak_bytes):>11}"
        )
    lines += [
        "",
        f"chosen: {plan.algorithm}, patch {_size(plan.input_size)} -> "
        f"{_size(plan.output_size)}, {plan.predicted_patch_s:.3f} s per patch",
        "",
    ]
    lines.append(
        f"  {'op':>3} {'kind':<10} {'device':<6} {'primitive':<14} {'seconds':>9} {'peak':>11}"
    )
    for layer in plan.layers:
        lines.append(
            f"  {layer.index:>3} {layer.kind:<10} {layer.device:<6} {layer.primitive or '-':<14} "
            f"{layer.predicted_s:>9.4f} {_gib(layer.predicted_bytes):>11}"
        )
    return "\n".join(lines)
