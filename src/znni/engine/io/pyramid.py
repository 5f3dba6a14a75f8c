"""The output's multiscale pyramid, built block by block as finished blocks land.

Levels: level k halves, from level k-1, every axis whose voxel size is less than twice
the finest voxel size among the axes that can still be halved (so a z much coarser
than y, x is kept until y, x catch up; an isotropic volume halves all three). The
default depth is the fewest levels whose largest axis is <= 256 voxels. A level-k
voxel is the mean of its (up to) 2x2x2 level-(k-1) voxels, partial windows at the
far faces averaging the voxels that exist; uint8 levels are rounded.

Updates (docs/design.md, "Volumes"): when a block's level 0 has been written, the
pyramid over its footprint F (the block grown to the deepest level's factor) is
computed once every block of the run that meets F has landed: from level 0 read back
over F, or, when F is the block's own write box and the sweep handed over the values
it wrote (local runs), from those values, which are exactly what level 0 holds there.
The levels go into the coarse chunks they touch, kept in memory (`level_writer.py`);
a chunk is written whole once no other block of the run will change it, or once it
has waited FLUSH_S, or to bound memory. A block is recorded in the ledger only after
every chunk it changed has been written. Reads therefore only touch level-0 chunks
that no one is writing, every pyramid write is made from finished data by one thread
(so chunks shared by several blocks' updates lose no update), and a killed run's
unrecorded blocks are recomputed with their levels.

Why chunks wait: the design's coarse chunks are level 0's, clipped, so a level-k
chunk is shared by up to 8^k blocks; written at every block's update it would be read,
decoded, encoded and written once per block (7-9 ms of CPU per 1.5 MB chunk).
"""

from __future__ import annotations

import bisect
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from znni.engine.geometry import Block, Box, Triple
from znni.engine.io.faults import write_fault
from znni.engine.io.level_writer import KEPT_BYTES, ChunkKey, LevelWriter
from znni.engine.io.retry import StoreError
from znni.engine.location import Location
from znni.triple import as_triple

COARSEST = 256  # default depth: the coarsest level's largest axis is at most this
# landed blocks whose levels, made from their values in memory, may wait for the pyramid
# thread at once; behind that, blocks are read back later instead (bounded memory)
HELD_BLOCKS = 4
# a dirty coarse chunk is written at the latest this long after its first unwritten update,
# so a block's ledger record (and its progress event) waits about this long at most for its
# levels, and a SIGKILL loses about this much more work than the blocks in flight. Each
# such write encodes a whole chunk (about 5 ms for 3x64^3 float32): with the handful of
# chunks a sweep has dirty at a time, 2 s keeps this under about 2% of one core
FLUSH_S = 2.0
FLUSH_ENV = "ZNNI_PYRAMID_FLUSH_S"  # overrides FLUSH_S (0: write at every update)
Factors = list[Triple]  # per level 1..K: the factor (1 or 2 per axis) from the level before


def flush_seconds() -> float:
    """How long a dirty coarse chunk may wait: $ZNNI_PYRAMID_FLUSH_S when set, else FLUSH_S
    (looked up per run, so tests and operators can shorten it)."""
    text = os.environ.get(FLUSH_ENV, "").strip()
    if not text:
        return FLUSH_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise ValueError(f"{FLUSH_ENV}={text!r} is not a number of seconds >= 0")
    return value


