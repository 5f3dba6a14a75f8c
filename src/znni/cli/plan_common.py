"""What `znni plan`'s sequential and graph parts share: its --input, how it writes seconds
and bytes."""

from __future__ import annotations

import argparse
from typing import Any


def seconds(s: float) -> str:
    return f"{s:.1f}" if s >= 1 else f"{s:.3f}"


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n else "-"


def input_volume(args: argparse.Namespace, in_channels: int) -> Any:
    """--input (its --level) opened from its metadata, as `znni segment` opens it."""
    from znni.engine.io.ome import level_path
    from znni.engine.io.stores import check_location, context_for, parse_storage_options
    from znni.engine.io.volume import open_input

    check_location(args.input, "input")
    ctx = context_for((args.input,), parse_storage_options(args.storage_option))
    path = args.input if args.level is None else level_path(args.input, args.level, ctx=ctx)
    return open_input(path, in_channels, ctx=ctx)
