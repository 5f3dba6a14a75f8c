"""`znni plan NETWORK.json`: what will run where, how fast and in how much memory."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from znni.cli.plan_common import gib as _gib
from znni.cli.plan_common import input_volume
from znni.cli.plan_common import seconds as _seconds

if TYPE_CHECKING:
    from znni.model.network import Network
    from znni.planner.machine import MachineProfile
    from znni.planner.plan import Plan


def add_parser(sub: argparse._SubParsersAction) -> None:
    from znni.engine.job import DEVICES

    p = sub.add_parser("plan", help="plan a run: patch or window, primitives, devices, time")
    p.add_argument("network", nargs="?", help="network spec JSON (its weights are not "
                   "needed to plan), or an ONNX model (MODEL.onnx)")
    p.add_argument("--weights", help="weights .npz (default: the spec's 'weights', if present)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    from znni.cli.output_options import add_output_options
    from znni.cli.segment import add_model_options, add_precision_option

    add_precision_option(p)  # and --tta
    add_output_options(p)  # --labels, --mask, --skip-empty: with --input, as segment takes them
    p.add_argument("--memory-limit", help="host memory budget, e.g. 12GiB (default: available)")
    p.add_argument(
        "--machine",
        help="machine profile JSON or a shipped name (ci-2core, h100-host, znni-paper); "
        "default: this machine, calibrated",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--input", help="plan for this volume (as `znni segment` takes it: a Zarr "
                   "array, an OME-Zarr image or a URL); default: no bound (graph models: "
                   "a 512^3 volume)")
    p.add_argument("--roi", help="with --input: the region z0:z1,y0:y1,x0:x1 to plan for")
    p.add_argument("--level", "--mip", type=int,
                   help="with an OME-Zarr or precomputed:// --input: its level (default 0)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="with an s3:// or gs:// --input: an fsspec option; repeatable")
    p.add_argument("--chunks", help="with --input: the output's chunks z,y,x, as `znni "
                   "segment --chunks` (default: 64 per axis, clipped); blocks write whole ones")
    p.add_argument("--block", help="with --input: the block shape z,y,x, as `znni segment "
                   "--block` (rounded up to whole chunks; default: planned)")
    p.add_argument("--dtype", choices=("float32", "uint8"), default="float32",
                   help="with --input: the output dtype (its writes are timed)")
    p.add_argument("--overlap", type=float, default=0.25,
                   help="windowed graph models: overlap fraction, as `znni segment` takes it")
    p.add_argument("--window", help="graph models: plan this window (or exact tile) z,y,x "
                   "instead of choosing one")
    p.add_argument("--agglomerate", nargs="?", const="0.5", metavar="T[,T2]",
                   help="also predict `znni agglomerate` of the network's output (3 channels: "
                   "affinities, or 1: a boundary map) over the same region at these "
                   "thresholds (default 0.5), assuming synthetic cells' fragment density")
    add_model_options(p)
    from znni.cli.plan_cluster import add_cluster_options

    add_cluster_options(p)  # --workers, --scheduler, --store-bandwidth, --deadline, ...
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
    from znni.cli.output_options import form_fields, form_line
    from znni.cli.plan_cluster import cluster_ask, measure_store_run
    from znni.engine.compute.tta import flip_count
    from znni.engine.units import parse_bytes
    from znni.model.onnx_model import OnnxModel

    if args.measure_store:
        return measure_store_run(args)
    if args.network is None:
        raise ValueError("znni plan needs a NETWORK (or --measure-store URL)")
    ask = cluster_ask(args)  # checked before any planning
    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    from znni.model.bioimage_package import is_package

    if Path(args.network).suffix.lower() == ".onnx" or (
            Path(args.network).suffix.lower() != ".json" and is_package(args.network)):
        from znni.cli.segment import model_from_args  # ONNX, or a bioimage.io package

        network = model_from_args(args)
    else:
        network = network_for_planning(args.network, args.weights)
    check_plan_precision(args, isinstance(network, OnnxModel))
    flips = flip_count(args.tta)  # test-time flips: passes per window or patch
    if args.agglomerate is not None:
        from znni.cli.plan_agglomerate import check_channels

        check_channels(network.out_channels, args.network)
    region = region_from_args(args, network.in_channels)
    if isinstance(network, OnnxModel):
        return _graph_run(args, network, limit, region, flips, ask)
    if args.window:
        raise ValueError(f"--window applies to ONNX graph models; {args.network} is a "
                         "sequential network, whose patch the planner chooses")
    # without a volume (or a cluster) only steady rates are shown: a first plan may fit them
    # from part of the calibration; a run's prediction needs all of it
    plan, machine = sequential_plan(network, args.device, limit, args.machine, region, flips,
                                    first_plan=region is None and ask is None)
    if region is not None:
        plan = replace(job_plan(args, network, limit, machine, flips),
                       alternatives=plan.alternatives)
    line, fields = _agglomeration(args, region)
    cluster = None
    if ask is not None:
        from znni.cli.plan_cluster import sequential_cluster

        cluster = sequential_cluster(args, ask, network, plan, machine)
    if args.json:
        from znni.engine.compute.layout import region_seconds
        from znni.planner.search import region_voxels_per_second

        extra = {} if region is None or plan.job_seconds is None else {
            "region": list(region),
            "predicted_seconds": region_seconds(region,
                                                region_voxels_per_second(plan, region)),
            "predicted_job_seconds": plan.job_seconds["total_s"],
            "job_peak_bytes": plan.job_seconds["peak_bytes"],
            **form_fields(args, network.out_channels, plan.job_seconds)}
        if fields:
            extra["agglomerate"] = fields
        if cluster is not None:
            extra["cluster"] = cluster
        if machine.partial_calibration:
            extra["partial_calibration"] = PARTIAL_NOTE
        print(json.dumps({"mode": "exact", **plan.to_dict(), **extra}, indent=2))
    else:
        print(EXACT_MODE + "\n" + format_plan(plan, network, machine, region))
        if plan.job_seconds is not None:
            print(job_lines(plan))
            if form := form_line(form_fields(args, network.out_channels, plan.job_seconds)):
                print(form)
        if line:
            print(line)
        if cluster is not None:
            from znni.cli.plan_cluster import cluster_lines

            print(cluster_lines(cluster))
        if machine.partial_calibration:
            print(PARTIAL_NOTE)
    return 0


def _graph_run(args: argparse.Namespace, network: Any, limit: int | None,
               region: tuple[int, int, int] | None, flips: int, ask: Any = None) -> int:
    """An ONNX graph model's plan (plan_graph.py), with --agglomerate's line."""
    from znni.cli.plan_graph import format_graph_plan, graph_job_summary, graph_summary

    summary = graph_summary(args, network, limit, region, flips)
    if region is not None:  # the whole run's time, as `znni segment` will cut it
        if args.block:  # segment's --block: its blocks as given
            from znni.engine.units import parse_triple

            summary = {**summary, "block_shape": list(parse_triple(args.block, "--block"))}
        summary = graph_job_summary(args, network, summary)
    line, fields = _agglomeration(args, region)
    if fields:
        summary = {**summary, "agglomerate": fields}
    if ask is not None:
        from znni.cli.plan_cluster import graph_cluster

        summary = {**summary, "cluster": graph_cluster(args, ask, summary)}
    print(json.dumps(summary, indent=2) if args.json else format_graph_plan(summary))
    if line and not args.json:
        print(line)
    if "cluster" in summary and not args.json:
        from znni.cli.plan_cluster import cluster_lines

        print(cluster_lines(summary["cluster"]))
    return 0


def _agglomeration(args: argparse.Namespace, region: tuple[int, int, int] | None
                   ) -> tuple[str, dict]:
    """--agglomerate: its line and JSON object; empty without it."""
    if args.agglomerate is None:
        return "", {}
    from znni.cli.plan_agglomerate import predict_plan

    return predict_plan(args, region)


def job_plan(args: argparse.Namespace, network: Network, limit: int | None,
             machine: MachineProfile, flips: int = 1) -> Plan:
    """The plan `znni segment` would make over --input (--roi, --chunks): patch, batch and
    blocks chosen together, and the whole run's predicted time (engine.compute.layout)."""
    from znni.cli.output_options import plan_form
    from znni.engine.compute.layout import memory_budget_bytes, plan_with_layout
    from znni.engine.geometry import Box
    from znni.engine.io.volume import output_chunks
    from znni.engine.units import parse_roi, parse_triple, resolve_roi

    volume = input_volume(args, network.in_channels)
    (z0, z1), (y0, y1), (x0, x1) = resolve_roi(parse_roi(args.roi) if args.roi else None,
                                               volume.shape)
    region = Box((z0, y0, x0), (z1, y1, x1))
    asked = parse_triple(args.chunks, "--chunks") if args.chunks else None
    form = plan_form(args, network.out_channels, volume.shape)  # --labels, --mask
    chunks = output_chunks(asked, None, volume.shape, form.channels, form.dtype, "the output")
    budget = memory_budget_bytes(limit, machine.memory_bytes if args.machine else None)
    step = parse_triple(args.block, "--block") if args.block else None  # as segment cuts it
    plan_for = None  # this machine: as segment plans (execution.plan_job)
    if args.machine:
        from znni.planner.search import make_plan

        def plan_for(pass_bytes: int) -> Plan:
            return make_plan(network, machine=machine, device=args.device,
                             memory_limit_bytes=pass_bytes, max_output=region.shape)

    return plan_with_layout(network, args.device, chunks, region, budget,
                            volume.dtype.itemsize, form.dtype, step, step is None,
                            plan_for=plan_for,
                            skip=form.outside, out_channels=form.channels,
                            known_machine=args.machine is None, flips=flips)


