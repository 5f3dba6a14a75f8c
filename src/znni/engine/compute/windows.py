"""Sliding-window inference geometry and blending, equivalent to MONAI's.

Networks that are not window-independent (their output at a voxel depends on
where the window sits) cannot be run densely; their reference output is MONAI's
``sliding_window_inference``: windows of size W on a fixed scan grid over the
whole volume, each output weighted by an importance map and normalised by the
summed weights. This module reproduces that grid, the weights and the float32
arithmetic, but lets the engine evaluate any output box on its own: a box only
selects the windows that touch it, so the result does not depend on blocking.

All window starts are in the *padded* frame: MONAI zero-pads an axis on which
the volume is shorter than W symmetrically up to W (extra voxel after), and
crops the output back. Boxes are given in volume (unpadded) coordinates.
Pure numpy, no torch or MONAI import.
"""

from __future__ import annotations

import functools
import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from znni.triple import Triple, as_triple

BlendMode = Literal["gaussian", "constant"]
_MIN_WEIGHT = 1e-3  # MONAI's floor for the importance map (compute_importance_map)


def _triple(values: Sequence[int], name: str) -> Triple:
    """Validate a 3D shape-like argument, so errors name what was passed."""
    vals = tuple(values)
    if len(vals) != 3 or any(int(v) != v or v <= 0 for v in vals):
        raise ValueError(f"{name} must be three positive integers, got {values!r}")
    return as_triple(vals, name)


def scan_interval(size: int, window: int, overlap: float) -> int:
    """MONAI's per-axis stride: int(W * (1 - overlap)), at least 1; W when W fills the axis."""
    if window == size:
        return window
    return max(int(window * (1 - overlap)), 1)


def axis_starts(size: int, window: int, interval: int) -> tuple[int, ...]:
    """MONAI's starts on one (padded) axis: multiples of the stride until a window
    reaches the end, that last one clamped back to end at `size`. Strictly increasing."""
    starts: list[int] = []
    idx = 0
    while True:
        start = idx * interval
        if start + window >= size:
            starts.append(size - window)
            return tuple(starts)
        starts.append(start)
        idx += 1


