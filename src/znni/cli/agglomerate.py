"""`znni agglomerate AFFS OUTPUT`: affinities (or a boundary map) to a segmentation, block by
block, seam-free (engine/agglomerate)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from znni.engine.agglomerate.job import AgglomerateJob, AgglomerateReport


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agglomerate", help="affinities to a segmentation (watershed and "
                       "mean-affinity agglomeration, seam-free)")
    p.add_argument("affinities", help="what `znni segment` writes: (3, z, y, x) affinities, "
                   "channel c linking voxel v to v - e_c (1 = same object), float or uint8; or "
                   "a one-channel boundary map (1 = boundary); any format znni reads")
    p.add_argument("output", help="uint64 labels (0 = background), written where `znni "
                   "segment` writes; with several thresholds it must hold {threshold}")
    p.add_argument("--threshold", default="0.5", metavar="T[,T2,...]",
                   help="merge regions while 1 - their boundary's mean affinity is below T "
                   "(waterz's convention; larger T merges more); several: one output each "
                   "(default 0.5)")
    p.add_argument("--block", help="block shape z,y,x (default 128,128,128); the result "
                   "does not depend on it")
    p.add_argument("--roi", help="region z0:z1,y0:y1,x0:x1 to segment (its faces end objects)")
    p.add_argument("--mask", help="a volume of the same shape: voxels where it is 0 are "
                   "background")
    p.add_argument("--output-format", choices=("zarr", "ome-zarr"),
                   help="zarr or ome-zarr (an NGFF label image; default: ome-zarr for an "
                   "OME-Zarr input)")
    p.add_argument("--work-dir", help="the fragments, the region graph (SQLite) and the "
                   "ledgers (default: OUTPUT.agglomerate beside a local output)")
    p.add_argument("--scheduler", help="Dask: tcp://HOST:PORT or local:N workers")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="s3:// and gs:// URLs: an fsspec option; repeatable")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh over an output or work folder of another job")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--plan", action="store_true", help="print the predicted time and memory "
                   "of each stage (from the affinities' central block) and write nothing")
    p.set_defaults(run=run)


def job_from_args(args: argparse.Namespace) -> AgglomerateJob:
    """Validate the command-line values and build the job; raises ValueError."""
    from znni.engine.agglomerate.job import AgglomerateJob, outputs_for, parse_thresholds
    from znni.engine.agglomerate.prepare import default_work
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.location import Location
    from znni.engine.scheduler import Scheduler
    from znni.engine.units import parse_roi, parse_triple

    thresholds, texts = parse_thresholds(args.threshold)  # engine/agglomerate/job.py
    affinities = Location.parse(args.affinities, "affinities")
    outputs = outputs_for(args.output, thresholds, texts)
    mask = Location.parse(args.mask, "mask") if args.mask else None
    work = (Location.parse(args.work_dir, "work folder") if args.work_dir
            else default_work(args.output))
    paths = (affinities, *outputs, *([mask] if mask else []))
    ctx = context_for(paths, parse_storage_options(args.storage_option))
    return AgglomerateJob(
        affinities=affinities, outputs=outputs, thresholds=thresholds,
        roi=parse_roi(args.roi) if args.roi else None,
        block=parse_triple(args.block, "--block") if args.block else None,
        mask=mask, scheduler=Scheduler.of(args.scheduler), overwrite=args.overwrite,
        output_format=args.output_format, work=work, store=ctx, quiet=args.quiet)


def run(args: argparse.Namespace) -> int:
    job = job_from_args(args)
    if args.plan:
        from znni.cli.plan_agglomerate import predict_job

        print(predict_job(job).line())
        return 0
    from dataclasses import replace

    from znni.cli.segment import StopSignals
    from znni.engine.agglomerate.run import agglomerate
    from znni.engine.job import SegmentCancelled

    stop = StopSignals()
    try:
        report = agglomerate(replace(job, cancel=stop.event))
    except SegmentCancelled as e:
        done, total = getattr(e, "done", ("?", "?"))
        print(f"znni agglomerate: stopped by {stop.name}: {done} of {total} blocks of the "
              "stage done and kept; rerun the same command to resume", file=sys.stderr)
        return 128 + stop.signum
    finally:
        stop.restore()
    if not args.quiet:
        print(summary(report), file=sys.stderr)
    return 0


def summary(report: AgglomerateReport) -> str:
    """What was written, the graph, and each stage's seconds."""
    lines = [f"agglomerated {report.voxels:,} voxels in {report.elapsed_s:.2f} s "
             f"({report.voxels_per_s:,.0f} voxels/s): {report.fragments:,} fragments, "
             f"{report.basins:,} basins, {report.edges:,} edges between them"]
    for loc, t, n in zip(report.outputs, report.thresholds, report.segments, strict=True):
        lines.append(f"wrote {loc}: threshold {t:g}, {n:,} segments")
    stages = ", ".join(f"{s.name} {s.elapsed_s:.2f} s ({s.blocks_computed}/{s.blocks_total} "
                       "blocks)" if s.name != "agglomerate" else f"{s.name} {s.elapsed_s:.2f} s"
                       for s in report.stages)
    lines.append(f"stages: {stages}")
    return "\n".join(lines)
