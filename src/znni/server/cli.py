"""The `znni` command line. Each subcommand lives in its own `cmd_*.py` module.

Expected failures (bad input) print one sentence to stderr and exit 2, with
no traceback; set ZNNI_DEBUG=1 to see the traceback anyway.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

# subcommand -> module with `add_parser(subparsers)` and `run(args) -> int`
COMMANDS = {
    "segment": "znni.server.cmd_segment",
    "plan": "znni.server.cmd_plan",
    "serve": "znni.server.cmd_serve",
    "bench": "znni.server.cmd_bench",
    "demo": "znni.server.cmd_demo",
}

EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """A command-line mistake: reported as one sentence, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="znni", description="Dense 3D ConvNet inference over large Zarr volumes."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # a subcommand not built yet
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        if os.environ.get("ZNNI_DEBUG"):
            raise
        print(f"znni {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"znni {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
