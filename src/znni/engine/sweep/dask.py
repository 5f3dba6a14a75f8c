"""Blocks as Dask tasks: `tcp://HOST:PORT` (an existing cluster), `local:N` (a LocalCluster),
or a batch cluster `slurm:N` (pbs, lsf, sge) through dask-jobqueue (`batch.py`).

The stage (for inference: the network spec, weights included) is scattered to every
worker once; each worker process makes its `BlockWork` from it (`Stage.make_worker`:
arrays opened, backend made) once per job and keeps it in a module-level cache. Workers
read their input and write their block straight to the shared output; the client records
a block in the ledger when its task has returned. Whatever a worker opens (object-store
volumes by their URLs, with the store options that travel inside the stage) it opens
itself. A worker that dies mid-block loses only that task, which the scheduler runs again
elsewhere; chunks are block-aligned, so a rerun block rewrites exactly the chunks the
dead one may have half written.
Inside `shared_cluster(scheduler)` the sweeps of one job (agglomeration's three stages) use
one client, and for 'local:N' one LocalCluster, made at the first sweep that has blocks to
run and closed at the end, instead of a cluster per stage (each about 2 s to start, and its
new worker processes import znni again). A batch cluster is asked for at most N workers and
never more than the blocks of the sweep at hand; its jobs are cancelled when it closes.
The client looks for finished blocks every CANCEL_POLL_S, so a cancel (SIGTERM, Ctrl-C) is
seen while batch workers still wait in the queue; every KEEP_S meanwhile a batch cluster
asks again for the jobs whose workers are gone (`batch.keep_batch`). It does so too while
it fetches a finished block's result that must be computed again because its worker died
after the task ended: a fetch that waited without asking could wait for ever for a worker
(a run whose every worker job was killed).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from znni.engine.geometry import Block
from znni.engine.job import SegmentCancelled
from znni.engine.scheduler import LOCAL, Scheduler
from znni.engine.sweep.progress import StageTimer
from znni.engine.sweep.stage import BlockWork, OnDone, Stage

TASK_RETRIES = 3  # task errors (not worker deaths, which the scheduler retries itself)
CANCEL_POLL_S = 0.05  # how often the client looks for finished blocks and a cancel
KEEP_S = 2.0  # how often, while no block finishes, a batch cluster's lost jobs are replaced

_WORKERS: dict[int, BlockWork] = {}
# scheduler -> (client, cluster or None), while a `shared_cluster` is open in this context
_SHARED: ContextVar[dict[Scheduler, tuple[Any, Any]] | None] = ContextVar("znni_dask_shared",
                                                                     default=None)


def run_block_task(stage: Stage, block: Block) -> tuple[str, dict[str, float]]:
    """Runs on a Dask worker: one block, with the stage times it took there."""
    worker = _WORKERS.get(id(stage))
    if worker is None or worker.spec is not stage:
        _WORKERS.clear()
        worker = stage.make_worker()
        _WORKERS[id(stage)] = worker
    t0 = time.perf_counter()
    raw = worker.read(block)
    t1 = time.perf_counter()
    out = worker.compute(block, raw)
    t2 = time.perf_counter()
    worker.write(block, out)
    times = {"read": t1 - t0, "compute": t2 - t1, "write": time.perf_counter() - t2}
    if block.key in getattr(worker, "skipped", ()):  # written without compute
        times["skipped"] = 1.0
    return block.key, times


def _connect(scheduler: Scheduler, blocks: int) -> tuple[Any, Any]:
    """(client, cluster or None) for 'local:N', 'tcp://HOST:PORT' or a batch cluster (at
    most N workers, never more than `blocks`)."""
    from distributed import Client, LocalCluster

    if scheduler.is_batch:
        from znni.engine.sweep.batch import start_batch_cluster

        return start_batch_cluster(scheduler, blocks)
    if scheduler.kind == LOCAL:
        # no dashboard, and the scheduler's HTTP routes on a free port: on its default,
        # 8787, a second cluster on the host made distributed warn on stderr
        cluster = LocalCluster(
            n_workers=scheduler.workers, threads_per_worker=1, processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard": False, "dashboard_address": ":0"},
        )
        return Client(cluster), cluster
    try:
        return Client(scheduler.address, timeout="20s"), None
    except OSError as e:
        raise ValueError(f"cannot reach the Dask scheduler at {scheduler} ({e})") from e


@contextlib.contextmanager
def shared_cluster(scheduler: Scheduler | None) -> Iterator[None]:
    """Every Dask sweep on `scheduler` inside shares one client (module docstring); nothing
    for None (a local run) or inside another `shared_cluster`."""
    if scheduler is None or _SHARED.get() is not None:
        yield
        return
    shared: dict[Scheduler, tuple[Any, Any]] = {}
    token = _SHARED.set(shared)
    try:
        yield
    finally:
        _SHARED.reset(token)
        for client, cluster in shared.values():
            _close(client, cluster)


def _close(client: Any, cluster: Any) -> None:
    """The client, then the cluster we started (a batch cluster's jobs cancelled)."""
    try:
        client.close()
    finally:
        if cluster is not None:
            cluster.close()


def run_dask(
    stage: Stage,
    blocks: Sequence[Block],
    on_done: OnDone,
    timer: StageTimer,
    scheduler: Scheduler,
    cancel: threading.Event | None = None,
    skipped: set[str] | None = None,
) -> None:
    """Run `blocks` as tasks; `on_done(block, None)` is called in this process as each one
    finishes (its values stay on the workers). The stage carries whatever the workers need
    (store options included). The keys of blocks written without compute are added to
    `skipped`."""
    if not blocks:
        return
    shared = _SHARED.get()
    if shared is None:
        client, cluster = _connect(scheduler, len(blocks))
    elif scheduler not in shared:
        client, cluster = shared[scheduler] = _connect(scheduler, len(blocks))
    else:
        client, cluster = shared[scheduler]
        if scheduler.is_batch:  # this stage's blocks, not the last one's
            from znni.engine.sweep.batch import scale_batch

            scale_batch(cluster, scheduler, len(blocks))
    keep = None
    if scheduler.is_batch:  # dead jobs asked for again while blocks are left
        from znni.engine.sweep.batch import keep_batch

        def keep(left: int) -> None:
            keep_batch(cluster, scheduler, left)
    try:
        _run_tasks(client, _stage_future(client, stage, scheduler), blocks, on_done, timer,
                   cancel, skipped, keep)
    finally:
        if shared is None:
            _close(client, cluster)


def _stage_future(client: Any, stage: Stage, scheduler: Scheduler) -> Any:
    """The stage on the workers: scattered to every worker (local, tcp); on a batch
    cluster, whose workers join one by one and may be killed, a task that holds it, so the
    scheduler computes it again wherever a worker needs it and no worker holds it (scattered
    data that every holder lost cannot be recovered; nor can it be scattered to no worker)."""
    if scheduler.is_batch:
        return client.submit(_the_stage, stage, pure=False)
    [future] = client.scatter([stage], broadcast=True, hash=False)
    return future


def _the_stage(stage: Stage) -> Stage:
    """Runs on a worker: the stage the task carries."""
    return stage


def _run_tasks(client: Any, stage_future: Any, blocks: Sequence[Block], on_done: OnDone,
               timer: StageTimer, cancel: threading.Event | None,
               skipped: set[str] | None, keep: Callable[[int], None] | None = None) -> None:
    """One task per block; `on_done` as each returns. A cancel stops at the next finished
    block, or at once while none finishes (blocks then in flight are rewritten by the rerun
    that resumes, as after a kill). `keep(blocks left)`: every KEEP_S while none finishes,
    and while a finished block's result is computed again (its worker was lost after the
    task ended: fetching it waits for a worker, which may be the one `keep` asks for)."""
    from distributed import as_completed

    by_key = {b.key: b for b in blocks}
    pending = {
        client.submit(run_block_task, stage_future, b, pure=False, retries=TASK_RETRIES)
        for b in blocks
    }
    finished = as_completed(list(pending))
    t_wait = kept = time.perf_counter()
    n = 0
    while pending:
        ready = finished.next_batch(block=False)
        if not ready:
            _stop_if_cancelled(client, cancel, pending, n, len(blocks))
            if keep is not None and time.perf_counter() - kept > KEEP_S:
                keep(len(pending))
                kept = time.perf_counter()
            time.sleep(CANCEL_POLL_S)
            continue
        for fut in ready:
            key, times = _result(fut, client, cancel, pending, keep, n, len(blocks))
            pending.discard(fut)
            fut.release()  # forget the result, so a later worker death cannot resurrect it
            n += 1
            timer.add("wait", time.perf_counter() - t_wait)
            if times.pop("skipped", 0.0) and skipped is not None:
                skipped.add(key)
            timer.merge(times)
            on_done(by_key[key], None)
            t_wait = time.perf_counter()
            if pending:  # at the next finished block, even within one batch of them
                _stop_if_cancelled(client, cancel, pending, n, len(blocks))


def _result(fut: Any, client: Any, cancel: threading.Event | None, pending: set[Any],
            keep: Callable[[int], None] | None, n: int, total: int) -> Any:
    """A finished task's value, waited for KEEP_S at a time: between tries a cancel stops
    the run and `keep` asks again for lost batch jobs."""
    while True:
        try:
            return fut.result(timeout=KEEP_S)
        except TimeoutError:
            _stop_if_cancelled(client, cancel, pending, n, total)
            if keep is not None:
                keep(len(pending))


def _stop_if_cancelled(client: Any, cancel: threading.Event | None, pending: set[Any],
                       n: int, total: int) -> None:
    if cancel is not None and cancel.is_set():
        client.cancel(list(pending))
        raise SegmentCancelled(f"cancelled after {n} of {total} blocks")
