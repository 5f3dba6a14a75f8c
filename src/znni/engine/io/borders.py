"""Reading a box of a volume that may reach outside it, with the border mode of docs/design.md.

`reflect` is numpy's `reflect` of the WHOLE volume (no edge repeat, period
2(n-1), repeated for halos wider than the volume) done by index mapping, so
a block near the edge sees exactly what `np.pad(volume, ..., "reflect")`
would give; `zero` fills zeros outside. Only the voxels the box needs are read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from znni.engine.geometry import Box, Triple

# reads [lo, hi) of the source volume: (C, z, y, x) array for the given spatial box
Reader = Callable[[Box], np.ndarray]


def reflect_indices(start: int, stop: int, n: int) -> np.ndarray:
    """Source indices of positions [start, stop) under numpy 'reflect' of an axis of length n."""
    idx = np.arange(start, stop, dtype=np.int64)
    if n == 1:
        return np.zeros_like(idx)
    period = 2 * (n - 1)
    m = np.mod(idx, period)
    return np.where(m >= n, period - m, m)


def read_with_border(read: Reader, box: Box, shape: Triple, mode: str) -> np.ndarray:
    """(C, *box.shape) raw values of `box` over a volume of spatial `shape`."""
    volume = Box.from_shape(shape)
    if volume.contains(box):
        return read(box)
    if mode == "zero":
        return _read_zero(read, box, volume)
    if mode == "reflect":
        return _read_reflect(read, box, shape)
    raise ValueError(f"border mode {mode!r} is not one of 'reflect', 'zero'")


def _read_zero(read: Reader, box: Box, volume: Box) -> np.ndarray:
    inside = box.intersect(volume)
    if inside is None:
        probe = read(Box((0, 0, 0), (1, 1, 1)))
        return np.zeros((probe.shape[0], *box.shape), dtype=probe.dtype)
    data = read(inside)
    out = np.zeros((data.shape[0], *box.shape), dtype=data.dtype)  # (C, Z, Y, X)
    out[(slice(None), *inside.slices(box.lo))] = data
    return out


def _read_reflect(read: Reader, box: Box, shape: Triple) -> np.ndarray:
    maps = [reflect_indices(lo, hi, n) for lo, hi, n in zip(box.lo, box.hi, shape, strict=True)]
    src = Box(
        (int(maps[0].min()), int(maps[1].min()), int(maps[2].min())),
        (int(maps[0].max()) + 1, int(maps[1].max()) + 1, int(maps[2].max()) + 1),
    )
    data = read(src)  # (C, sz, sy, sx): the bounding box of every source index
    local = [m - o for m, o in zip(maps, src.lo, strict=True)]
    index: tuple[Any, ...] = (slice(None), *np.ix_(*local))
    return data[index]
