"""`znni segment NETWORK.json INPUT OUTPUT`: batch inference over a Zarr volume."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from znni.engine.job import SegmentJob


def add_parser(sub: argparse._SubParsersAction) -> None:
    from znni.cli.output_options import add_output_options
    from znni.engine.job import (
        BLEND_MODES,
        BORDER_MODES,
        DEVICES,
        OUTPUT_DTYPES,
        OUTPUT_FORMATS,
    )

    p = sub.add_parser("segment", help="run a network densely over a Zarr volume")
    p.add_argument("network", help="network spec JSON, an ONNX model (MODEL.onnx), or a "
                   "bioimage.io model package (.zip, folder or rdf.yaml)")
    p.add_argument("input", help="input Zarr array or OME-Zarr image, e.g. data/em.zarr/raw, "
                   "or an s3://, gs:// or http(s):// URL; precomputed://PATH_OR_URL or n5://... "
                   "through TensorStore")
    p.add_argument("output", help="output Zarr array or OME-Zarr image (created when missing), "
                   "or an s3:// or gs:// URL; precomputed://PATH_OR_URL: a neuroglancer volume")
    p.add_argument("--level", "--mip", type=int, help="OME-Zarr input: the level to run on; "
                   "precomputed:// input: the scale (default 0)")
    p.add_argument("--output-format", choices=OUTPUT_FORMATS,
                   help="zarr or ome-zarr (default: ome-zarr for an OME-Zarr input)")
    p.add_argument("--pyramid", type=int,
                   help="downsampled levels: an OME-Zarr output's (default: coarsest <= 256 "
                   "voxels), or a precomputed:// output's scales 1..N (default: none); an "
                   "existing output keeps its own")
    p.add_argument("--weights", help="weights .npz (default: the spec's 'weights')")
    p.add_argument("--roi", help="region z0:z1,y0:y1,x0:x1 to compute and write")
    p.add_argument("--border", choices=BORDER_MODES, default="reflect")
    p.add_argument("--dtype", choices=OUTPUT_DTYPES, default="float32")
    p.add_argument("--chunks", help="output chunk shape z,y,x")
    p.add_argument("--block", help="block shape z,y,x, rounded up to whole chunks (default: auto)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    add_precision_option(p)  # and --tta
    add_output_options(p)  # --labels, --mask, --skip-empty
    p.add_argument("--memory-limit", help="host memory budget, e.g. 12GiB (default: available)")
    p.add_argument("--scheduler", help="Dask: tcp://HOST:PORT, local:N workers, or a batch "
                   "cluster of at most N workers from your jobqueue.yaml: slurm:N, pbs:N, "
                   "lsf:N, sge:N")
    p.add_argument("--overwrite", action="store_true", help="recompute into an existing output")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="s3:// and gs:// URLs: an fsspec option, e.g. endpoint_url=http://h:9000 "
                   "or anon=true (VALUE parsed as JSON when it parses); repeatable")
    add_model_options(p)
    p.add_argument("--window", help="windowed models: window z,y,x (default: planned)")
    p.add_argument("--overlap", type=float, default=0.25, help="windowed: overlap fraction")
    p.add_argument("--blend", choices=BLEND_MODES, default="gaussian", help="windowed: weights")
    p.add_argument("--on-bad-chunk", choices=("fail", "fill"), default="fail",
                   help="an input chunk that does not decode: stop (fail, default), or compute "
                   "on with the array's fill value and list it (fill)")
    p.add_argument("--wait", action="store_true", help="another live run holds OUTPUT: wait "
                   "for it to end (default: refuse)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=run)


def job_from_args(args: argparse.Namespace) -> SegmentJob:
    """Validate the command-line values and build the job; raises ValueError."""
    from znni.engine.io.ome import level_path
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.job import SegmentJob
    from znni.engine.location import Location
    from znni.engine.scheduler import Scheduler
    from znni.engine.units import parse_bytes, parse_roi, parse_triple

    source = Location.parse(args.input, "input")  # every location parsed once, here
    output = Location.parse(args.output, "output")
    mask = Location.parse(args.mask, "mask") if args.mask else None
    network = model_from_args(args)
    paths = (source, output, *([mask] if mask else []))
    ctx = context_for(paths, parse_storage_options(args.storage_option))
    return SegmentJob(
        network=network,
        input_path=source if args.level is None else level_path(source, args.level, ctx=ctx),
        output_path=output,
        roi=parse_roi(args.roi) if args.roi else None,
        border=args.border,
        dtype=args.dtype,
        chunks=parse_triple(args.chunks, "--chunks") if args.chunks else None,
        device=args.device,
        precision=args.precision,
        max_error=args.max_error,
        tta=tta_value(args.tta),
        memory_limit_bytes=parse_bytes(args.memory_limit) if args.memory_limit else None,
        scheduler=Scheduler.of(args.scheduler),  # parsed once, here
        overwrite=args.overwrite,
        block=parse_triple(args.block, "--block") if args.block else None,
        window=parse_triple(args.window, "--window") if args.window else None,
        overlap=args.overlap,
        blend=args.blend,
        output_format=args.output_format,
        pyramid=args.pyramid,
        store=ctx,
        on_bad_chunk=args.on_bad_chunk,
        wait_for_output=args.wait,
        labels=args.labels,
        mask_path=mask,
        skip_empty=args.skip_empty,
    )


def model_from_args(args: argparse.Namespace) -> Any:
    """The network file with the ONNX options given (a Network or an OnnxModel)."""
    from znni.model.loading import load_model

    return load_model(
        args.network, args.weights, output_name=args.output_name, scale=args.scale,
        shift=args.shift,
    )


def add_precision_option(p: argparse.ArgumentParser) -> None:
    """--precision and --tta (add_tta_option), shared by segment and plan; the value is checked
    where the job is (one sentence, engine.compute.execution.check_precision), not by
    argparse's usage message."""
    from znni.engine.job import MAX_ERROR, PRECISION_CHOICES

    p.add_argument("--precision", default="fp32", metavar="|".join(PRECISION_CHOICES),
                   help="arithmetic precision (default fp32). bf16 on the CPU: ONNX models, "
                   "in OpenVINO compiled networks (a CPU without bf16 units runs fp32 and "
                   "says so); int8 (CPU, ONNX models): NNCF-quantized on the input's own "
                   "windows, its error against fp32 measured first; auto (CPU, ONNX "
                   "models): the fastest predicted of fp32, bf16, int8 within --max-error; "
                   "tf32 and fp16 need --device gpu (tf32 and bf16 on a GPU: compute "
                   "capability 8.0 or more)")
    p.add_argument("--max-error", type=float, default=MAX_ERROR, metavar="E",
                   help="int8 and auto: the largest error against fp32 accepted, as a "
                   "fraction of the fp32 output's range on held-out windows of the input "
                   f"(default {MAX_ERROR}); int8 above it is refused")
    add_tta_option(p)


