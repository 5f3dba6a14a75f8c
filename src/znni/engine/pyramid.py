"""The output's multiscale pyramid, built block by block as finished blocks land.

Levels: level k halves, from level k-1, every axis whose voxel size is less than twice
the finest voxel size among the axes that can still be halved (so a z much coarser
than y, x is kept until y, x catch up; an isotropic volume halves all three). The
default depth is the fewest levels whose largest axis is <= 256 voxels. A level-k
voxel is the mean of its (up to) 2x2x2 level-(k-1) voxels, partial windows at the
far faces averaging the voxels that exist; uint8 levels are rounded.

Updates (docs/design.md, "Volumes"): when a block's level 0 has been written, the
pyramid over its footprint F (the block grown to the deepest level's factor) is
computed from level 0 read back over F, once every block of the run that meets F
has landed, and only then is the block recorded in the ledger. Reads therefore only
touch level-0 chunks that no one is writing, every pyramid write is made from
finished data by one thread (so chunks shared by several blocks' updates lose no
update), and a killed run's unrecorded blocks are recomputed with their levels.
"""

from __future__ import annotations

import bisect
import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from znni.engine.geometry import Block, Box, Triple

COARSEST = 256  # default depth: the coarsest level's largest axis is at most this
Factors = list[Triple]  # per level 1..K: the factor (1 or 2 per axis) from the level before


def level_steps(shape: Triple, voxel: tuple[float, float, float], levels: int | None) -> Factors:
    """Per-level halving factors for `levels` levels (None: the default depth)."""
    if levels is not None and levels < 0:
        raise ValueError(f"--pyramid {levels} must be 0 or more levels")
    extent, size, steps = list(shape), [abs(v) or 1.0 for v in voxel], []
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
    lo = tuple(w // f * f for w, f in zip(write.lo, factor, strict=True))
    hi = tuple(min(n, -(-w // f) * f) for w, f, n in zip(write.hi, factor, shape, strict=True))
    return Box(lo, hi)  # type: ignore[arg-type]


def update_levels(level0: Any, levels: Sequence[Any], steps: Factors, box: Box,
                  write: Box, shape: Triple, dtype: str) -> None:
    """Recompute levels 1..K over the voxels that `write` touches, from level 0 over `box`
    (the footprint of `write`, read back here)."""
    values = np.asarray(level0[(slice(None), *box.slices())])
    factors = cumulative(steps)
    for k, (array, step) in enumerate(zip(levels, steps, strict=True), start=1):
        values = downsample(values, step, dtype)
        f = factors[k]
        base = tuple(b // fi for b, fi in zip(box.lo, f, strict=True))
        lo = tuple(w // fi for w, fi in zip(write.lo, f, strict=True))
        hi = tuple(-(-w // fi) for w, fi in zip(write.hi, f, strict=True))
        local = tuple(slice(a - b, c - b) for a, c, b in zip(lo, hi, base, strict=True))
        array[(slice(None), *(slice(a, c) for a, c in zip(lo, hi, strict=True)))] = values[
            (slice(None), *local)
        ]


class PyramidBuilder:
    """Takes landed blocks (`land`), updates their pyramid footprints in one background
    thread once every block meeting the footprint has landed, then calls `record`."""

    def __init__(self, level0: Any, levels: Sequence[Any], steps: Factors, shape: Triple,
                 dtype: str, blocks: Sequence[Block], done: frozenset[str],
                 record: Callable[[Block], None]) -> None:
        self.level0, self.levels, self.steps = level0, list(levels), steps
        self.shape, self.dtype, self.record = shape, dtype, record
        self.factor = cumulative(steps)[-1]
        self.by_lo = {b.write.lo: b for b in blocks}
        self.starts = [sorted({b.write.lo[i] for b in blocks}) for i in range(3)]
        self.landed: set[str] = set(done)
        self.waiting: dict[str, set[str]] = {}  # block -> contributors not landed yet
        self.waiters: dict[str, list[Block]] = {}  # contributor -> blocks waiting on it
        self.error: BaseException | None = None
        self.queue: queue.Queue[Block | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="znni-pyramid", daemon=True)
        self.thread.start()

    def land(self, block: Block) -> None:
        """A block's level 0 is written (called from the sweep); raises an earlier failure."""
        if self.error is not None:
            raise self.error
        self.queue.put(block)

    def close(self) -> None:
        """Finish the updates of every landed block whose footprint is complete."""
        self.queue.put(None)
        self.thread.join()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _contributors(self, block: Block) -> set[str]:
        box = footprint(block.write, self.factor, self.shape)
        axes = []
        for i in range(3):
            s = self.starts[i]
            first = max(0, bisect.bisect_right(s, box.lo[i]) - 1)
            axes.append([v for v in s[first:bisect.bisect_left(s, box.hi[i])]])
        found = (self.by_lo.get(lo) for lo in itertools.product(*axes))
        return {b.key for b in found if b is not None and b.write.intersect(box) is not None}

    def _loop(self) -> None:
        while (block := self.queue.get()) is not None:
            if self.error is not None:
                continue
            try:
                self._landed(block)
            except BaseException as e:  # surfaced on the next land() or check()
                self.error = e

    def _landed(self, block: Block) -> None:
        self.landed.add(block.key)
        ready = []
        missing = self._contributors(block) - self.landed
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
            box = footprint(b.write, self.factor, self.shape)
            update_levels(self.level0, self.levels, self.steps, box, b.write, self.shape,
                          self.dtype)
            self.record(b)
