"""Job workers: separate processes that take queued jobs from SQLite and run the engine.

Compute never runs in the server's event loop. Each worker owns a slot and an
exclusive lock file for it, so after a crash a new worker for that slot starts
only once the old one is gone; it then resumes the slot's interrupted job
(the engine's ledger skips finished blocks). A worker exits on its own when
its parent server dies, so a killed server leaves no orphan computing.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from znni.jobs.current import Current
from znni.jobs.events import log_event
from znni.jobs.settings import Settings

log = logging.getLogger("znni.server")

WATCH_INTERVAL_S = 0.2


def worker_main(settings_values: dict[str, Any], slot: int) -> None:
    """Entry point of a worker process (spawned, so nothing is inherited but these args).

    SIGTERM asks it to stop after the current block (the job goes back to the queue);
    SIGINT is ignored, so a Ctrl-C in the terminal reaches only the server, which stops it.
    """
    settings = Settings(**settings_values)
    lower_priority(settings.worker_nice)  # first: threads started later inherit it
    stop = threading.Event()
    current = Current()

    def on_sigterm(*_: object) -> None:
        stop.set()
        current.shutdown = True
        current.cancel.set()  # the engine stops after its current block

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[worker {slot}]: %(message)s",
    )
    from znni.jobs.runner import JobRunner  # the engine is imported here, not in the server

    threading.Thread(target=_watchdog, args=(stop, current, settings), daemon=True).start()
    lock_fd = _acquire_slot(slot_lock_path(settings, slot), stop)
    if lock_fd is None:
        return
    runner = JobRunner(settings, slot, current)
    log.info(
        "worker %d ready (pid %d, nice %d)", slot, os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)
    )
    while not stop.is_set():
        if not runner.run_next():
            stop.wait(settings.poll_s)
    os.close(lock_fd)


def lower_priority(nice: int) -> None:
    """Raise this process's niceness to at least `nice`, so the API process preempts compute.

    On Linux niceness belongs to each thread and a new thread inherits its creator's, so
    every existing thread is set (in a fresh worker that is only the main thread) and all
    later ones (engine pools, FFTW/BLAS threads, Dask workers) follow. Never lowers it:
    that needs privileges and would make compute outrank requests.
    """
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue  # that thread ended meanwhile


def slot_lock_path(settings: Settings, slot: int) -> Path:
    return Path(f"{settings.db}.worker-{slot}.lock")


def _acquire_slot(path: Path, stop: threading.Event) -> int | None:
    """Wait until no other live process holds this slot (the kernel frees it on death)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    waited = False
    while not stop.is_set():
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if not waited:
                log.warning("waiting for an earlier worker to release %s", path.name)
                waited = True
            time.sleep(0.1)
    os.close(fd)
    return None


def _watchdog(stop: threading.Event, current: Current, settings: Settings) -> None:
    """Exit when the server died; turn cancel flags and shutdown into the engine's cancel."""
    from znni.jobs.store import JobStore

    parent = multiprocessing.parent_process()
    store = JobStore(settings.db)
    while True:
        time.sleep(WATCH_INTERVAL_S)
        if parent is not None and not parent.is_alive():
            os._exit(70)  # the server is gone: stop at once; the ledger keeps finished blocks
        with current.lock:
            job_id = current.job_id
        if job_id is None:
            continue
        if stop.is_set():
            current.shutdown = True
            current.cancel.set()
        elif store.cancel_requested(job_id):
            current.cancel.set()


class WorkerPool:
    """The server side: starts, watches, restarts and stops the worker processes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._ctx = multiprocessing.get_context("spawn")
        self._stopping = False
        self._procs: dict[int, Any] = {}

    def start(self) -> None:
        self._recover_orphaned_slots()
        for slot in range(self.settings.workers):
            self._spawn(slot)

    def _recover_orphaned_slots(self) -> None:
        """Jobs left running by worker slots this server will not start (it was restarted with
        fewer workers) go back to the queue, once no process holds that slot any more."""
        from znni.jobs.store import JobStore

        store = JobStore(self.settings.db)
        for slot in sorted(store.running_slots()):
            if slot < self.settings.workers:
                continue  # that slot's new worker resumes its job itself
            stop = threading.Event()
            timer = threading.Timer(30.0, stop.set)
            timer.start()
            fd = _acquire_slot(slot_lock_path(self.settings, slot), stop)
            timer.cancel()
            if fd is None:
                log.warning("worker slot %d is still held; its jobs stay running", slot)
                continue
            try:
                n = store.requeue_slot(slot)
            finally:
                os.close(fd)
            log_event("jobs.requeued", slot=slot, jobs=n)

    def _spawn(self, slot: int) -> None:
        values = self.settings.model_dump()
        proc = self._ctx.Process(
            target=worker_main, args=(values, slot), name=f"znni-worker-{slot}"
        )
        proc.daemon = True
        proc.start()
        self._procs[slot] = proc

    def alive(self) -> int:
        return sum(1 for p in self._procs.values() if p.is_alive())

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.is_alive() and p.pid is not None]

    def supervise(self) -> None:
        """Restart any worker that died (its job resumes in the new one)."""
        if self._stopping:
            return
        for slot, proc in list(self._procs.items()):
            if not proc.is_alive():
                log_event("worker.died", slot=slot, exitcode=proc.exitcode, level=logging.WARNING)
                proc.join(0)
                self._spawn(slot)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Ask workers to stop after their current block; running jobs go back to the queue."""
        self._stopping = True
        for proc in self._procs.values():
            if proc.is_alive():
                proc.terminate()  # SIGTERM: the worker stops after its current block
        deadline = time.monotonic() + timeout_s
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
