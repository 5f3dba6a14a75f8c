"""One run per output at a time: a lock file next to a local output.

Two runs on one output both computed every block (correct, the work doubled). A run holds
`<output>.znni-lock` (JSON: host, pid, start time) from before its ledger starts until it
ends; the file is created with O_EXCL, so of two runs starting together one wins. A lock whose
holder is gone (same host, no such process) is stale and taken over; `--overwrite` does not
bypass a live one. The file sits beside the output, not in it, so an OME-Zarr group's listing
never meets it. Object-store outputs are not locked in this version.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from znni.engine.io.faults import write_fault
from znni.engine.io.stores import is_url, resolved

LOCK_SUFFIX = ".znni-lock"
WAIT_POLL_S = 1.0  # --wait: how often a held lock is tried again
log = logging.getLogger("znni.engine")
_HELD: set[str] = set()  # the tokens of this process's live locks
TORN_GRACE_S = 10.0  # an unreadable lock younger than this may be being written


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


class OutputBusy(ValueError):
    """Another live run holds the output (one sentence naming it)."""


def lock_path(output_path: str) -> Path:
    path = Path(resolved(output_path))
    return path.with_name(path.name + LOCK_SUFFIX)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    try:  # a zombie (exited, its parent gone and nobody reaping it, as in containers) is dead
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _holder(path: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # torn (its writer died mid-write): stale
    return holder if isinstance(holder, dict) else {}


def _stale(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return True
    if holder.get("host") != socket.gethostname():
        return False  # another machine's process: it cannot be asked
    if pid == os.getpid():  # this process (a server worker): stale unless a live hold
        return holder.get("token") not in _HELD
    return not _alive(pid)


class OutputLock:
    """The held lock of one output; `release` removes it (only if still ours)."""

    def __init__(self, path: Path | None, token: str) -> None:
        self.path, self.token = path, token

    def release(self) -> None:
        if self.path is None:
            return
        holder = _holder(self.path)
        if holder is not None and holder.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        _HELD.discard(self.token)
        self.path = None


def hold_output(output_path: str, wait: bool = False) -> OutputLock:
    """Take the output's lock, or raise OutputBusy naming the live holder (`wait`: poll
    until the holder ends, saying once whom it waits for)."""
    said = False
    while True:
        try:
            return _take(output_path)
        except OutputBusy as e:
            if not wait:
                raise
            if not said:
                log.info("waiting: %s", e)
                said = True
            time.sleep(WAIT_POLL_S)


def _take(output_path: str) -> OutputLock:
    token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
    if is_url(output_path):
        return OutputLock(None, token)
    path = lock_path(output_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "token": token}).encode()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder == {} and _age_s(path) < TORN_GRACE_S:  # its writer may be mid-write
                holder = {"host": "?", "pid": "?", "started": "just now"}
            elif holder is not None and _stale(holder):
                path.unlink(missing_ok=True)  # its holder is gone: take it over
                continue
            if holder is not None:
                raise OutputBusy(
                    f"output {output_path} is being written by another run (host "
                    f"{holder.get('host')}, pid {holder.get('pid')}, started "
                    f"{holder.get('started')}); wait for it to end, or, if that run is gone, "
                    f"delete {path}") from None
            continue
        try:
            os.write(fd, body)
            os.fsync(fd)
        except OSError as e:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise write_fault(e, str(path), "lock file", what="output") from e
        os.close(fd)
        _HELD.add(token)
        return OutputLock(path, token)
    raise OutputBusy(f"output {output_path}: could not take its lock {path}; another run "
                     "keeps taking it")
