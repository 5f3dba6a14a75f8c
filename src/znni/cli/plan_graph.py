"""`znni plan MODEL.onnx` (or a bioimage.io package): a graph model's plan, its whole run
and its text (the summary engine.compute.graph_plan makes)."""

from __future__ import annotations

import argparse
from typing import Any

from znni.cli.plan_common import gib as _gib
from znni.cli.plan_common import input_volume
from znni.cli.plan_common import seconds as _seconds


def graph_summary(args: argparse.Namespace, model: Any, limit: int | None,
                  region: tuple[int, int, int] | None, flips: int = 1) -> dict[str, Any]:
    """engine.graph_plan's summary for the command line's options."""
    from znni.engine.compute.graph_plan import graph_plan
    from znni.engine.units import parse_triple
    from znni.planner.machine import MachineProfile

    if not 0 <= args.overlap < 1:
        raise ValueError(f"--overlap must be in [0, 1), got {args.overlap}")
    machine = MachineProfile.load(args.machine) if args.machine else None
    window = parse_triple(args.window, "--window") if args.window else None
    from znni.engine.compute.graph_plan import graph_plan_device

    device = graph_plan_device(args.device, machine)
    if args.precision in ("int8", "auto"):  # the CPU's (check_plan_precision refused others)
        device = "cpu"
    if device == "gpu" and machine is None:  # this machine's GPU: its rates measured once
        from znni.planner.detect import calibrate_gpus

        calibrate_gpus()
    elif machine is None:  # this machine's CPU: its graph primitives measured once
        from znni.planner.detect import calibrate_graph_primitives

        calibrate_graph_primitives(args.precision)  # int8, auto: its int8 speed-up too
    if args.precision in ("int8", "auto"):  # each candidate planned, the error measured
        from znni.cli.plan_precision import precision_summary

        return precision_summary(args, model, limit, region, machine, window, flips)
    return graph_plan(model, limit, region, args.overlap, machine, window, device=device,
                      precision=args.precision, flips=flips)


def graph_job_summary(args: argparse.Namespace, model: Any, summary: dict) -> dict:
    """`summary` with the whole run's predicted seconds over --input's region, in the
    blocks `znni segment` cuts for --chunks and writes in --dtype."""
    from znni.cli.output_options import form_fields, plan_form
    from znni.engine.compute.graph_plan import with_job_time
    from znni.engine.io.volume import output_chunks
    from znni.engine.units import parse_triple

    volume = input_volume(args, model.in_channels)
    asked = parse_triple(args.chunks, "--chunks") if args.chunks else None
    form = plan_form(args, model.out_channels, volume.shape)  # --labels, --mask: as segment
    chunks = output_chunks(asked, None, volume.shape, form.channels, form.dtype, "the output")
    fields = form_fields(args, model.out_channels, None)
    if fields:  # a graph run's prediction computes the blocks outside the mask too
        fields["blocks_outside_mask"] = None
    return {**with_job_time(summary, model, chunks, volume.dtype.itemsize, form.dtype,
                            out_channels=form.channels),
            **fields}


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
        extra = (f"overlapping windows (overlap {s['overlap']}) blended as MONAI's "
                 "sliding_window_inference")
    region = size(map(str, s["region"]))
    volume = (f"the volume {region}" if s["region_given"]
              else f"a {region} volume (--input plans for yours)")
    lines = [
        f"network {s['network']}: {s['in_channels']} -> {s['out_channels']} channels",
        f"mode: {what[0]} ({s['reason']})",
        extra,
        f"{what[1]}: {size(map(str, s['min_window']))} plus multiples of "
        f"{size(map(str, s['size_factor']))}"
        + (f", exactly {size(map(str, s['fixed_window']))}" if s["fixed_window"] else ""),
        f"{what[2]} {size(map(str, s['window']))} for {volume}: "
        + ("as given" if s.get("window_given") else "the most predicted voxels/s")
        + f" within {_gib(s['memory_budget_bytes'])}, "
        f"{_gib(s['window_peak_bytes'])} per pass"
        + (f" of {s['batch']} windows" if s.get("batch", 1) > 1 else ""),
        f"predicted {s['predicted_window_s']:.3f} s per {what[1][:-1]}, "
        f"{s['predicted_voxels_per_second']:,.0f} output voxels/s; {s['passes']} "
        f"{what[1] if s['passes'] != 1 else what[1][:-1]}"
        + (f" x {s['flips']} test-time flips" if s.get("flips", 1) > 1 else "") + ", about "
        f"{_seconds(s['predicted_seconds'])} s in all",
    ]
    if s.get("job_seconds"):
        j = s["job_seconds"]
        lines.append(f"whole run: about {_seconds(j['total_s'])} s: start-up "
                     f"{j['startup_s']:.1f} s, {what[1]} {j['windows_s']:.1f} s, reads and "
                     f"writes not hidden {j['io_s']:.1f} s ({j['io_total_s']:.1f} s in all), "
                     f"{j['blocks']} block{'s' * (j['blocks'] != 1)}")
    if s.get("output_channels"):  # --labels, --mask, --skip-empty
        from znni.cli.output_options import form_line

        lines.append(str(form_line(s)))
    if s.get("compiled"):
        lines.append(
            f"compiled: every node in one OpenVINO network ({s['compiled']}) at "
            f"{s['precision']}, {s['predicted_window_s']:.3f} s per {what[1][:-1]} against "
            f"{s['node_by_node_window_s']:.3f} s node by node on our kernels")
    elif s.get("device") == "cpu" and s.get("precision") == "fp32":
        lines.append(f"node by node on our kernels and OpenVINO layers (primitives per conv: "
                     f"{', '.join(sorted(set(s['primitives'].values()))) or 'none'})")
    if s.get("precision_asked"):  # int8, auto: the measured error, or when it will be
        from znni.cli.plan_precision import precision_lines

        lines += precision_lines(s)
    return "\n".join(lines + (gpu_lines(s) if s.get("device") == "gpu" else []))


def gpu_lines(s: dict) -> list[str]:
    """A GPU graph plan's device, precision and memory, and each conv node's primitive with
    every candidate's predicted time (why it was chosen)."""
    lines = [
        f"device gpu at {s['precision']}: {_gib(s['device_peak_bytes'])} device peak of the "
        f"{_gib(s['device_cap_bytes'])} cap; a batch computes in {s['compute_s'] * 1e3:.2f} ms"
        f", its copies take {s['transfer_s'] * 1e3:.2f} ms (overlapped)",
        "",
        f"  {'conv node':<40} {'primitive':<10} {'ms':>8}  candidates (ms)",
    ]
    for n in s["conv_nodes"]:
        others = ", ".join(f"{name} {sec * 1e3:.3f}" for name, sec in n["candidates"].items())
        lines.append(f"  {n['name'][-40:]:<40} {n['primitive']:<10} "
                     f"{n['predicted_s'] * 1e3:>8.3f}  {others}")
    return lines
