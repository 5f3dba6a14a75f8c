"""One run per output at a time: a lock file next to a local output, a lease object next to
an object-store one.

Two runs on one output both computed every block (correct, the work doubled). A run holds
`<output>.znni-lock` (JSON: host, pid, start time) from before its ledger starts until it
ends; the file is created with O_EXCL, so of two runs starting together one wins. A lock whose
holder is gone (same host, no such process) is stale and taken over; `--overwrite` does not
bypass a live one. The file sits beside the output, not in it, so an OME-Zarr group's listing
never meets it. An s3:// or gs:// output gets `ObjectLease`: the same record plus an expiry
that its run renews, so a holder that died unseen blocks at most LEASE_S.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from znni.engine.context import StoreContext
from znni.engine.io.faults import write_fault
from znni.engine.io.stores import read_bytes, remove_tree, write_bytes
from znni.engine.location import Location

LOCK_SUFFIX = ".znni-lock"
WAIT_POLL_S = 1.0  # --wait: how often a held lock is tried again
log = logging.getLogger("znni.engine")
_HELD: set[str] = set()  # the tokens of this process's live locks
TORN_GRACE_S = 10.0  # an unreadable lock younger than this may be being written
LEASE_S = 60.0  # an object-store lease: renewed every third of it, stale once expired
CONFIRM_S = 0.5  # after putting a lease: a rival's put in the same moment has landed by then


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


class OutputBusy(ValueError):
    """Another live run holds the output (one sentence naming it)."""


def lock_path(output_path: Location) -> Path:
    path = Path(output_path.bare().resolved().url)
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


def hold_output(output_path: Location, wait: bool = False, *,
                ctx: StoreContext | None = None) -> OutputLock:
    """Take the output's lock (an object store's: a lease, `ObjectLease`), or raise
    OutputBusy naming the live holder (`wait`: poll until the holder ends, saying once whom
    it waits for)."""
    said, output_path = False, output_path.bare()  # precomputed://: where it lives
    while True:
        try:
            if output_path.is_remote:
                return ObjectLease.take(output_path, replace(ctx or StoreContext(), memo=None))
            return _take(output_path)
        except OutputBusy as e:
            if not wait:
                raise
            if not said:
                log.info("waiting: %s", e)
                said = True
            time.sleep(WAIT_POLL_S)


def _identity() -> dict[str, Any]:
    """This run's holder record: host, pid, start time and a token no other hold shares."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"}


def _busy(output_path: Location, holder: dict[str, Any], remedy: str) -> OutputBusy:
    return OutputBusy(
        f"output {output_path} is being written by another run (host {holder.get('host')}, "
        f"pid {holder.get('pid')}, started {holder.get('started')}); wait for it to end "
        f"(--wait), or, if that run is gone, {remedy}")


def _take(output_path: Location) -> OutputLock:
    path = lock_path(output_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = _identity()
    token, body = me["token"], json.dumps(me).encode()
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
                raise _busy(output_path, holder, f"delete {path}") from None
            continue
        try:
            os.write(fd, body)
            os.fsync(fd)
        except OSError as e:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise write_fault(e, Location.parse(path), "lock file", what="output") from e
        os.close(fd)
        _HELD.add(token)
        return OutputLock(path, token)
    raise OutputBusy(f"output {output_path}: could not take its lock {path}; another run "
                     "keeps taking it")


class ObjectLease(OutputLock):
    """An object store's lock: `<output>.znni-lock`, an object with the holder and an expiry
    renewed by a thread while the run lives. Objects cannot be created exclusively, so a
    taker puts its lease, waits CONFIRM_S and reads it back: of two rivals the last put
    wins, and the other sees the winner's token and backs off."""

    def __init__(self, url: Location, me: dict[str, Any], ctx: StoreContext) -> None:
        super().__init__(None, me["token"])
        self.url, self.me, self.ctx = url, me, ctx
        self.stop = threading.Event()
        self.renewer = threading.Thread(target=self._renew, daemon=True,
                                        name="znni-lease")

    @classmethod
    def take(cls, output_path: Location, ctx: StoreContext) -> ObjectLease:
        url = output_path.beside(LOCK_SUFFIX)
        holder = _read_lease(url, ctx)
        if holder and float(holder.get("expires", 0)) > time.time() and not _stale(holder):
            raise _busy(output_path, holder, f"its lease {url} expires at "
                        f"{time.strftime('%H:%M:%SZ', time.gmtime(holder['expires']))}")
        lease = cls(url, _identity(), ctx)
        lease._put()
        time.sleep(CONFIRM_S)
        now = _read_lease(url, ctx) or {}
        if now.get("token") != lease.token:
            raise _busy(output_path, now, "retry in a minute")
        _HELD.add(lease.token)
        lease.renewer.start()
        return lease

    def _put(self) -> None:
        body = {**self.me, "expires": time.time() + LEASE_S}
        write_bytes(self.url, json.dumps(body).encode(), ctx=self.ctx)

    def _renew(self) -> None:
        while not self.stop.wait(LEASE_S / 3):
            try:
                self._put()
            except Exception as e:  # noqa: BLE001 - the run's own writes report the store
                log.debug("lease %s not renewed: %s", self.url, e)

    def release(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        if self.renewer.is_alive():
            self.renewer.join()
        _HELD.discard(self.token)
        try:
            if (_read_lease(self.url, self.ctx) or {}).get("token") == self.token:
                remove_tree(self.url, ctx=self.ctx)
        except Exception as e:  # noqa: BLE001 - it expires by itself
            log.debug("lease %s not removed (it expires by itself): %s", self.url, e)


def _read_lease(url: Location, ctx: StoreContext) -> dict[str, Any] | None:
    raw = read_bytes(url, "output", ctx=ctx)
    try:
        holder = json.loads(raw) if raw is not None else None
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) or holder is None else {}
