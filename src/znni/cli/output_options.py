"""`--labels`, `--mask` and `--skip-empty`, as `znni segment` and `znni plan` take them
(docs/design.md, "Labels, masks and empty blocks")."""

from __future__ import annotations

import argparse
from typing import Any


def add_output_options(p: argparse.ArgumentParser) -> None:
    """The options that change what is stored and what is computed; their values are
    checked where the job is (one sentence, exit 2), not by argparse."""
    p.add_argument("--labels", metavar="argmax|threshold:T[:CHANNEL]",
                   help="write labels instead of the float output, computed per block after "
                   "blending: argmax over channels (uint8, uint16 beyond 256 classes) or "
                   "CHANNEL (default 0) > T (uint8 0/1)")
    p.add_argument("--mask", help="Zarr array or OME-Zarr image (or URL) whose shape divides "
                   "the input's; nonzero = inside: blocks wholly outside are not computed, "
                   "voxels outside are written as 0")
    p.add_argument("--skip-empty", nargs="?", type=float, const=0.0, metavar="VALUE",
                   help="blocks whose input over their output box is all VALUE (default 0) "
                   "are written as 0 without compute")


def plan_form(args: argparse.Namespace, channels: int, shape: tuple[int, int, int]) -> Any:
    """`znni plan --input`'s output form (engine/output/form.py): the stored channels and
    dtype, and the mask whose outside blocks the plan does not compute."""
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.output.form import make_form

    mask = mask_location(args)
    ctx = context_for([mask] if mask else [], parse_storage_options(args.storage_option))
    return make_form(args.labels, args.dtype, mask, args.skip_empty, channels, shape,
                     ctx=ctx)


def mask_location(args: argparse.Namespace) -> Any:
    """--mask parsed (None without one)."""
    from znni.engine.location import Location

    return Location.parse(args.mask, "mask") if args.mask else None


def form_fields(args: argparse.Namespace, channels: int,
                job_seconds: dict[str, Any] | None) -> dict[str, Any]:
    """What the options change in a plan (engine.output.form.plan_fields, as
    `POST /v1/plan` shows them): the stored channels and dtype, the blocks wholly outside
    the mask (not computed) and the empty-block value; {} without them."""
    from znni.engine.output.form import plan_fields

    return plan_fields(args.labels, args.dtype, mask_location(args), args.skip_empty, channels,
                       (job_seconds or {}).get("skipped_blocks", 0))


def form_line(fields: dict[str, Any]) -> str | None:
    """`form_fields` as the plan's text line; None when there are none."""
    if not fields:
        return None
    parts = [f"{fields['output_channels']} {fields['output_dtype']} channel"
             + "s" * (fields["output_channels"] != 1)
             + (f" (labels {fields['labels']})" if fields["labels"] else "")]
    if fields["mask"] and (n := fields["blocks_outside_mask"]) is None:  # graph models
        parts.append("blocks wholly outside the mask written as 0 without compute (the "
                     "predicted time counts them computed)")
    elif fields["mask"]:
        parts.append(f"{n} block{'s' * (n != 1)} wholly outside the mask, written as 0 "
                     "without compute")
    if fields["skip_empty"] is not None:
        parts.append(f"blocks whose input is all {fields['skip_empty']:g} are read, not "
                     "computed")
    return "output: " + "; ".join(parts)
