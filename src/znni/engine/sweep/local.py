"""The local sweep: read-ahead and write-behind threads around the compute of any stage.

While block i computes on the calling thread, block i+1 is read and decoded
by the reader thread and block i-1 encoded and written by the writer
thread. At most two inputs and two outputs are alive, which is what the
layout's memory rule counts. A block is reported done only after its write
returned, so the ledger never claims a block whose output is not on disk.
The writer thread reports it (`on_done`: the ledger record, progress), so a
ledger put to an object store or an fsync waits behind compute, not in front of it.
`on_done` also gets the values just written, so an OME pyramid can be made from them
instead of reading level 0 back (`pyramid.PyramidBuilder.land`).
The reader thread (`ReadAhead`) may be started before the sweep: `segment` reads the
first block's input while it still creates the output and its ledger, which on an object
store are a dozen requests in a row. The worker is any stage's (`stage.BlockWork`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import numpy as np

from znni.engine.geometry import Block
from znni.engine.job import SegmentCancelled
from znni.engine.sweep.progress import StageTimer
from znni.engine.sweep.stage import BlockWork, OnDone

T = TypeVar("T")


def _timed(timer: StageTimer, stage: str, fn: Callable[[], T]) -> T:
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        timer.add(stage, time.perf_counter() - t0)


class ReadAhead:
    """The sweep's reader thread: a block's input read and decoded while others compute."""

    def __init__(self, worker: BlockWork, timer: StageTimer) -> None:
        self.worker, self.timer = worker, timer
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="znni-read")
        self.started: dict[str, Future[Any]] = {}  # block key -> its read, begun before the sweep

    def start(self, block: Block) -> None:
        """Begin reading `block` now; `take` hands its read over later."""
        self.started[block.key] = self._submit(block)

    def take(self, block: Block) -> Future[Any]:
        """The read of `block`: the one `start` began, else a new one."""
        started = self.started.pop(block.key, None)
        return started if started is not None else self._submit(block)

    def close(self) -> None:
        """Wait for a read in progress and drop queued ones."""
        self.started.clear()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, block: Block) -> Future[Any]:
        return self.pool.submit(_timed, self.timer, "read", lambda: self.worker.read(block))


def run_local(
    worker: BlockWork,
    blocks: Sequence[Block],
    on_done: OnDone,
    timer: StageTimer,
    cancel: threading.Event | None = None,
    reads: ReadAhead | None = None,
) -> None:
    """Run `blocks` in order; raises SegmentCancelled after the current block if cancelled
    (set before the first block, during set-up: before it). A stop waits for at most the
    block computing and the writes behind it; queued reads are dropped.
    `reads`: a reader already started on `blocks[0]` (closed here); None: a new one."""
    reader = reads if reads is not None else ReadAhead(worker, timer)
    if not blocks:
        reader.close()
        return
    writer = ThreadPoolExecutor(1, thread_name_prefix="znni-write")

    def write(block: Block, values: np.ndarray) -> None:
        _timed(timer, "write", lambda: worker.write(block, values))
        on_done(block, values)  # in order: one writer thread

    def wait(fut: Future[Any]) -> Any:
        return _timed(timer, "wait", fut.result)

    pending_write: Future[None] | None = None
    try:
        next_read: Future[Any] | None = reader.take(blocks[0])
        for i, block in enumerate(blocks):
            if cancel is not None and cancel.is_set():  # before computing another block
                if pending_write is not None:
                    wait(pending_write)  # the block behind lands and is recorded
                    pending_write = None
                raise SegmentCancelled(f"cancelled after {i} of {len(blocks)} blocks")
            assert next_read is not None
            raw = wait(next_read)
            stop = cancel is not None and cancel.is_set()
            next_read = None
            if i + 1 < len(blocks) and not stop:
                next_read = reader.take(blocks[i + 1])
            out = _timed(timer, "compute", partial(worker.compute, block, raw))
            del raw
            if pending_write is not None:
                wait(pending_write)
            pending_write = writer.submit(write, block, out)
            del out
            if cancel is not None and cancel.is_set():
                wait(pending_write)
                pending_write = None
                raise SegmentCancelled(f"cancelled after {i + 1} of {len(blocks)} blocks")
        if pending_write is not None:  # the last block's write
            wait(pending_write)
        pending_write = None
    finally:
        reader.close()
        writer.shutdown(wait=True, cancel_futures=True)


def run_threaded(
    worker: BlockWork,
    blocks: Sequence[Block],
    on_done: OnDone,
    timer: StageTimer,
    threads: int,
    cancel: threading.Event | None = None,
) -> None:
    """`run_local` with `threads` blocks computing at once, for a stage whose compute is
    thread-safe and releases the GIL in most of its time (NumPy, connected-components-3d):
    one reader thread reads ahead in order, the computes run on a pool, the writes happen in
    block order on one writer thread, each block recorded after its write. A stop lets the
    blocks computing finish and land."""
    reader = ReadAhead(worker, timer)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="znni-compute")
    writer = ThreadPoolExecutor(1, thread_name_prefix="znni-write")
    inflight: list[tuple[Block, Future[Any]]] = []

    def compute(block: Block, read: Future[Any]) -> Any:
        raw = _timed(timer, "wait", read.result)
        return _timed(timer, "compute", partial(worker.compute, block, raw))

    def write(block: Block, values: Any) -> None:
        _timed(timer, "write", lambda: worker.write(block, values))
        on_done(block, values)

    writes: list[Future[None]] = []

    def land_first() -> None:
        """The oldest block's values to the writer (its compute's failure raises here);
        at most `threads` writes queued (a write's failure raises here)."""
        block, fut = inflight.pop(0)
        writes.append(writer.submit(write, block, fut.result()))
        while writes and (writes[0].done() or len(writes) > threads):
            writes.pop(0).result()

    try:
        for i, block in enumerate(blocks):
            if cancel is not None and cancel.is_set():
                while inflight:
                    land_first()
                for w in writes:
                    w.result()
                raise SegmentCancelled(f"cancelled after {i} of {len(blocks)} blocks")
            inflight.append((block, pool.submit(compute, block, reader.take(block))))
            if len(inflight) > threads:
                land_first()
        while inflight:
            land_first()
        for w in writes:
            w.result()
    finally:
        reader.close()
        pool.shutdown(wait=True, cancel_futures=True)
        writer.shutdown(wait=True, cancel_futures=True)
