"""`znni evaluate SEGMENTATION GROUND_TRUTH`: VOI and adapted Rand error of a segmentation
against ground truth, counted block by block (docs/evaluate.md)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from znni.engine.evaluate import EvaluationReport


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score a segmentation against ground truth (VOI, "
                       "adapted Rand error)")
    p.add_argument("segmentation", help="the segmentation: a Zarr array or OME-Zarr image of "
                   "integer labels, (z, y, x) or (1, z, y, x), or a URL as for segment's input")
    p.add_argument("ground_truth", help="the ground truth, as SEGMENTATION and of its shape; "
                   "its label 0 is background, ignored")
    p.add_argument("--roi", help="region z0:z1,y0:y1,x0:x1 to score (as segment's --roi)")
    p.add_argument("--border", default="0", metavar="N",
                   help="also ignore ground-truth voxels within N voxels of another "
                   "ground-truth label in their xy section, as CREMI's border mask with "
                   "max_dist N-1 (default 0: none; 1: one voxel each side of every border)")
    p.add_argument("--block", help="blocks read at a time, z,y,x (default 128,128,128)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="s3:// and gs:// URLs: an fsspec option (as segment's); repeatable")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from znni.engine.evaluate import evaluate
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.location import Location
    from znni.engine.units import parse_roi, parse_triple

    seg = Location.parse(args.segmentation, "segmentation")
    gt = Location.parse(args.ground_truth, "ground truth")
    roi = parse_roi(args.roi) if args.roi else None
    block = parse_triple(args.block, "--block") if args.block else None
    border = parse_border(args.border)
    ctx = context_for((seg, gt), parse_storage_options(args.storage_option))
    report = evaluate(seg, gt, roi=roi, border=border, block=block, ctx=ctx)
    print(json.dumps(report.to_dict(), indent=2) if args.json else summary(report))
    return 0


def parse_border(text: str) -> int:
    """--border's value: a whole number of voxels, 0 or more; ValueError otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"--border {text!r} must be a whole number of voxels, 0 or more")
    return value


def summary(report: EvaluationReport) -> str:
    """The short human table of a report."""
    roi = ",".join(f"{lo}:{hi}" for lo, hi in report.roi)
    band = f", border band {report.border}" if report.border else ""
    rows = [
        ("VOI split", report.voi_split, "bits, H(seg | gt): false splits"),
        ("VOI merge", report.voi_merge, "bits, H(gt | seg): false merges"),
        ("VOI", report.voi, "bits, split + merge"),
        ("ARAND", report.arand, "adapted Rand error, 1 - F"),
        ("precision", report.precision, "Rand merge score"),
        ("recall", report.recall, "Rand split score"),
    ]
    lines = [f"{report.segmentation} against {report.ground_truth}, region {roi}{band}:"]
    lines += [f"  {name:<10} {value:8.4f}  {what}" for name, value, what in rows]
    lines.append(
        f"{report.voxels:,} of {report.roi_voxels:,} voxels scored (ground truth not 0"
        f"{', outside the band' if report.border else ''}): {report.gt_objects:,} objects, "
        f"{report.segments:,} segments, {report.pairs:,} pairs; {report.blocks} "
        f"block{'s' * (report.blocks != 1)} in {report.elapsed_s:.2f} s")
    return "\n".join(lines)
