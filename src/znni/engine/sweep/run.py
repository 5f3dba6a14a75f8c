"""`sweep(stage, blocks, ...)`: every unfinished block of a stage computed, written and
recorded, locally or on Dask, resumably.

What any block stage shares, whatever it computes: the blocks left to do (those not in the
ledger), the progress meter, the ledger's record after each block's write (and after its
landing, e.g. an OME pyramid's levels; input chunks found bad are noted before the block
that met them), cancellation (SegmentCancelled) and faults (VolumeFault) carrying how many
blocks are done, and closing the reader, the landing, the meter and the output's lock
whatever happens. The stage says what a block reads, computes and writes (`stage.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Triple
from znni.engine.io.faults import VolumeFault
from znni.engine.io.ledger import BlockLedger, open_ledger
from znni.engine.io.lock import OutputLock
from znni.engine.job import ProgressEvent, SegmentCancelled
from znni.engine.location import Location
from znni.engine.scheduler import Scheduler
from znni.engine.sweep.local import ReadAhead, run_local, run_threaded
from znni.engine.sweep.progress import Progress, StageTimer
from znni.engine.sweep.stage import BlockWork, Landing, OnDone, Stage


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did (blocks and voxels of this run; the meter's clock)."""

    blocks_total: int
    blocks_todo: int  # blocks this run set out to do (the ledger's done ones left out)
    blocks_skipped: int  # of those, written without compute (not counted as computed)
    voxels_this_run: int
    elapsed_s: float
    stage_seconds: dict[str, float]  # read, compute, write, wait (summed over threads)

    @property
    def blocks_computed(self) -> int:
        return self.blocks_todo - self.blocks_skipped


def start_ledger(location: Location, *, ctx: StoreContext, parts: dict[str, Any],
                 block_shape: Triple, resume: bool) -> BlockLedger:
    """The output's ledger, resumed (its finished blocks kept, a torn line ended) or
    started afresh with the run's fingerprint parts and block shape."""
    ledger = open_ledger(location, ctx=ctx)
    if resume:
        ledger.resume()
    else:
        ledger.start(parts, block_shape)
    return ledger


def sweep(
    stage: Stage,
    blocks: Sequence[Block],
    *,
    ledger: BlockLedger,
    done: frozenset[str] = frozenset(),
    lock: OutputLock | None = None,
    landing: Landing | None = None,
    scheduler: Scheduler | None = None,
    worker: BlockWork | None = None,
    reads: ReadAhead | None = None,
    bad_chunks: Callable[[], list[str]] | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
    quiet: bool = True,
    timer: StageTimer | None = None,
) -> SweepResult:
    """Compute, write and record every block of `blocks` not in `done` (module docstring).

    `scheduler`: None runs here (`worker`, else `stage.make_worker()`; `reads`: its reader,
    perhaps started on the first block already), else on Dask ('local:N', 'tcp://...', or a
    batch cluster, 'slurm:N', ...: `sweep/dask.py`).
    `lock`: the output's, released at the end; `landing`: what a block lands in before it is
    recorded (`Landing`); `bad_chunks`: the input chunks found bad since its last call.
    """
    timer = timer if timer is not None else StageTimer()
    todo = [b for b in blocks if b.key not in done]
    meter = Progress(len(blocks), sum(b.write.size for b in blocks), quiet=quiet,
                     callback=progress, blocks_done=len(blocks) - len(todo),
                     voxels_done=sum(b.write.size for b in blocks if b.key in done))
    skipped: set[str] = set()  # keys of blocks written without compute

    def record(block: Block) -> None:
        if bad_chunks is not None and (new := bad_chunks()):
            ledger.note_bad_chunks(new)  # before any block that computed them filled
        ledger.record([block.key])
        meter.block_done(block.write.size, block.key in skipped)

    try:
        if scheduler is None and worker is None:
            worker = stage.make_worker()
        skipped = getattr(worker, "skipped", skipped)  # the worker's own set (local)
        on_done: OnDone = (landing.track(blocks, done, record) if landing is not None
                           else lambda block, values: record(block))
        _run(stage, todo, on_done, timer, scheduler, worker, reads, cancel, skipped)
    except (VolumeFault, SegmentCancelled) as e:  # the caller says how much is kept
        e.done = (meter.blocks_done, meter.blocks_total)
        raise
    finally:
        if reads is not None:
            reads.close()
        if landing is not None:
            landing.close()
        meter.close()
        if lock is not None:
            lock.release()
    if landing is not None:
        landing.check()
    return SweepResult(len(blocks), len(todo), meter.blocks_skipped, meter.voxels_this_run,
                       meter.elapsed_s(), dict(timer.seconds))


def _run(stage: Stage, todo: list[Block], on_done: OnDone, timer: StageTimer,
         scheduler: Scheduler | None, worker: BlockWork | None, reads: ReadAhead | None,
         cancel: threading.Event | None, skipped: set[str]) -> None:
    """The blocks through this process's worker, or as Dask tasks."""
    if scheduler is None:
        assert worker is not None  # sweep made one
        threads = int(getattr(worker, "threads", 1))  # a stage whose compute runs threaded
        if threads > 1 and reads is None:
            run_threaded(worker, todo, on_done, timer, threads, cancel)
        else:
            run_local(worker, todo, on_done, timer, cancel, reads)
    else:
        from znni.engine.sweep.dask import run_dask  # distributed only where asked for

        run_dask(stage, todo, on_done, timer, scheduler, cancel, skipped)
