"""Whole `segment` runs of a sequential network: the patch and block znni chooses for the
region against the rule it replaced, in the same run.

    .venv/bin/python benchmarks/tiling.py [--network demo|SPEC.json] [--reps 3]
        [--case SHAPE:CHUNKS:LIMIT ...]   e.g. 128,512,512:64,64,64:2GiB
        [--roi-case SHAPE:CHUNKS:LIMIT:ROI ...]
            e.g. 96,1024,1024:32,128,128:2GiB:0-96,200-700,200-700

Per case (a zero uint8 volume of SHAPE in CHUNKS, `--memory-limit LIMIT`):
- **region**: `segment` as it runs, with the plan fastest over the region
  (planner.search.region_voxels_per_second) and the block whose patches tile it with the
  least recomputation (engine.layout.choose_block_shape);
- **per patch**: the plan with the most predicted voxels/s per patch, as the planner chose
  before, in blocks of the fewest whole chunks holding one patch, as blocks were chosen
  before (a block a few voxels wider than a patch takes two per axis).

Per ROI case (`--roi z0:z1,y0:y1,x0:x1`, written here with dashes), the same plan in:
- **ROI**: the block as `segment` chooses it, counting the blocks as they are cut on the
  chunk grid from voxel 0 (short ones at an ROI's faces off that grid);
- **from start**: the block chosen as if the grid began at the ROI's first voxel, as it
  was chosen before.

Printed: each one's patch, block, output computed per output voxel (counted patch by patch
as the engine tiles), and the fastest of `--reps` alternated wall times after one untimed
warm-up run; the ratio is the
old way's over the new. Compute only runs on zeros, so the values do not matter.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from math import prod
from pathlib import Path

from znni.triple import Triple, as_triple

DEFAULT_CASES = ("64,192,192:32,96,96:11GiB", "128,512,512:64,64,64:2GiB",
                 "200,700,700:50,100,100:4GiB", "96,1000,1000:32,128,128:2GiB")
DEFAULT_ROI_CASES = ("96,1024,1024:32,128,128:2GiB:0-96,200-700,200-700",
                     "128,1024,1024:64,64,64:2GiB:0-128,100-700,100-700")


def triple(text: str) -> Triple:
    """'z,y,x' (an argparse type) as a Triple."""
    return as_triple((int(v) for v in text.split(",")), text)


def computed_per_output(region: tuple[int, ...], block: tuple[int, ...],
                        patch: tuple[int, ...], origin: tuple[int, ...] = (0, 0, 0)) -> float:
    """Output voxels the patches compute per output voxel of the region (from `origin`)."""
    from znni.engine.geometry import Box, Halo, patch_tiling, split_blocks

    total = 0
    hi = tuple(o + r for o, r in zip(origin, region, strict=True))
    for b in split_blocks(Box(origin, hi), block, block, Halo((0,) * 3, (0,) * 3),  # type: ignore[arg-type]
                          (1, 1, 1)):
        extent = b.write.shape
        clipped = tuple(min(p, e) for p, e in zip(patch, extent, strict=True))
        total += sum(box.size for box in patch_tiling(extent, clipped))
    return total / prod(region)


def per_patch_plan(network, limit: int, region: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    """The plan with the most predicted voxels/s per patch (ties: the smaller batch)."""
    from znni.engine.compute.layout import PLAN_FRACTION
    from znni.planner.detect import detect_machine
    from znni.planner.search import BATCHES, candidate_sizes, evaluate

    machine, host = detect_machine(), int(limit * PLAN_FRACTION)
    plans = [p for size in candidate_sizes(network, region) for batch in BATCHES
             for p in evaluate(network, machine, "cpu", network.layer_shapes(size, batch),
                               host_bytes=host, gpu_bytes=0)]
    return max(plans, key=lambda p: (p.predicted_voxels_per_second, -p.batch))


def run(job, plan=None) -> float:  # type: ignore[no-untyped-def]
    from znni.engine.segment import segment

    shutil.rmtree(str(job.output_path), ignore_errors=True)  # a local Location
    t0 = time.perf_counter()
    segment(job, quiet=True, plan=plan)
    return time.perf_counter() - t0


def bench_case(network, case: str, reps: int, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    import zarr

    from znni.engine.job import SegmentJob
    from znni.engine.segment import prepare_run
    from znni.engine.units import parse_bytes

    shape_s, chunks_s, limit_s = case.split(":")
    shape, chunks, limit = triple(shape_s), triple(chunks_s), parse_bytes(limit_s)
    src = tmp / f"in-{shape_s}-{chunks_s}.zarr"
    zarr.create_array(str(src), shape=shape, chunks=chunks, dtype="uint8", fill_value=0,
                      overwrite=True)
    common = {"input_path": str(src), "output_path": str(tmp / f"out-{shape_s}.zarr"),
              "chunks": chunks,
              "memory_limit_bytes": limit, "overwrite": True}
    ours = prepare_run(SegmentJob(network, **common))
    old_plan = per_patch_plan(network, limit, shape)
    old_block = tuple(-(-min(max(o, c), max(r, c)) // c) * c
                      for o, c, r in zip(old_plan.output_size, chunks, shape, strict=True))
    runs = {"region": (SegmentJob(network, **common), None),
            "per patch": (SegmentJob(network, **common, block=old_block), old_plan)}
    best = {name: float("inf") for name in runs}
    run(*runs["region"])  # warm-up, not timed: the process's first run pays its imports
    for _ in range(reps):
        for name, (job, plan) in runs.items():
            best[name] = min(best[name], run(job, plan))
    for name, patch, block in (("region", ours.patch, ours.block_shape),
                               ("per patch", old_plan.output_size, old_block)):
        print(f"  {name:<9} patch {patch} block {block}: computes "
              f"{computed_per_output(shape, block, patch):.2f}x the output, "
              f"{best[name]:.2f} s")
    print(f"  per patch / region: {best['per patch'] / best['region']:.2f}")


def bench_roi_case(network, case: str, reps: int, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    import zarr

    from znni.engine.compute.layout import choose_block_shape
    from znni.engine.job import SegmentJob
    from znni.engine.segment import prepare_run
    from znni.engine.units import parse_bytes, parse_roi

    shape_s, chunks_s, limit_s, roi_s = case.split(":")
    shape, chunks, limit = triple(shape_s), triple(chunks_s), parse_bytes(limit_s)
    roi = parse_roi(roi_s.replace("-", ":"))
    src = tmp / f"in-{shape_s}-{chunks_s}.zarr"
    zarr.create_array(str(src), shape=shape, chunks=chunks, dtype="uint8", fill_value=0,
                      overwrite=True)
    common = {"input_path": str(src), "output_path": str(tmp / f"out-{shape_s}.zarr"),
              "chunks": chunks, "roi": roi, "memory_limit_bytes": limit, "overwrite": True}
    ours = prepare_run(SegmentJob(network, **common))
    assert ours.plan is not None
    region, origin = ours.region.shape, ours.region.lo
    old_block = choose_block_shape(network, chunks, ours.patch, region, limit, 1,
                                   ours.plan.peak_bytes, ours.plan.batch)
    runs = {"ROI": SegmentJob(network, **common),
            "from start": SegmentJob(network, **common, block=old_block)}
    best = {name: float("inf") for name in runs}
    run(runs["ROI"], ours.plan)  # warm-up, not timed: the process's first run pays its imports
    for _ in range(reps):
        for name, job in runs.items():
            best[name] = min(best[name], run(job, ours.plan))
    for name, block in (("ROI", ours.block_shape), ("from start", old_block)):
        print(f"  {name:<10} patch {ours.patch} block {block}: computes "
              f"{computed_per_output(region, block, ours.patch, origin):.2f}x the output, "
              f"{best[name]:.2f} s")
    print(f"  from start / ROI: {best['from start'] / best['ROI']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="demo", help="demo (znni demo's network) or a spec")
    ap.add_argument("--case", action="append", default=None, metavar="SHAPE:CHUNKS:LIMIT")
    ap.add_argument("--roi-case", action="append", default=None,
                    metavar="SHAPE:CHUNKS:LIMIT:ROI")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from znni.model.network import load_network

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if args.network == "demo":
            from znni.cli.demo_data import write_demo_network

            network = load_network(write_demo_network(tmp))
        else:
            network = load_network(Path(args.network))
        only_rois = args.roi_case is not None and args.case is None
        for case in [] if only_rois else args.case or DEFAULT_CASES:
            print(f"{network.name}, volume:chunks:limit {case}")
            bench_case(network, case, args.reps, tmp)
        for case in args.roi_case or ([] if args.case else DEFAULT_ROI_CASES):
            print(f"{network.name}, volume:chunks:limit:roi {case}")
            bench_roi_case(network, case, args.reps, tmp)


if __name__ == "__main__":
    main()
