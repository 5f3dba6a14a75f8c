"""Decoded input chunks kept between blocks, in an LRU bounded in bytes.

Neighbouring blocks read overlapping boxes (each block's halo reaches into its
neighbours' chunks), so without a cache every chunk is fetched and decoded by
every block whose read box meets it: 144 GETs of 32 distinct chunks for 8 blocks
of 32x64x64 with a 24-voxel halo over 32^3 chunks. `ChunkedReader.read` reads a box
through the cache: it fetches only the chunks it lacks, chunk-aligned and in as
few zarr calls as boxes cover them (each call fetches its chunks concurrently),
keeps them decoded, and assembles the box from them.

zarr 3.1 has `zarr.experimental.cache_store.CacheStore`, but it keeps encoded bytes
(every hit still runs zarr's indexing, codec pipeline and event loop per chunk, the
client CPU that competes with compute) and is marked experimental; this keeps the
decoded arrays. A chunk holds every channel of its (z, y, x) chunk; edge chunks are
clipped to the array. The cache is thread-safe; two threads that miss the same
chunk both fetch it (the values are equal), neither waits on the other's I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from znni.engine.geometry import Box, Triple
from znni.engine.io.faults import BadChunks, chunk_key, read_fault
from znni.engine.io.retry import StoreError
from znni.engine.location import Location
from znni.lru import BytesLRU
from znni.triple import as_triple

Index = tuple[int, int, int]  # a chunk's position in the (z, y, x) chunk grid


# decoded chunks under (array name, chunk index) keys
ChunkCache = BytesLRU


class ChunkedReader:
    """Reads (C, Z, Y, X) boxes of a 3D (z, y, x) or 4D (c, z, y, x) zarr array through
    a `ChunkCache`, under keys (`name`, chunk index)."""

    def __init__(self, array: Any, has_channel_axis: bool, cache: ChunkCache,
                 name: Location, bad: BadChunks | None = None) -> None:
        self.array, self.has_channel_axis = array, has_channel_axis
        self.cache, self.name = cache, name
        self.bad = bad if bad is not None else BadChunks()
        self.shape: Triple = as_triple(array.shape[-3:])
        self.chunks: Triple = as_triple(array.chunks[-3:])
        self.channels = int(array.shape[0]) if has_channel_axis else 1
        self.dtype = np.dtype(array.dtype)

    def read(self, box: Box) -> np.ndarray:
        """Raw (C, *box.shape) values of a box inside the array."""
        if not Box.from_shape(self.shape).contains(box):
            raise ValueError(f"box lo={box.lo} hi={box.hi} is not inside {self.shape}")
        out = np.empty((self.channels, *box.shape), self.dtype)
        if box.size == 0:
            return out
        ranges = [range(lo // c, -(-hi // c)) for lo, hi, c in
                  zip(box.lo, box.hi, self.chunks, strict=True)]
        found: dict[Index, np.ndarray] = {}
        missing: set[Index] = set()
        for idx in chunk_grid(ranges):
            arr = self.cache.get((self.name, idx))
            if arr is None:
                missing.add(idx)
            else:
                found[idx] = arr
        for lo, hi in cover(missing):
            found.update(self._fetch(lo, hi))
        for idx, arr in found.items():
            chunk = self.chunk_box(idx)
            inside = chunk.intersect(box)
            assert inside is not None
            src = arr[(slice(None), *inside.slices(chunk.lo))]
            out[(slice(None), *inside.slices(box.lo))] = src
        return out

    def chunk_box(self, idx: Index) -> Box:
        """The voxels of chunk `idx`, clipped to the array."""
        lo = as_triple(i * c for i, c in zip(idx, self.chunks, strict=True))
        hi = as_triple(min(a + c, n) for a, c, n in zip(lo, self.chunks, self.shape, strict=True))
        return Box(lo, hi)

    def _fetch(self, lo: Index, hi: Index) -> dict[Index, np.ndarray]:
        """Chunks [lo, hi) of the grid in one zarr call, each kept in the cache."""
        last = (hi[0] - 1, hi[1] - 1, hi[2] - 1)
        span = Box(self.chunk_box(lo).lo, self.chunk_box(last).hi)
        try:
            data = self._read_span(span)
        except StoreError as e:  # retried already: name the span's chunks, not each again
            keys = f"{chunk_key(self.array, lo)} to {chunk_key(self.array, last)}"
            raise read_fault(e, self.name, keys, self.array) from e
        except Exception:  # noqa: BLE001 - find which chunk failed, and why
            data = self._read_by_chunk(span, lo, hi)
        got: dict[Index, np.ndarray] = {}
        for idx in chunk_grid([range(a, b) for a, b in zip(lo, hi, strict=True)]):
            chunk = self.chunk_box(idx)
            # a copy: a view would keep the whole fetched span alive, unaccounted
            arr = np.ascontiguousarray(data[(slice(None), *chunk.slices(span.lo))])
            self.cache.put((self.name, idx), arr)
            got[idx] = arr
        return got

    def _read_span(self, span: Box, channels: slice = slice(None)) -> np.ndarray:
        if self.has_channel_axis:
            return np.asarray(self.array[(channels, *span.slices())])
        return np.asarray(self.array[span.slices()])[None]

    def _read_by_chunk(self, span: Box, lo: Index, hi: Index) -> np.ndarray:
        """The span read chunk by chunk after a failed read of all of it: a chunk that does
        not decode raises its `VolumeFault`, or under the 'fill' policy becomes the array's
        fill value and is listed in `self.bad`."""
        data = np.empty((self.channels, *span.shape), self.dtype)
        step = int(self.array.chunks[0]) if self.has_channel_axis else self.channels
        for idx in chunk_grid([range(a, b) for a, b in zip(lo, hi, strict=True)]):
            chunk = self.chunk_box(idx)
            for c in range(0, self.channels, step):  # a 4D array's channel chunks
                where = (slice(c, c + step), *chunk.slices(span.lo))
                try:
                    data[where] = self._read_span(chunk, slice(c, c + step))
                except Exception as e:  # noqa: BLE001 - classified: VolumeFault or filled
                    grid = (c // step, *idx) if self.has_channel_axis else idx
                    self._bad_chunk(e, grid, data, where)
        return data

    def _bad_chunk(self, e: Exception, grid: tuple[int, ...], data: np.ndarray,
                   where: tuple[slice, ...]) -> None:
        """Raise the fault of the chunk at `grid`, or fill its part of `data` ('fill')."""
        fault = read_fault(e, self.name, chunk_key(self.array, grid), self.array)
        if fault.kind != "corrupt" or self.bad.policy != "fill":
            raise fault from e
        fill = getattr(self.array, "fill_value", None)
        data[where] = fill if fill is not None else 0
        self.bad.add(fault.key)


def cover(indices: Iterable[Index]) -> list[tuple[Index, Index]]:
    """Boxes [lo, hi) of the chunk grid that together hold exactly `indices`: greedy, each
    grown along x, then y, then z while every index it would add is in the set and not
    yet covered (a slab of new chunks, the usual case, is one box)."""
    left = set(indices)
    boxes: list[tuple[Index, Index]] = []
    for start in sorted(left):
        if start not in left:
            continue
        hi = [start[0] + 1, start[1] + 1, start[2] + 1]
        for axis in (2, 1, 0):
            while _slab(start, hi, axis) <= left:
                hi[axis] += 1
        box_hi: Index = (hi[0], hi[1], hi[2])
        left -= set(itertools.product(*(range(a, b) for a, b in zip(start, box_hi, strict=True))))
        boxes.append((start, box_hi))
    return boxes


def _slab(lo: Index, hi: list[int], axis: int) -> set[Index]:
    """The indices a box [lo, hi) would add if grown by one along `axis`."""
    ranges = [range(a, b) for a, b in zip(lo, hi, strict=True)]
    ranges[axis] = range(hi[axis], hi[axis] + 1)
    return set(chunk_grid(ranges))


def chunk_grid(ranges: Sequence[range]) -> Iterator[Index]:
    """The (z, y, x) chunk indices of three index ranges, in C order."""
    for z, y, x in itertools.product(*ranges):  # noqa: UP028 - typed as (z, y, x) triples
        yield (z, y, x)
