"""Many `znni` commands for the price of one start-up, each ending in its own interpreter exit.

`python fork_cli.py RUNS.json [JOBS]` imports the CLI and what a segment run loads (zarr,
numpy, the engine, the planner) once, then for each argument list in RUNS.json forks a
child that runs `znni.cli.main` and leaves by `sys.exit`, as `python -m znni.cli` does: the
child's exit runs the thread joins, the atexit handlers (zarr's stops its event loop) and
the final collection of a real process, with its stderr in `<RUNS.json>.<i>.err`. JOBS
children (default 1) run at a time; the driver prints each run's exit status, one a line,
in the order of RUNS.json. For tests that repeat a run many times (a fault's exit, checked
20 times): a fresh `python -m znni.cli` costs ~1.4 s of imports, a forked run ~0.3 s.

Nothing here starts a thread or zarr's event loop before a fork (zarr resets its loop in a
forked child anyway), so each child starts as a new process would.
"""

from __future__ import annotations

import json
import os
import sys


def _child(argv: list[str], err: str) -> None:
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    from znni.cli import main

    sys.argv = ["znni", *argv]
    sys.exit(main(argv))  # SystemExit: the interpreter's own exit, as `python -m znni.cli`


def _preload() -> None:
    """The modules a segment run imports, loaded before the forks."""
    import numpy  # noqa: F401
    import zarr  # noqa: F401

    import znni.cli  # noqa: F401
    import znni.cli.segment  # noqa: F401
    import znni.engine.segment  # noqa: F401
    import znni.model.loading  # noqa: F401
    import znni.planner.search  # noqa: F401
    import znni.primitives.backends  # noqa: F401


def _run_all(runs_path: str, jobs: int) -> list[int]:
    with open(runs_path) as f:
        runs: list[list[str]] = json.load(f)
    _preload()
    codes: dict[int, int] = {}
    running: dict[int, int] = {}  # pid -> run index
    for i, argv in enumerate(runs):
        while len(running) >= jobs:
            pid, status = os.wait()
            codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(argv, f"{runs_path}.{i}.err")  # never returns: the child exits
        running[pid] = i
    while running:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    return [codes[i] for i in range(len(runs))]


if __name__ == "__main__":
    for code in _run_all(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1):
        print(code)