@dataclass(frozen=True)
class WindowGrid:
    """MONAI's scan grid of windows over one whole volume (starts in the padded frame)."""

    volume_shape: Triple
    window: Triple
    overlap: float
    pad_before: Triple
    padded_shape: Triple
    starts: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]

    @classmethod
    def for_volume(
        cls, volume_shape: Sequence[int], window: Sequence[int], overlap: float
    ) -> WindowGrid:
        """Build the grid MONAI scans for this volume, window and (scalar) overlap."""
        vol = _triple(volume_shape, "volume_shape")
        win = _triple(window, "window")
        if isinstance(overlap, bool) or not 0.0 <= float(overlap) < 1.0:
            raise ValueError(f"overlap must be a float in [0, 1), got {overlap!r}")
        ov = float(overlap)
        padded = as_triple(max(v, w) for v, w in zip(vol, win, strict=True))
        pad_before = as_triple((p - v) // 2 for p, v in zip(padded, vol, strict=True))
        sz, sy, sx = (
            axis_starts(p, w, scan_interval(p, w, ov)) for p, w in zip(padded, win, strict=True)
        )
        return cls(vol, win, ov, pad_before, padded, (sz, sy, sx))

    @property
    def num_windows(self) -> int:
        z, y, x = (len(s) for s in self.starts)
        return z * y * x

    def all_windows(self) -> list[Triple]:
        """Every window start, in MONAI's order (z outermost, x innermost)."""
        sz, sy, sx = self.starts
        return list(itertools.product(sz, sy, sx))


def _check_box(grid: WindowGrid, box_lo: Sequence[int], box_hi: Sequence[int]) -> None:
    """Boxes must lie inside the volume: the padding is never part of the output."""
    lo, hi = tuple(box_lo), tuple(box_hi)
    if len(lo) != 3 or len(hi) != 3:
        raise ValueError(f"box must be 3D, got lo={lo} hi={hi}")
    for d in range(3):
        if not 0 <= lo[d] <= hi[d] <= grid.volume_shape[d]:
            raise ValueError(
                f"box lo={lo} hi={hi} is not inside volume of shape {grid.volume_shape}"
            )


def windows_touching(
    grid: WindowGrid, box_lo: Sequence[int], box_hi: Sequence[int]
) -> list[Triple]:
    """Starts (padded frame) of windows whose extent meets the volume box [lo, hi).

    Per axis a window [s, s+W) meets [a, b) (padded frame) iff a - W < s < b; the
    starts are sorted, so two bisections per axis suffice. Returned in MONAI's order,
    which `blend_box` relies on to reproduce MONAI's float32 sums exactly.
    """
    _check_box(grid, box_lo, box_hi)
    if any(h <= lo for lo, h in zip(box_lo, box_hi, strict=True)):
        return []
    per_axis = []
    for d in range(3):
        a = box_lo[d] + grid.pad_before[d]
        b = box_hi[d] + grid.pad_before[d]
        s = grid.starts[d]
        per_axis.append(s[bisect_right(s, a - grid.window[d]) : bisect_left(s, b)])
    pz, py, px = per_axis
    return list(itertools.product(pz, py, px))


def window_group(grid: WindowGrid, start: Triple, batch: int) -> tuple[Triple, ...]:
    """The up to `batch` windows run together with the window at `start`: consecutive in
    MONAI's scan order (a group may run on into the next row), groups counted from the
    first window. Fixed by the grid alone, so every block and every Dask worker runs a
    window in the same company, and the batched arithmetic (and so the result) does not
    depend on the blocks. Rows rather than whole groups within a row: BasicUNet's 3
    windows per row at 128^3 would run in pairs only two thirds of the time."""
    if batch < 1:
        raise ValueError(f"window batch must be at least 1, got {batch}")
    index = 0
    for axis in range(3):
        starts = grid.starts[axis]
        i = bisect_left(starts, start[axis])
        if i == len(starts) or starts[i] != start[axis]:
            raise ValueError(f"{start} is not a window start of the grid")
        index = index * len(starts) + i
    first = index // batch * batch
    counts = [len(s) for s in grid.starts]
    group = []
    for k in range(first, min(first + batch, grid.num_windows)):
        iz, rest = divmod(k, counts[1] * counts[2])
        iy, ix = divmod(rest, counts[2])
        group.append((grid.starts[0][iz], grid.starts[1][iy], grid.starts[2][ix]))
    return tuple(group)


@functools.lru_cache(maxsize=16)
def _importance_map_cached(window: Triple, mode: str, sigma_scale: float) -> np.ndarray:
    if mode == "constant":
        imp = np.ones(window, dtype=np.float32)
    else:
        imp = np.ones((), dtype=np.float32)
        for size in window:
            # float32 throughout, in MONAI's order: centred at (W-1)/2, no normalisation.
            x = np.arange(size, dtype=np.float32) - np.float32((size - 1) / 2.0)
            sigma = size * sigma_scale
            g = np.exp(x * x / np.float32(-2 * sigma**2)).astype(np.float32)
            imp = imp[..., None] * g
    floor = np.float32(max(float(imp.min()), _MIN_WEIGHT))
    imp = np.maximum(imp, floor).astype(np.float32)
    imp.flags.writeable = False  # shared through the cache
    return imp


def importance_map(
    window: Sequence[int], mode: BlendMode, sigma_scale: float = 0.125
) -> np.ndarray:
    """MONAI's `compute_importance_map` for 3D: ones, or a separable float32 Gaussian
    with sigma = sigma_scale * W per axis, peak-unnormalised, floored at max(min, 1e-3).

    The floor keeps corner weights from vanishing so every voxel has a nonzero weight
    sum. Cached and read-only.
    """
    win = _triple(window, "window")
    if mode not in ("gaussian", "constant"):
        raise ValueError(f"mode must be 'gaussian' or 'constant', got {mode!r}")
    if not float(sigma_scale) > 0:
        raise ValueError(f"sigma_scale must be positive, got {sigma_scale!r}")
    return _importance_map_cached(win, mode, float(sigma_scale))


def overlap(
    grid: WindowGrid, start: Triple, box_lo: Sequence[int], box_hi: Sequence[int]
) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """Slices of the window/box intersection, in window-local and box-local indices."""
    win_sl, box_sl = [], []
    for d in range(3):
        a = box_lo[d] + grid.pad_before[d]
        lo = max(start[d], a)
        hi = min(start[d] + grid.window[d], box_hi[d] + grid.pad_before[d])
        win_sl.append(slice(lo - start[d], hi - start[d]))
        box_sl.append(slice(lo - a, hi - a))
    return tuple(win_sl), tuple(box_sl)


def blend_box(
    grid: WindowGrid,
    box_lo: Sequence[int],
    box_hi: Sequence[int],
    run_window: Callable[[Triple], np.ndarray],
    mode: BlendMode,
    out_channels: int,
    sigma_scale: float = 0.125,
) -> np.ndarray:
    """MONAI's blended output restricted to the volume box [lo, hi), shape (C, *box).

    Per voxel MONAI sums output*weight and weight in float32 in window order and
    divides; visiting the touching windows in that same order gives the same sums,
    whatever the box. `run_window(start)` returns the (C, *W) output of the window at
    `start` (padded frame).
    """
    imp = importance_map(grid.window, mode, sigma_scale)
    shape = tuple(h - lo for lo, h in zip(box_lo, box_hi, strict=True))
    windows = windows_touching(grid, box_lo, box_hi)
    acc = np.zeros((out_channels, *shape), dtype=np.float32)
    wsum = np.zeros(shape, dtype=np.float32)
    expected = (out_channels, *grid.window)
    for start in windows:
        out = np.asarray(run_window(start), dtype=np.float32)
        if out.shape != expected:
            raise ValueError(f"run_window({start}) gave shape {out.shape}, expected {expected}")
        win_sl, box_sl = overlap(grid, start, box_lo, box_hi)
        acc[(slice(None), *box_sl)] += out[(slice(None), *win_sl)] * imp[win_sl]
        wsum[box_sl] += imp[win_sl]
    if windows:
        acc /= wsum
    return acc


def read_window_input(
    volume: np.ndarray, grid: WindowGrid, start_padded: Sequence[int]
) -> np.ndarray:
    """The (C, *W) input of the window at `start_padded`, zeros where it leaves the volume
    (MONAI's constant padding with cval=0)."""
    if volume.ndim != 4 or tuple(volume.shape[1:]) != grid.volume_shape:
        raise ValueError(
            f"volume must be (C, *{grid.volume_shape}), got shape {tuple(volume.shape)}"
        )
    out = np.zeros((volume.shape[0], *grid.window), dtype=volume.dtype)
    src, dst = [], []
    for d in range(3):
        lo = start_padded[d] - grid.pad_before[d]
        a, b = max(lo, 0), min(lo + grid.window[d], grid.volume_shape[d])
        if b <= a:
            return out
        src.append(slice(a, b))
        dst.append(slice(a - lo, b - lo))
    out[(slice(None), *dst)] = volume[(slice(None), *src)]
    return out


def window_input(x: np.ndarray, origin: Sequence[int], start: Triple,
                 grid: WindowGrid) -> np.ndarray:
    """The (C, *W) input of the window at `start` (padded frame) from a block's read
    array `x` (C, RZ, RY, RX) whose first voxel is `origin` (volume coordinates); zeros
    where the window leaves the volume (MONAI pads volumes smaller than W with zeros)."""
    lo = [start[i] - grid.pad_before[i] for i in range(3)]  # volume coordinates
    vol, win = grid.volume_shape, grid.window
    src = tuple(
        slice(max(0, lo[i]) - origin[i], min(vol[i], lo[i] + win[i]) - origin[i]) for i in range(3)
    )
    part = x[(slice(None), *src)]
    if part.shape[1:] == grid.window:
        return part
    out = np.zeros((x.shape[0], *grid.window), np.float32)
    dst = tuple(slice(max(0, -lo[i]), max(0, -lo[i]) + part.shape[1 + i]) for i in range(3))
    out[(slice(None), *dst)] = part
    return out


def window_inside(grid: WindowGrid, start: Triple, box_lo: Sequence[int],
                  box_hi: Sequence[int]) -> bool:
    """Whether the window at `start` (padded frame) lies within the volume box [lo, hi):
    no other box blends it, so its output need not be kept."""
    pad, win = grid.pad_before, grid.window
    return all(box_lo[a] + pad[a] <= start[a] and start[a] + win[a] <= box_hi[a] + pad[a]
               for a in range(3))
