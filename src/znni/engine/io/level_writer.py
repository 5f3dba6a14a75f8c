"""The pyramid's coarse-level chunks, kept decoded in memory and written whole.

Coarse chunks are shared: with the design's chunks (level 0's, clipped to each level),
a level-k chunk holds the level-k voxels of up to 8^k blocks, and each block's update
changes only its part. Written straight through zarr, every such update is a
read-modify-write of the whole chunk: read and decode it, patch it, encode and write
it (for a 3x32x64x64 float32 chunk of network output 7-9 ms of CPU). Here an
update patches the chunk in memory (`update`; a chunk not held yet is read once) and
marks it dirty; the pyramid builder decides when dirty chunks are written (`write`),
whole, so zarr encodes without reading and a chunk that several blocks change in a
row is encoded once for all of them.

Why it is exact: during a run only the pyramid thread writes coarse levels (Dask
workers write level 0 only), so a clean chunk held here is what the store holds, and
a chunk not held is read from the store, as zarr would. Held chunks are bounded in
bytes (`KEPT_BYTES`): the least recently updated clean ones are dropped first; the
builder writes dirty ones when the bound is passed (`over`).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from znni.engine.geometry import Triple
from znni.triple import as_triple

KEPT_BYTES = 64 * 2**20  # decoded coarse chunks held; a 64^3 x 3 float32 chunk is 3 MiB
ChunkKey = tuple[int, Triple]  # (level index in the writer's arrays, chunk index)


def _index(lo: Sequence[int], hi: Sequence[int], origin: Sequence[int]) -> tuple[slice, ...]:
    """(channels, z, y, x) index of the box [lo, hi) in an array whose voxel 0 is `origin`."""
    return (slice(None), *(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin, strict=True)))



class LevelWriter:
    """Chunks of (C, Z, Y, X) arrays (one chunk across channels), updated in memory and
    written whole."""

    def __init__(self, arrays: Sequence[Any], kept_bytes: int = KEPT_BYTES) -> None:
        # zarr's check for all-fill chunks takes about 2 of the 7 ms a 1.5 MB float32 chunk
        # write costs (it compares bit patterns through broadcast views); coarse chunks
        # written here are rarely all fill, and storing one that is reads back the same
        self.arrays = [a.with_config({"write_empty_chunks": True}) for a in arrays]
        self.chunks = [as_triple(a.chunks[1:]) for a in self.arrays]
        self.shapes = [as_triple(a.shape[1:]) for a in self.arrays]
        self.kept: OrderedDict[ChunkKey, np.ndarray] = OrderedDict()  # least recent first
        self.dirty: dict[ChunkKey, float] = {}  # chunk -> when it first differed from the store
        self.kept_bytes, self.bytes = kept_bytes, 0

    def chunk_box(self, key: ChunkKey) -> tuple[Triple, Triple]:
        """[lo, hi) of a chunk in its level's voxels (clipped at the level's far faces)."""
        k, index = key
        chunk, shape = self.chunks[k], self.shapes[k]
        lo = as_triple(i * c for i, c in zip(index, chunk, strict=True))
        return lo, as_triple(min(n, a + c) for a, c, n in zip(lo, chunk, shape, strict=True))

    def update(self, k: int, lo: Triple, hi: Triple, values: np.ndarray) -> list[ChunkKey]:
        """Set level k's voxels [lo, hi) to (C, *shape) `values` in memory; returns the chunks
        changed (now dirty)."""
        chunk = self.chunks[k]
        keys = [(k, as_triple(i)) for i in itertools.product(*(
            range(a // c, -(-b // c)) for a, b, c in zip(lo, hi, chunk, strict=True)))]
        self._load(k, [key for key in keys if key not in self.kept], lo, hi)
        now = time.monotonic()
        for key in keys:
            c_lo, c_hi = self.chunk_box(key)
            s_lo = as_triple(max(a, b) for a, b in zip(lo, c_lo, strict=True))
            s_hi = as_triple(min(a, b) for a, b in zip(hi, c_hi, strict=True))
            self.kept[key][_index(s_lo, s_hi, c_lo)] = values[_index(s_lo, s_hi, lo)]
            self.kept.move_to_end(key)
            self.dirty.setdefault(key, now)
        return keys

    def write(self, keys: Sequence[ChunkKey]) -> None:
        """Write these held chunks whole (zarr then encodes without reading); they are clean."""
        for key in keys:
            c_lo, c_hi = self.chunk_box(key)
            self.arrays[key[0]][_index(c_lo, c_hi, (0, 0, 0))] = self.kept[key]
            self.dirty.pop(key, None)

    def drop(self, key: ChunkKey) -> None:
        """Forget a clean chunk (no update of this run will touch it again)."""
        if key not in self.dirty and key in self.kept:
            self.bytes -= self.kept.pop(key).nbytes

    def over(self) -> bool:
        """Drop the least recently updated clean chunks beyond the bound; True when the
        dirty ones alone pass it (the builder should write them)."""
        if self.bytes <= self.kept_bytes:
            return False
        for key in [key for key in self.kept if key not in self.dirty]:
            if self.bytes <= self.kept_bytes:
                break
            self.drop(key)
        return self.bytes > self.kept_bytes

    def _load(self, k: int, missing: list[ChunkKey], lo: Triple, hi: Triple) -> None:
        """Hold the `missing` chunks of an update of [lo, hi): read in one call unless the
        update covers them whole."""
        if not missing:
            return
        array, boxes = self.arrays[k], [self.chunk_box(key) for key in missing]
        r_lo = as_triple(min(b[0][i] for b in boxes) for i in range(3))
        r_hi = as_triple(max(b[1][i] for b in boxes) for i in range(3))
        covered = all(a <= b for a, b in zip(lo, r_lo, strict=True)) and all(
            a >= b for a, b in zip(hi, r_hi, strict=True))
        read = None if covered else np.asarray(array[_index(r_lo, r_hi, (0, 0, 0))])
        for key, (c_lo, c_hi) in zip(missing, boxes, strict=True):
            shape = (array.shape[0], *(b - a for a, b in zip(c_lo, c_hi, strict=True)))
            part = np.empty(shape, array.dtype) if read is None else np.array(
                read[_index(c_lo, c_hi, r_lo)], dtype=array.dtype)
            self.kept[key] = part
            self.bytes += part.nbytes