def job_lines(plan: Plan) -> str:
    """The whole run's predicted time by stage and its blocks."""
    j = plan.job_seconds or {}
    edges = plan.block_edges or ()
    return "\n".join([
        "",
        f"blocks: {j['blocks']} ({_size(plan.block_shape)} nominal; cut at "
        + "; ".join(",".join(map(str, e)) for e in edges) + "), "
        f"{j['patches']} patches computing {j['computed_voxels'] / max(j['ideal_voxels'], 1):.2f}x"
        " the ideal tiling's output voxels",
        f"whole run: about {_seconds(j['total_s'])} s, peak {_gib(int(j['peak_bytes']))}",
        f"  start-up                    {j['startup_s']:>10.1f} s",
        f"  planning (this search)      {j.get('planning_s', 0.0):>10.1f} s  (measured here)",
        f"  FFTW planning (new shapes)  {j['fftw_planning_s']:>10.1f} s"
        f"  ({j['cold_shapes']} FFT workspaces not in FFTW's wisdom here)",
        f"  first pass's pages          {j['first_pass_s']:>10.1f} s",
        f"  every block's patches       {j['patches_s']:>10.1f} s",
        f"  reads/decodes/encodes/writes{j['io_s']:>10.1f} s  (not hidden behind compute; "
        f"{j['io_total_s']:.1f} s in all)",
    ])