def add_tta_option(p: argparse.ArgumentParser) -> None:
    """--tta, shared by segment and plan; checked where the job is (one sentence, exit 2)."""
    p.add_argument("--tta", metavar="flips[:AXES]",
                   help="test-time flips: every window's prediction is the mean over its input "
                   "flipped on all subsets of z, y, x (flips: 8 passes) or of AXES (flips:zx: "
                   "4), before blending, as nnU-Net's mirroring")


def tta_value(text: str | None) -> str | None:
    """A --tta value checked and in its recorded form (`flips:zyx` is `flips`)."""
    from znni.engine.compute.tta import canonical

    return canonical(text)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The ONNX model options shared by segment and plan."""
    p.add_argument("--scale", type=float, help="ONNX models: input x * SCALE + SHIFT (default 1)")
    p.add_argument("--shift", type=float, help="ONNX models: see --scale (default 0)")
    p.add_argument("--output-name", help="ONNX models: the output to write (default the first)")


def run(args: argparse.Namespace) -> int:
    job = job_from_args(args)  # refuses a bad spec or weights before anything else loads
    from znni.engine.job import SegmentCancelled
    from znni.engine.segment import segment

    stop = StopSignals()
    try:
        report = segment(job, quiet=args.quiet, cancel=stop.event)
    except SegmentCancelled as e:
        done, total = getattr(e, "done", ("?", "?"))
        print(f"znni segment: stopped by {stop.name}: {done} of {total} blocks done and kept "
              "(blocks in flight finished); rerun the same command to resume", file=sys.stderr)
        return 128 + stop.signum
    finally:
        stop.restore()
    if report.bad_chunks:
        n = len(report.bad_chunks)
        print(f"znni segment: warning: {n} input chunk{'s' * (n != 1)} of {job.input_path} "
              f"did not decode; computed as the fill value (listed in the output's "
              f"provenance): {', '.join(report.bad_chunks)}", file=sys.stderr)
    if not args.quiet and report.plan is not None:
        print(plan_summary(report.plan), file=sys.stderr)
        from znni.engine.precision_run import int8_line

        if (measured := int8_line(report.plan)) is not None:  # int8, auto: the error
            print(measured, file=sys.stderr)
        if "device_ran" in report.plan:
            print(device_summary(report.plan["device_ran"]), file=sys.stderr)
        if report.plan.get("compiled_ran"):
            print(compiled_summary(report.plan["compiled_ran"]), file=sys.stderr)
    if not args.quiet:
        print(
            f"wrote {report.output_path}: {report.voxels_written:,} voxels, the blocks in "
            f"{report.elapsed_s:.2f} s, "
            f"{report.blocks_computed}/{report.blocks_total} blocks computed"
            + (f", {report.blocks_skipped} skipped (outside the mask or empty input)"
               if report.blocks_skipped else ""),
            file=sys.stderr,
        )
        from znni.planner.jobtime import predicted_line

        if (line := predicted_line(report.plan, report.voxels_written)) is not None:
            print(line, file=sys.stderr)
    return 0


class StopSignals:
    """SIGTERM and SIGINT set `event`: the run stops after the blocks in flight (computed and
    written, the ledger recorded), and the command exits 128 + the signal. A second signal
    stops at once (SIGINT: KeyboardInterrupt; SIGTERM: the default, exit 143)."""

    def __init__(self) -> None:
        import signal
        import threading

        self.event = threading.Event()
        self.signum, self.name = 0, ""
        self.old = {s: signal.signal(s, self._on) for s in (signal.SIGTERM, signal.SIGINT)}

    def _on(self, signum: int, frame: Any) -> None:
        import signal

        if self.event.is_set():  # the second: no more waiting
            self.restore()
            signal.raise_signal(signum)
            return
        self.signum, self.name = signum, signal.Signals(signum).name
        self.event.set()

    def restore(self) -> None:
        import signal

        for s, handler in self.old.items():
            signal.signal(s, handler)


def device_summary(ran: dict) -> str:
    """One line on what really ran on the device: conv primitives by their real names."""
    convs = ", ".join(f"{name} x{n}" for name, n in sorted(ran["convs"].items())) or "none"
    line = f"device {ran['device']}: convs {convs}; peak {ran['peak_device_bytes'] / 2**30:.2f} GiB"
    if ran["batch_shrinks"]:
        line += f"; out of memory, batch shrank to {ran['batch_shrinks'][-1]}"
    if ran["fallbacks"]:
        line += f"; fallbacks: {'; '.join(ran['fallbacks'])}"
    return line


def compiled_summary(ran: dict) -> str:
    """One line on the compiled network: its compile, the wait for it, and the first call
    against the steady ones (the first pays OpenVINO's fresh buffers)."""
    line = (f"OpenVINO network at {ran['precision']}, batch {ran['batch']}: compiled in "
            f"{ran['compile_s']:.2f} s, the first window waited {ran['compile_wait_s']:.2f} s "
            f"for it")
    if ran["first_s"] is not None:
        line += f"; first call {ran['first_s']:.3f} s"
    if ran["steady_s"]:
        line += (f", then {ran['steady_s']:.3f} s median over {ran['calls'] - 1} "
                 f"({ran['first_s'] / ran['steady_s']:.2f}x)")
    return line


def plan_summary(plan: dict) -> str:
    """One line on the plan a run followed (what `znni plan` would have chosen); its time
    and rate are the whole run's, on the line `predicted_line` prints (a pass's
    steady-state rate is `znni plan`'s, labelled there)."""
    where = (f", on {plan['device']} at {plan['precision']}, batch {plan['batch']}"
             if plan.get("device", "cpu") != "cpu" else "")
    if plan.get("compiled"):
        where += (f", the whole window as one OpenVINO network at {plan['precision']}, "
                  f"batch {plan['batch']}")
    if plan.get("tta"):  # graph runs; a sequential run's rate counts them too
        where += f", test-time {plan['tta']} ({plan['flips']} passes each)"
    if plan.get("mode") == "windowed":
        return (
            f"plan: windowed, window {'x'.join(str(v) for v in plan['window'])}, overlap "
            f"{plan['overlap']}, {plan['blend']} blending, {plan['windows']} "
            f"window{'s' * (plan['windows'] != 1)}{where}"
        )

    def size(triple: list[int] | tuple[int, ...]) -> str:
        return "x".join(str(v) for v in triple)

    if plan.get("mode") == "exact":  # a window-independent graph, tiled on its grid
        return (
            f"plan: exact tiles {size(plan['tile'])} -> {size(plan['tile_output'])} output "
            f"on the {size(plan['size_factor'])} grid, batch {plan['batch']}, "
            f"{plan['peak_bytes'] / 2**30:.2f} GiB{where}"
        )
    return (
        f"plan: {plan['algorithm']}, patch {size(plan['input_size'])} -> "
        f"{size(plan['output_size'])} dense output, batch {plan['batch']}, "
        f"{plan['peak_bytes'] / 2**30:.2f} GiB per pass"
    )
