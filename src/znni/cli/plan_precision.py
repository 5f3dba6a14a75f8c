"""`znni plan MODEL.onnx --precision int8|auto`: the plan at each candidate precision and,
with --input, the error measured on the input's own windows as `znni segment` measures it
before its sweep (engine/precision_run.py): int8 refused above --max-error, auto's
choice; without --input, the fastest predicted plan and a note that the error is measured
once the input is given."""

from __future__ import annotations

import argparse
from typing import Any


def precision_summary(args: argparse.Namespace, model: Any, limit: int | None,
                      region: tuple[int, int, int] | None, machine: Any,
                      window: tuple[int, int, int] | None, flips: int) -> dict[str, Any]:
    """engine.graph_plan's summary at the precision int8 or auto settles on (see above)."""
    from znni.engine.compute.graph_plan import graph_plan
    from znni.engine.options import check_max_error
    from znni.engine.precision_run import Candidate, plan_candidates, unmeasured_summary

    check_max_error(args.max_error)
    plans = plan_candidates(args.precision, lambda p: graph_plan(
        model, limit, region, args.overlap, machine, window, device="cpu", precision=p,
        flips=flips))
    if args.input is None:
        return unmeasured_summary(args.precision, plans)
    candidates = {p: Candidate(p, (s["window"][0], s["window"][1], s["window"][2]),
                               s["predicted_voxels_per_second"]) for p, s in plans.items()}
    settled = _settle(args, model, candidates)
    return {**plans[settled.precision], "precision_asked": args.precision, **settled.records}


def _settle(args: argparse.Namespace, model: Any, candidates: dict[str, Any]) -> Any:
    """The precision settled over --input's region (--roi), its --mask and --labels."""
    from znni.cli.output_options import plan_form
    from znni.cli.plan_common import input_volume
    from znni.engine.geometry import Box
    from znni.engine.precision_run import Sampler, settle
    from znni.engine.units import parse_roi, resolve_roi
    from znni.triple import as_triple

    volume = input_volume(args, model.in_channels)
    lo_hi = resolve_roi(parse_roi(args.roi) if args.roi else None, volume.shape)
    region = Box(as_triple(a for a, _ in lo_hi), as_triple(b for _, b in lo_hi))
    form = plan_form(args, model.out_channels, volume.shape)  # --labels, --mask
    sample = Sampler(model, volume.read, region, form.mask, str(args.input))
    return settle(args.precision, model, candidates, sample, max_error=args.max_error,
                  labels=form.labels)


def precision_lines(summary: dict[str, Any]) -> list[str]:
    """The plan's lines on int8's measured error and auto's choice, or the note that they
    are measured once --input is given."""
    from znni.engine.precision_run import int8_line

    if summary.get("precision_note"):
        rates = ", ".join(f"{p} {v:,.0f}" for p, v in summary["precision_candidates"].items())
        return [f"--precision {summary['precision_asked']}: predicted output voxels/s "
                f"{rates}; {summary['precision_note']}"]
    line = int8_line(summary)
    return [] if line is None else line.splitlines()
