"""The block sweep is not about networks: a threshold stage (read a Zarr block, compare,
write another Zarr array) runs through the same `sweep()` as inference, here and on a Dask
`local:2` cluster, with a real ledger and lock on disk, and resumes an interrupted run by
computing only the blocks its ledger lacks."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import zarr

from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Box, Halo, split_blocks
from znni.engine.io.ledger import read_ledger
from znni.engine.io.lock import hold_output
from znni.engine.job import ProgressEvent, SegmentCancelled
from znni.engine.location import Location
from znni.engine.scheduler import Scheduler
from znni.engine.sweep.run import SweepResult, start_ledger, sweep

# Dask workers cannot import this module by name: its classes travel with the stage
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHAPE, CHUNKS, BLOCK = (12, 14, 16), (4, 7, 8), (4, 7, 8)  # 3 x 2 x 2 = 12 blocks
LEVEL = 0.5
CTX = StoreContext()


class ThresholdStage:
    """Voxels of `source` above `level` -> 1 in `target`, else 0; each computed block's key
    appended to `log` (from any process), so a test sees what a run computed."""

    def __init__(self, source: str, target: str, level: float, log: str) -> None:
        self.source, self.target, self.level, self.log = source, target, level, log

    def make_worker(self) -> ThresholdWork:
        return ThresholdWork(self)


class ThresholdWork:
    """One process's arrays for a `ThresholdStage`."""

    def __init__(self, spec: ThresholdStage) -> None:
        self.spec = spec
        self.source = zarr.open_array(spec.source, mode="r")
        self.target = zarr.open_array(spec.target, mode="r+")

    def read(self, block: Block) -> np.ndarray:
        return np.asarray(self.source[block.write.slices()])

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        with open(self.spec.log, "a") as f:  # one short O_APPEND write per block
            f.write(f"{os.getpid()} {block.key}\n")
        return (raw > self.spec.level).astype(np.uint8)

    def write(self, block: Block, values: np.ndarray) -> None:
        self.target[block.write.slices()] = values


def blocks() -> list[Block]:
    none = (0, 0, 0)
    return split_blocks(Box((0, 0, 0), SHAPE), BLOCK, CHUNKS, Halo(none, none), (1, 1, 1))


def computed(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


def run(stage: ThresholdStage, *, scheduler: str | None = None,
        stop_after: int | None = None, pause_s: float = 0.0) -> SweepResult:
    """One sweep of the stage as `segment` runs one: the output's lock held, its ledger
    resumed when it belongs to this stage, started otherwise; stopped (cancelled) once
    `stop_after` blocks are recorded (the progress callback first pausing `pause_s`)."""
    out = Location.parse(stage.target)
    parts = {"stage": "threshold", "source": stage.source, "level": stage.level}
    header, done = read_ledger(out, ctx=CTX)
    resume = header is not None and header["parts"] == parts
    lock = hold_output(out, ctx=CTX)
    ledger = start_ledger(out, ctx=CTX, parts=parts, block_shape=BLOCK, resume=resume)
    cancel = threading.Event()

    def progress(event: ProgressEvent) -> None:
        if stop_after is not None and event.blocks_done >= stop_after:
            time.sleep(pause_s)
            cancel.set()

    return sweep(stage, blocks(), ledger=ledger, done=frozenset(done if resume else ()),
                 lock=lock, scheduler=Scheduler.of(scheduler), cancel=cancel,
                 progress=progress)


def make_stage(tmp_path: Path, name: str, volume: np.ndarray) -> ThresholdStage:
    source = tmp_path / "in.zarr"
    if not source.exists():
        zarr.create_array(str(source), shape=SHAPE, chunks=CHUNKS, dtype="float32")[...] = volume
    zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=SHAPE, chunks=CHUNKS, dtype="uint8",
                      fill_value=0)
    return ThresholdStage(str(source), str(tmp_path / f"{name}.zarr"), LEVEL,
                          str(tmp_path / f"{name}.log"))


def interrupted_then_resumed(tmp_path: Path, scheduler: str | None) -> None:
    volume = np.random.default_rng(5).random(SHAPE, dtype=np.float32)
    one_shot = make_stage(tmp_path, "one-shot", volume)
    whole = run(one_shot)
    keys = {b.key for b in blocks()}
    assert (whole.blocks_total, whole.blocks_computed) == (12, 12)
    assert sorted(computed(Path(one_shot.log))) == sorted(keys)  # each block once
    expected = zarr.open_array(one_shot.target)[...]
    assert np.array_equal(expected, (volume > LEVEL).astype(np.uint8))

    stage = make_stage(tmp_path, "resumed", volume)
    with pytest.raises(SegmentCancelled) as stopped:
        run(stage, scheduler=scheduler, stop_after=3)
    recorded = read_ledger(Location.parse(stage.target), ctx=CTX)[1]
    assert stopped.value.done == (len(recorded), 12)  # type: ignore[attr-defined]
    assert 3 <= len(recorded) < 12
    first = computed(Path(stage.log))
    assert recorded <= set(first)  # recorded only after its write
    Path(stage.log).unlink()
    rest = run(stage, scheduler=scheduler)  # the lock was released at the stop
    assert sorted(computed(Path(stage.log))) == sorted(keys - recorded)  # only the rest
    assert (rest.blocks_total, rest.blocks_todo) == (12, 12 - len(recorded))
    assert read_ledger(Location.parse(stage.target), ctx=CTX)[1] == keys
    assert np.array_equal(zarr.open_array(stage.target)[...], expected)


def test_a_threshold_stage_resumes_locally(tmp_path: Path) -> None:
    interrupted_then_resumed(tmp_path, None)


@pytest.mark.slow
def test_a_threshold_stage_resumes_on_a_dask_cluster(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    interrupted_then_resumed(tmp_path, "local:2")


def test_a_finished_output_sweeps_nothing(tmp_path: Path) -> None:
    stage = make_stage(tmp_path, "done", np.ones(SHAPE, np.float32))
    run(stage)
    Path(stage.log).unlink()
    again = run(stage)
    assert (again.blocks_total, again.blocks_todo, again.voxels_this_run) == (12, 0, 0)
    assert computed(Path(stage.log)) == []
    assert np.asarray(zarr.open_array(stage.target)[...]).all()


@pytest.mark.slow
def test_a_cancel_stops_at_the_next_block_when_the_rest_finished_together(
        tmp_path: Path) -> None:
    """The client is slow to record the first block (its progress callback pauses 3 s), so
    every other block has finished when the cancel comes and the next look finds them all
    at once: the run stops at the next of them, not after recording them all."""
    pytest.importorskip("distributed")
    volume = np.random.default_rng(6).random(SHAPE, dtype=np.float32)
    stage = make_stage(tmp_path, "paused", volume)
    with pytest.raises(SegmentCancelled):
        run(stage, scheduler="local:2", stop_after=1, pause_s=3.0)
    recorded = read_ledger(Location.parse(stage.target), ctx=CTX)[1]
    assert 1 <= len(recorded) <= 2  # the blocks computed meanwhile are not recorded