def check_plan_precision(args: argparse.Namespace, graph: bool) -> None:
    """--precision as `znni segment` checks it (execution.check_precision; with --machine,
    the profile's GPU is planned, so this machine's is not asked); sequential networks are
    planned in fp32 only."""
    from znni.engine.compute.execution import CPU_ONLY_PRECISIONS
    from znni.primitives.precision import check_precision

    if args.precision not in CPU_ONLY_PRECISIONS:  # auto: no stored precision of its own
        check_precision(args.precision)
    if args.precision == "fp32":
        return
    if not graph:
        raise ValueError(f"--precision {args.precision} applies to ONNX graph models in this "
                         "version; sequential networks are planned in fp32")
    if args.device != "gpu" or args.machine is None or args.precision in CPU_ONLY_PRECISIONS:
        from znni.engine.compute.execution import check_precision as check_for_device

        check_for_device(args.device, args.precision)


def region_from_args(args: argparse.Namespace, in_channels: int) -> tuple[int, int, int] | None:
    """The (z, y, x) shape of --input (its --roi), read from its metadata alone; None
    without --input. ValueError for a volume `znni segment` would refuse."""
    if args.input is None:
        given = [f for f, v in (("--roi", args.roi), ("--level", args.level),
                                ("--storage-option", args.storage_option),
                                ("--chunks", getattr(args, "chunks", None)),
                                ("--block", getattr(args, "block", None))) if v]
        if given:
            raise ValueError(f"{given[0]} needs --input, the volume to plan for")
        return None
    from znni.engine.units import parse_roi, roi_shape

    return roi_shape(parse_roi(args.roi) if args.roi else None,
                     input_volume(args, in_channels).shape)


