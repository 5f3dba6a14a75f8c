"""The local block sweep: read-ahead and write-behind threads around the compute.

While block i computes on the calling thread, block i+1 is read and decoded
by the reader thread and block i-1 encoded and written by the writer
thread. At most two inputs and two outputs are alive, which is what the
layout's memory rule counts. A block is reported done only after its write
returned, so the ledger never claims a block whose output is not on disk.
The writer thread reports it (`on_done`: the ledger record, progress), so a
ledger put to an object store or an fsync waits behind compute, not in front of it.
`on_done` also gets the values just written, so an OME pyramid can be made from them
instead of reading level 0 back (`pyramid.PyramidBuilder.land`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from znni.engine.geometry import Block
from znni.engine.job import SegmentCancelled
from znni.engine.progress import StageTimer
from znni.engine.windowed import Worker


def _timed(timer: StageTimer, stage: str, fn: Callable[[], object]) -> object:
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        timer.add(stage, time.perf_counter() - t0)


def run_local(
    worker: Worker,
    blocks: Sequence[Block],
    on_done: Callable[[Block, np.ndarray | None], None],
    timer: StageTimer,
    cancel: threading.Event | None = None,
) -> None:
    """Run `blocks` in order; raises SegmentCancelled after the current block if cancelled."""
    if not blocks:
        return
    reader = ThreadPoolExecutor(1, thread_name_prefix="znni-read")
    writer = ThreadPoolExecutor(1, thread_name_prefix="znni-write")

    def read(block: Block) -> np.ndarray:
        return _timed(timer, "read", lambda: worker.read(block))  # type: ignore[return-value]

    def write(block: Block, values: np.ndarray) -> None:
        _timed(timer, "write", lambda: worker.write(block, values))
        on_done(block, values)  # in order: one writer thread

    def wait(fut: Future) -> object:
        return _timed(timer, "wait", fut.result)

    pending_write: Future | None = None
    try:
        next_read: Future | None = reader.submit(read, blocks[0])
        for i, block in enumerate(blocks):
            assert next_read is not None
            raw = wait(next_read)
            stop = cancel is not None and cancel.is_set()
            next_read = None
            if i + 1 < len(blocks) and not stop:
                next_read = reader.submit(read, blocks[i + 1])
            out = _timed(timer, "compute", lambda b=block, r=raw: worker.compute(b, r))
            del raw
            if pending_write is not None:
                wait(pending_write)
            pending_write = writer.submit(write, block, out)
            del out
            if cancel is not None and cancel.is_set():
                wait(pending_write)
                pending_write = None
                raise SegmentCancelled(f"cancelled after {i + 1} of {len(blocks)} blocks")
        wait(pending_write)
        pending_write = None
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
        writer.shutdown(wait=True, cancel_futures=True)
