"""Blocks as Dask tasks: `tcp://HOST:PORT` (an existing cluster) or `local:N` (a LocalCluster).

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
new worker processes import znni again).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from znni.engine.geometry import Block
from znni.engine.job import SegmentCancelled
from znni.engine.sweep.progress import StageTimer
from znni.engine.sweep.stage import BlockWork, OnDone, Stage

TASK_RETRIES = 3  # task errors (not worker deaths, which the scheduler retries itself)

_WORKERS: dict[int, BlockWork] = {}
# scheduler -> (client, cluster or None), while a `shared_cluster` is open in this context
_SHARED: ContextVar[dict[str, tuple[Any, Any]] | None] = ContextVar("znni_dask_shared",
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


def _connect(scheduler: str) -> tuple[Any, Any]:
    """(client, cluster or None) for 'local:N' or 'tcp://HOST:PORT'."""
    from distributed import Client, LocalCluster

    if scheduler.startswith("local:"):
        cluster = LocalCluster(
            n_workers=int(scheduler[6:]), threads_per_worker=1, processes=True,
            dashboard_address=None,
        )
        return Client(cluster), cluster
    try:
        return Client(scheduler, timeout="20s"), None
    except OSError as e:
        raise ValueError(f"cannot reach the Dask scheduler at {scheduler} ({e})") from e


@contextlib.contextmanager
def shared_cluster(scheduler: str | None) -> Iterator[None]:
    """Every Dask sweep on `scheduler` inside shares one client (module docstring); nothing
    for None (a local run) or inside another `shared_cluster`."""
    if scheduler is None or _SHARED.get() is not None:
        yield
        return
    shared: dict[str, tuple[Any, Any]] = {}
    token = _SHARED.set(shared)
    try:
        yield
    finally:
        _SHARED.reset(token)
        for client, cluster in shared.values():
            _close(client, cluster)


def _close(client: Any, cluster: Any) -> None:
    client.close()
    if cluster is not None:
        cluster.close()


def run_dask(
    stage: Stage,
    blocks: Sequence[Block],
    on_done: OnDone,
    timer: StageTimer,
    scheduler: str,
    cancel: threading.Event | None = None,
    skipped: set[str] | None = None,
) -> None:
    """Run `blocks` as tasks; `on_done(block, None)` is called in this process as each one
    finishes (its values stay on the workers). The stage carries whatever the workers need
    (store options included). The keys of blocks written without compute are added to
    `skipped`."""
    if not blocks:
        return
    from distributed import as_completed

    shared = _SHARED.get()
    if shared is None:
        client, cluster = _connect(scheduler)
    else:
        if scheduler not in shared:
            shared[scheduler] = _connect(scheduler)
        client, cluster = shared[scheduler]
    try:
        [stage_future] = client.scatter([stage], broadcast=True, hash=False)
        by_key = {b.key: b for b in blocks}
        pending = {
            client.submit(run_block_task, stage_future, b, pure=False, retries=TASK_RETRIES)
            for b in blocks
        }
        finished = as_completed(list(pending))
        t_wait = time.perf_counter()
        for n, fut in enumerate(finished, start=1):
            key, times = fut.result()
            pending.discard(fut)
            fut.release()  # forget the result, so a later worker death cannot resurrect it
            timer.add("wait", time.perf_counter() - t_wait)
            if times.pop("skipped", 0.0) and skipped is not None:
                skipped.add(key)
            timer.merge(times)
            on_done(by_key[key], None)
            if cancel is not None and cancel.is_set() and pending:
                client.cancel(list(pending))
                raise SegmentCancelled(f"cancelled after {n} of {len(blocks)} blocks")
            t_wait = time.perf_counter()
    finally:
        if shared is None:
            _close(client, cluster)