def level_steps(shape: Triple, voxel: tuple[float, float, float], levels: int | None) -> Factors:
    """Per-level halving factors for `levels` levels (None: the default depth)."""
    if levels is not None and levels < 0:
        raise ValueError(f"--pyramid {levels} must be 0 or more levels")
    extent, size = list(shape), [abs(v) or 1.0 for v in voxel]
    steps: Factors = []
    while (len(steps) < levels) if levels is not None else max(extent) > COARSEST:
        can = [i for i in range(3) if extent[i] > 1]
        if not can:
            raise ValueError(
                f"--pyramid {levels} asks for more levels than a volume of shape {shape} has"
            )
        finest = min(size[i] for i in can)
        step = tuple(2 if i in can and size[i] < 2 * finest else 1 for i in range(3))
        for i in range(3):
            extent[i], size[i] = -(-extent[i] // step[i]), size[i] * step[i]
        steps.append((step[0], step[1], step[2]))
    return steps


def cumulative(steps: Factors) -> Factors:
    """Level k's factor from level 0, for k = 0..K."""
    out: Factors = [(1, 1, 1)]
    for s in steps:
        p = out[-1]
        out.append((p[0] * s[0], p[1] * s[1], p[2] * s[2]))
    return out


def level_shapes(shape: Triple, steps: Factors) -> list[Triple]:
    """Spatial shapes of levels 0..K."""
    return [(-(-shape[0] // f[0]), -(-shape[1] // f[1]), -(-shape[2] // f[2]))
            for f in cumulative(steps)]


def downsample(values: np.ndarray, step: Triple, dtype: str) -> np.ndarray:
    """Mean over windows of `step` of (C, Z, Y, X) values, partial windows at the far end."""
    out = values.astype(np.float32, copy=False)
    for axis, s in zip((1, 2, 3), step, strict=True):
        if s == 1:
            continue
        n = out.shape[axis]
        halved = list(out.shape)
        halved[axis] = -(-n // 2)
        result = np.empty(halved, np.float32)

        def part(a: int, b: int, step: int = 1, ax: int = axis) -> tuple[slice, ...]:
            index = [slice(None)] * 4
            index[ax] = slice(a, b, step)
            return tuple(index)

        pairs = part(0, n // 2)  # strided views: no gathered copies of the input
        np.add(out[part(0, n - 1, 2)], out[part(1, n, 2)], out=result[pairs])
        result[pairs] *= np.float32(0.5)
        if n % 2:  # a partial window at the far face: the one voxel there
            result[part(n // 2, n // 2 + 1)] = out[part(n - 1, n)]
        out = result
    if dtype == "uint8":
        return np.rint(out).astype(np.uint8)
    return out.astype(dtype, copy=False)


def footprint(write: Box, factor: Triple, shape: Triple) -> Box:
    """The level-0 box whose deepest-level voxels cover `write`: grown to `factor`."""
    lo = as_triple(w // f * f for w, f in zip(write.lo, factor, strict=True))
    hi = as_triple(min(n, -(-w // f) * f) for w, f, n in zip(write.hi, factor, shape,
                                                            strict=True))
    return Box(lo, hi)


def coarse_levels(values: np.ndarray, steps: Factors, dtype: str,
                  labels: bool = False) -> list[np.ndarray]:
    """Levels 1..K over a footprint from its level-0 (C, Z, Y, X) values, each made from the
    level before as stored (uint8 levels are rounded before the next is made). `labels`:
    nearest (the first voxel of each window: a footprint starts on the deepest factor's
    grid), never a mean, so every coarse voxel holds a label that exists at level 0."""
    out = []
    for step in steps:
        if labels:
            values = np.ascontiguousarray(values[:, ::step[0], ::step[1], ::step[2]])
        else:
            values = downsample(values, step, dtype)
        out.append(values)
    return out


def level_box(box: Box, write: Box, factor: Triple) -> tuple[Triple, Triple, tuple[slice, ...]]:
    """(lo, hi) of the level voxels (at cumulative `factor`) that `write` touches, and their
    index in that level's values over the footprint `box`."""
    base = tuple(b // f for b, f in zip(box.lo, factor, strict=True))
    lo = as_triple(w // f for w, f in zip(write.lo, factor, strict=True))
    hi = as_triple(-(-w // f) for w, f in zip(write.hi, factor, strict=True))
    local = tuple(slice(a - b, c - b) for a, c, b in zip(lo, hi, base, strict=True))
    return lo, hi, (slice(None), *local)



class PyramidBuilder:
    """Takes landed blocks (`land`). In one background thread, once every block meeting a
    block's footprint has landed, it updates the coarse chunks the block's levels touch
    (in memory, `LevelWriter`) and writes them whole: at once when no other block of the
    run will change them, else once they have waited `flush_s`, or to stay within
    `kept_bytes`, or at `close`. A block is recorded once every chunk it changed is
    written."""

    def __init__(self, level0: Any, levels: Sequence[Any], steps: Factors, shape: Triple,
                 dtype: str, blocks: Sequence[Block], done: frozenset[str],
                 record: Callable[[Block], None], flush_s: float | None = None,
                 kept_bytes: int = KEPT_BYTES, labels: bool = False) -> None:
        self.level0, self.writer, self.steps = level0, LevelWriter(levels, kept_bytes), steps
        self.labels = labels  # --labels: levels by nearest, not mean (coarse_levels)
        self.shape, self.dtype, self.record = shape, dtype, record
        self.flush_s = flush_seconds() if flush_s is None else flush_s
        self.factors = cumulative(steps)
        self.factor = self.factors[-1]
        self.by_lo = {b.write.lo: b for b in blocks}
        self.starts = [sorted({b.write.lo[i] for b in blocks}) for i in range(3)]
        self.done, self.landed = done, set(done)
        self.waiting: dict[str, set[str]] = {}  # block -> contributors not landed yet
        self.waiters: dict[str, list[Block]] = {}  # contributor -> blocks waiting on it
        self.left: dict[ChunkKey, int] = {}  # chunk -> updates of this run still to come
        self.unwritten: dict[str, set[ChunkKey]] = {}  # block -> its changed chunks not written
        self.blocked: dict[ChunkKey, list[Block]] = {}  # dirty chunk -> blocks awaiting it
        self.error: BaseException | None = None
        self.queue: queue.Queue[tuple[Block, list[np.ndarray] | None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="znni-pyramid", daemon=True)
        self.thread.start()

    def land(self, block: Block, values: np.ndarray | None = None) -> None:
        """A block's level 0 is written (called from the sweep, with the (C, *write.shape)
        values it wrote when it has them: local runs); raises an earlier failure.

        When the block's footprint is its own write box, those values are level 0 over
        the whole footprint, final and exactly as stored, so its levels are made from
        them here and the pyramid thread need not read level 0 back. Other blocks (and
        Dask's, whose values stay on the workers) are read back once their footprint is
        complete. Only a short backlog holds levels in memory (HELD_BLOCKS)."""
        if self.error is not None:
            raise self.error
        coarse = None
        if (values is not None and values.shape[1:] == block.write.shape
                and self.queue.qsize() < HELD_BLOCKS
                and footprint(block.write, self.factor, self.shape) == block.write):
            coarse = coarse_levels(np.asarray(values, dtype=self.dtype), self.steps, self.dtype,
                                   self.labels)
        self.queue.put((block, coarse))

    def close(self) -> None:
        """Finish the updates of every landed block whose footprint is complete, write every
        chunk they changed and record them."""
        self.queue.put(None)
        self.thread.join()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _meeting(self, box: Box) -> set[str]:
        """Keys of the blocks whose write box meets `box`."""
        axes = []
        for i in range(3):
            s = self.starts[i]
            first = max(0, bisect.bisect_right(s, box.lo[i]) - 1)
            axes.append([v for v in s[first:bisect.bisect_left(s, box.hi[i])]])
        found = (self.by_lo.get((lo[0], lo[1], lo[2])) for lo in itertools.product(*axes))
        return {b.key for b in found if b is not None and b.write.intersect(box) is not None}

    def _loop(self) -> None:
        while True:
            landed = True
            try:
                item = self.queue.get(timeout=self._due())
            except queue.Empty:
                item, landed = None, False  # no block landed, but the oldest dirty chunk is due
            if landed and item is None:
                break
            if self.error is not None:
                continue
            try:
                if item is not None:
                    self._landed(*item)
                if self.writer.dirty and (self._due() == 0.0 or self.writer.over()):
                    self._write(list(self.writer.dirty))
                    self.writer.over()
            except BaseException as e:  # surfaced on the next land() or check()
                self.error = self._named(e)
        if self.error is None:
            try:
                self._write(list(self.writer.dirty))
            except BaseException as e:
                self.error = self._named(e)

    def _named(self, e: BaseException) -> BaseException:
        """A full disk or a refusal writing the levels as a `VolumeFault` naming them."""
        if isinstance(e, OSError | StoreError):
            where = str(getattr(self.level0, "store_path", "the output")).removeprefix("file://")
            return write_fault(e, Location.parse(where.rsplit("/", 1)[0]), "chunks",
                               "pyramid level")
        return e

    def _due(self) -> float | None:
        """Seconds until the oldest dirty chunk should be written (None: none is dirty)."""
        if self.error is not None or not self.writer.dirty:
            return None
        oldest = next(iter(self.writer.dirty.values()))  # first dirtied first
        return max(0.0, oldest + self.flush_s - time.monotonic())

    def _landed(self, block: Block, coarse: list[np.ndarray] | None) -> None:
        """Update every block whose footprint this landing completes; `coarse`: the block's
        own levels when `land` could make them from its values."""
        self.landed.add(block.key)
        ready = []
        missing = self._meeting(footprint(block.write, self.factor, self.shape)) - self.landed
        if missing:
            self.waiting[block.key] = missing
            for key in missing:
                self.waiters.setdefault(key, []).append(block)
        else:
            ready.append(block)
        for other in self.waiters.pop(block.key, []):
            left = self.waiting[other.key]
            left.discard(block.key)
            if not left:
                del self.waiting[other.key]
                ready.append(other)
        for b in ready:
            self._update(b, coarse if b is block else None)

    def _update(self, block: Block, coarse: list[np.ndarray] | None) -> None:
        """Put the block's levels (made from level 0 read back over its footprint unless
        given) into the chunks they touch; write the chunks no later update will change."""
        box = footprint(block.write, self.factor, self.shape)
        if coarse is None:
            values = np.asarray(self.level0[(slice(None), *box.slices())])  # (C, *box.shape)
            coarse = coarse_levels(values, self.steps, self.dtype, self.labels)
        changed: list[ChunkKey] = []
        for k, values in enumerate(coarse, start=1):
            lo, hi, local = level_box(box, block.write, self.factors[k])
            changed += self.writer.update(k - 1, lo, hi, values[local])
        if not changed:  # nothing to write (an empty write box)
            self.record(block)
            return
        self.unwritten[block.key] = set(changed)
        for key in changed:
            self.blocked.setdefault(key, []).append(block)
        complete = [key for key in changed if self._count_down(key) <= 0]
        self._write(complete)
        for key in complete:
            self.writer.drop(key)

    def _count_down(self, key: ChunkKey) -> int:
        """Updates of this run still to come to chunk `key`, after this one."""
        if key not in self.left:
            lo, hi = self.writer.chunk_box(key)
            f = self.factors[key[0] + 1]
            box = Box(as_triple(a * fi for a, fi in zip(lo, f, strict=True)),
                      as_triple(min(n, b * fi) for b, fi, n in zip(hi, f, self.shape, strict=True)))
            self.left[key] = len(self._meeting(box) - self.done)
        self.left[key] -= 1
        return self.left[key] if self.left[key] > 0 else self.left.pop(key)

    def _write(self, keys: Sequence[ChunkKey]) -> None:
        """Write these dirty chunks and record the blocks that waited only on them."""
        self.writer.write(keys)
        for key in keys:
            for b in self.blocked.pop(key, []):
                left = self.unwritten[b.key]
                left.discard(key)
                if not left:
                    del self.unwritten[b.key]
                    self.record(b)
