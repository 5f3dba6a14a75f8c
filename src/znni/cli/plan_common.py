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
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.io.volume import open_input
    from znni.engine.location import Location

    source = Location.parse(args.input, "input")
    ctx = context_for((source,), parse_storage_options(args.storage_option))
    path = source if args.level is None else level_path(source, args.level, ctx=ctx)
    return open_input(path, in_channels, ctx=ctx)
