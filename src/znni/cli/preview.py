"""`znni preview OUTPUT [--z N | --y N | --x N] [-o slice.png]`: a PNG of one slice."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preview", help="write a PNG of one input slice with the output over it")
    p.add_argument("output", help="an output of znni segment (Zarr array, OME-Zarr image or "
                   "precomputed://PATH_OR_URL)")
    where = p.add_mutually_exclusive_group()
    for axis in ("z", "y", "x"):
        where.add_argument(f"--{axis}", type=int, metavar="N", help=f"the {axis} slice to show")
    p.add_argument("-o", "--out", help="PNG path (default: OUTPUT-zN.png beside the output)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="s3:// and gs:// URLs: an fsspec option (as for segment); repeatable")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.location import Location
    from znni.engine.output.preview import default_png, read_slice, render_preview

    output = Location.parse(args.output, "output")
    ctx = context_for((output,), parse_storage_options(args.storage_option))

    axis = next((a for a in ("z", "y", "x") if getattr(args, a) is not None), "z")
    index = getattr(args, axis)
    if args.out is None:  # the default name needs the slice index (the middle by default)
        index = read_slice(output, axis, index, ctx=ctx).index
    png = args.out or default_png(output, axis, index)
    print(render_preview(output, png, axis, index, ctx=ctx))
    return 0