def sequential_plan(
    network: Network, device: str, limit: int | None, machine_name: str | None,
    region: tuple[int, int, int] | None, flips: int = 1, first_plan: bool = False,
) -> tuple[Plan, MachineProfile]:
    """The plan `znni segment` makes: within its pass budget (engine.layout), on this
    machine or the --machine profile; `flips` passes a patch (compute/tta.flipped_plan);
    first_plan: an uncalibrated machine measures only a first plan's part (detect)."""
    from znni.engine.compute.layout import pass_budget_bytes
    from znni.engine.compute.tta import flipped_plan
    from znni.planner.detect import detect_machine
    from znni.planner.machine import MachineProfile
    from znni.planner.plan import as_device
    from znni.planner.search import make_plan

    machine = (MachineProfile.load(machine_name) if machine_name
               else detect_machine(first_plan=first_plan))
    budget = pass_budget_bytes(limit, machine.memory_bytes if machine_name else None)
    plan = make_plan(network, machine=machine, device=as_device(device),
                     memory_limit_bytes=budget,
                     max_output=region)
    return flipped_plan(plan, flips, network), machine


PARTIAL_NOTE = (
    "first plan on this machine: its rates come from part of the calibration (the shapes "
    "that fit the caches and two beyond them, ~25 s of ~100 s on 2 cores); on the benchmark "
    "networks they predicted 0.84-1.12x the whole calibration's steady rate. The rest "
    "(~75 s) is measured once, by the first `znni plan --input`; until then `znni segment` "
    "and the server plan with these rates.")

EXACT_MODE = (
    "mode: exact (a sequential network of valid convolutions and pools: computed densely "
    "with max-pooling fragments, independent of blocks and patches)"
)


def _steady_note(plan: Plan) -> str:
    """For which volume the steady rate holds (printed without --input)."""
    out = plan.output_size
    big = _size((8 * out[0], 8 * out[1], 8 * out[2]))
    return (f"steady vox/s: one pass's rate, which holds for a volume of many whole "
            f"{_size(out)} patches (about {big} or larger); start-up, planning, FFTW's first "
            "plans and the reads and writes are not in it. `--input VOLUME` predicts that "
            "volume's whole run.")


def _size(t: tuple[int, int, int] | None) -> str:
    return "-" if t is None else "x".join(str(v) for v in t)


def format_plan(
    plan: Plan, network: Network, machine: MachineProfile,
    region: tuple[int, int, int] | None = None,
) -> str:
    """The per-algorithm table (chosen one marked) and the chosen plan's layers."""
    gpu = machine.gpu
    lines = [
        f"network {network.name} (field of view {_size(network.fov)}) on machine "
        f"{machine.name}: {machine.cores} cores, {_gib(machine.memory_bytes)} host RAM, "
        + (f"GPU {gpu.name} {_gib(gpu.memory_bytes)}" if gpu else "no GPU"),
        f"host memory for the patch pass {_gib(plan.memory_limit_bytes)} (the rest of the "
        "run's budget holds blocks)",
        "",
        f"  {'algorithm':<9} {'input':>13} {'output':>13} {'S':>2} {'split':>5} "
        f"{'steady vox/s':>12} {'host peak':>11} {'GPU peak':>11}",
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
        f"{_size(plan.output_size)}, {plan.predicted_patch_s:.3f} s per patch"
        + ("" if region is None else f"; the volume {_size(region)}: its whole run below"),
        "" if region is not None else _steady_note(plan),
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

