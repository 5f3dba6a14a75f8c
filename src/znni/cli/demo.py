"""`znni demo`: the main job on a built-in synthetic EM volume and a hand-set network."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="segment a built-in synthetic EM volume")
    p.add_argument("--dir", default="znni-demo", help="where to write (default: ./znni-demo)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import time

    import numpy as np
    import zarr

    from znni.cli.demo_data import synthetic_em, write_demo_network
    from znni.cli.segment import plan_summary
    from znni.engine.job import SegmentJob
    from znni.engine.location import Location
    from znni.engine.segment import segment
    from znni.model.network import load_network
    from znni.planner.jobtime import predicted_line, process_seconds

    root = Path(args.dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot write the demo into {root}: {e.strerror}") from None
    say: Callable[[str], None] = ((lambda _: None) if args.quiet
                                 else (lambda msg: print(msg, file=sys.stderr)))
    made = time.perf_counter()
    image, membranes = synthetic_em()
    em_path = root / "em.zarr" / "raw"
    zarr.create_array(str(em_path), data=image, chunks=(32, 96, 96), overwrite=True)
    spec_path = write_demo_network(root)
    made_s = time.perf_counter() - made  # the demo's own data: not part of a segment run
    say(f"synthetic EM volume {image.shape} uint8 -> {em_path}")
    network = load_network(spec_path)
    out_path = root / "boundaries.zarr"
    job = SegmentJob(network, Location.parse(em_path, "input"), Location.parse(out_path, "output"),
                     overwrite=True)
    report = segment(job, quiet=args.quiet)
    whole = process_seconds()
    measured_s = None if whole is None else whole - made_s
    boundary = np.asarray(zarr.open_array(str(out_path), mode="r")[0])
    pred = boundary > 0.5
    precision = float((pred & membranes).sum() / max(1, pred.sum()))
    recall = float((pred & membranes).sum() / max(1, membranes.sum()))
    print(f"output: {out_path} (boundary probability, shape {boundary.shape})")
    if report.plan is not None:
        print(plan_summary(report.plan))
    print(
        f"mean boundary probability on true membranes {boundary[membranes].mean():.2f}, "
        f"inside cells {boundary[~membranes].mean():.2f}; at 0.5: precision {precision:.2f}, "
        f"recall {recall:.2f}"
    )
    line = predicted_line(report.plan, report.voxels_written, measured_s)
    print(line or f"whole run: {report.voxels_written:,} voxels, the blocks in "
          f"{report.elapsed_s:.2f} s")
    from znni.engine.output.preview import default_png, render_preview

    middle = boundary.shape[0] // 2
    png = render_preview(job.output_path, default_png(job.output_path, "z", middle), "z", middle,
                         ctx=job.store)
    print(f"preview: {png} (the middle z slice, boundary probability over the EM)")
    return 0
