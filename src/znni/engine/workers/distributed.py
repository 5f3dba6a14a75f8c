"""Blocks as Dask tasks: `tcp://HOST:PORT` (an existing cluster) or `local:N` (a LocalCluster).

The `BlockSpec` (network and weights included) is scattered to every worker
once; each worker process builds its `BlockWorker` (arrays opened, backend
made) once per job and keeps it in a module-level cache. Workers read their
input and write their block straight to the shared output; the client
records a block in the ledger when its task has returned. Object-store volumes
are opened by each worker from their URLs, with the storage options of the job's
`StoreContext` that travels inside the spec, so workers read and write the store
directly. A worker that dies mid-block loses only that task, which the scheduler runs again
elsewhere; chunks are block-aligned, so a rerun block rewrites exactly the
chunks the dead one may have half written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from znni.engine.geometry import Block
from znni.engine.io.volume import open_output_array
from znni.engine.job import SegmentCancelled
from znni.engine.workers.base import Worker
from znni.engine.workers.make import Spec, make_worker
from znni.engine.workers.progress import StageTimer

if TYPE_CHECKING:
    import numpy as np

TASK_RETRIES = 3  # task errors (not worker deaths, which the scheduler retries itself)

_WORKERS: dict[int, Worker] = {}


def run_block_task(spec: Spec, block: Block) -> tuple[str, dict[str, float]]:
    """Runs on a Dask worker: one block, with the stage times it took there."""
    worker = _WORKERS.get(id(spec))
    if worker is None or worker.spec is not spec:
        _WORKERS.clear()
        url_output = (open_output_array(spec.output_path, ctx=spec.store)
                      if spec.output_path.is_remote else None)
        worker = make_worker(spec, output_array=url_output)
        _WORKERS[id(spec)] = worker
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    raw = worker.read(block)
    t1 = time.perf_counter()
    out = worker.compute(block, raw)
    t2 = time.perf_counter()
    worker.write(block, out)
    times = {"read": t1 - t0, "compute": t2 - t1, "write": time.perf_counter() - t2}
    if getattr(worker, "last_skipped", False):  # written as the fill value (workers/finish)
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


def run_dask(
    spec: Spec,
    blocks: Sequence[Block],
    on_done: Callable[[Block, np.ndarray | None], None],
    timer: StageTimer,
    scheduler: str,
    cancel: threading.Event | None = None,
    skipped: set[str] | None = None,
) -> None:
    """Run `blocks` as tasks; `on_done(block, None)` is called in this process as each one
    finishes (its values stay on the workers). The spec carries the store options. The keys
    of blocks written without compute (`workers/finish.py`) are added to `skipped`."""
    if not blocks:
        return
    from distributed import as_completed

    client, cluster = _connect(scheduler)
    try:
        [spec_future] = client.scatter([spec], broadcast=True, hash=False)
        by_key = {b.key: b for b in blocks}
        pending = {
            client.submit(run_block_task, spec_future, b, pure=False, retries=TASK_RETRIES)
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
        client.close()
        if cluster is not None:
            cluster.close()
