"""The `znni` command line: one module per subcommand, registered below.

Each subcommand module has `add_parser(subparsers)` and `run(args) -> int`, and
imports the engine, the planner, zarr or pyFFTW only inside `run` (or, for the
option vocabularies, inside `add_parser`), so `import znni.cli` stays cheap.

Expected failures (bad input) print one sentence to stderr and exit 2, with
no traceback; an object store that stays unreachable through its retries prints
one sentence naming the URL and exits 1. A fault mid-run (`engine/io/faults.VolumeFault`: a
corrupt chunk, a full disk, a refusal) prints its sentence and a line on what is kept, exit 2
for bad data and 1 for the environment; `-v` prints its traceback first. ZNNI_DEBUG=1 shows
the traceback anyway.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from znni.cli import (
    agglomerate,
    bench,
    check,
    demo,
    evaluate,
    plan,
    preview,
    segment,
    serve,
    view,
)

# subcommand modules, in the order `znni --help` lists them
COMMANDS = (segment, agglomerate, evaluate, plan, check, preview, view, serve, bench, demo)

EXIT_BAD_INPUT = 2
EXIT_STORE_DOWN = 1
QUIET_LOGGERS = ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3")
# Dask configures its loggers itself (here and in its worker processes) from this variable; its
# workers log every failed task (a VolumeFault too) with a traceback, which znni reports itself
DASK_LOGGING = ("DASK_LOGGING__DISTRIBUTED", "critical")
# gcsfs logs every failure it hands back as an ERROR with a traceback; znni reports those
# failures itself, in one sentence
SILENT_LOGGERS = ("gcsfs",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="znni", description="Dense 3D ConvNet inference over large Zarr volumes."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _abandoned_request(record: logging.LogRecord) -> bool:
    """False (drop) for asyncio's "Task exception was never retrieved" about a connection
    error: a store request whose connection the server dropped mid-body (aiohttp leaves its
    body-writing task behind); the store's retries see that failure and report it."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (str(record.msg).startswith("Task exception was never retrieved")
                and isinstance(exc, ConnectionError))


def _quiet_shutdown() -> None:
    """After a failed store or a fault: the reads and writes still in flight in zarr's event
    loop are cancelled and waited for (`settle_zarr_io`), so zarr's exit handler stops an
    idle loop and drops no coroutine unawaited; their teardown (a client's cancelled
    request, ignored exceptions) is kept off stderr, after our one sentence."""
    from znni.engine.io.zarr_arrays import settle_zarr_io

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    settle_zarr_io()


# options whose values may start with "-" (an ROI with a negative start): argparse takes
# such a value for an option and says only "expected one argument"
DASHED_VALUES = ("--roi",)


def _join_dashed_values(argv: Sequence[str]) -> list[str]:
    """`--roi -5:10,...` as `--roi=-5:10,...`, so the value reaches its own check."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in DASHED_VALUES and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and ":" in argv[i + 1]:
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _volume_fault(e: Exception, args: argparse.Namespace) -> int:
    """A fault reading or writing a volume mid-run (`engine/io/faults.py`): its one sentence,
    how much is kept, exit 2 (bad data) or 1 (the environment); -v: the traceback first."""
    from znni.engine.io.faults import VolumeFault

    if not isinstance(e, VolumeFault) or os.environ.get("ZNNI_DEBUG"):
        raise e
    if args.verbose:
        traceback.print_exception(e)
    print(f"znni {args.command}: error: {e}", file=sys.stderr)
    done = getattr(e, "done", None)
    kept = f"{done[0]} of {done[1]} blocks are done and kept" if done else "finished blocks " \
        "are kept"
    fix = "fix the cause"
    if e.kind == "corrupt":  # fill runs locally only
        fix = "fix the chunk" + ("" if getattr(args, "scheduler", None) else
                                 " or pass --on-bad-chunk fill")
    print(f"znni {args.command}: {kept}; {fix}, then rerun the same command to resume",
          file=sys.stderr)
    _quiet_shutdown()
    return e.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_dashed_values(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("asyncio").addFilter(_abandoned_request)
    if not args.verbose:  # object-store clients log every credential lookup at INFO
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        for name in SILENT_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        os.environ.setdefault(*DASK_LOGGING)
    try:
        return int(args.run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        if os.environ.get("ZNNI_DEBUG"):
            raise
        print(f"znni {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as e:
        from znni.engine.io.stores import StoreError

        if not isinstance(e, StoreError) or os.environ.get("ZNNI_DEBUG"):
            raise
        print(f"znni {args.command}: error: {e}", file=sys.stderr)
        _quiet_shutdown()
        return EXIT_STORE_DOWN
    except Exception as e:
        return _volume_fault(e, args)
    except KeyboardInterrupt:
        print(f"znni {args.command}: interrupted", file=sys.stderr)
        return 130
