"""ONNX Resize (opset 13+) over the three spatial axes: nearest and trilinear.

Exported U-Nets upsample with F.interpolate, which becomes Resize with a
coordinate transformation mode that decides where each output voxel samples the
input. Linear resize is separable, so each axis is interpolated in turn with
precomputed (index, weight) pairs: two gathers and a weighted sum per axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.graph_args import (
    MODES,
    NEAREST_MODES,
    TRANSFORMS,
    as_volume,
    choice,
    triple,
)
from znni.primitives.shapes import linear_taps, nearest_index, source_coords


def _scales(scales: Sequence[float] | None) -> tuple[float, float, float] | tuple[None, ...]:
    """Validated positive per-axis scales, or three Nones."""
    if scales is None:
        return (None, None, None)
    vals = tuple(float(v) for v in scales)
    if len(vals) != 3 or min(vals) <= 0:
        raise ValueError(f"scales must be 3 positive numbers (z, y, x), got {scales!r}")
    return (vals[0], vals[1], vals[2])


def resize3d(
    x: np.ndarray,
    out_size: Sequence[int],
    *,
    mode: str,
    coordinate_transformation_mode: str,
    nearest_mode: str = "round_prefer_floor",
    scales: Sequence[float] | None = None,
) -> np.ndarray:
    """Resize (N, C, Z, Y, X) to (N, C, *out_size) as ONNX Resize does -> float32.

    `scales`, when given, enter the coordinate transform (as ONNX uses its scales
    input); otherwise out/in is used. align_corners always uses the lengths.
    """
    x = as_volume(x)
    size = triple(out_size, "out_size", 1)
    choice(mode, "mode", MODES)
    choice(coordinate_transformation_mode, "coordinate_transformation_mode", TRANSFORMS)
    choice(nearest_mode, "nearest_mode", NEAREST_MODES)
    sc = _scales(scales)
    y = x
    for i in range(3):
        axis, n_in = 2 + i, x.shape[2 + i]
        coords = source_coords(n_in, size[i], coordinate_transformation_mode, sc[i])
        if mode == "nearest":
            y = np.take(y, nearest_index(coords, n_in, nearest_mode), axis=axis)
            continue
        i0, i1, w1 = linear_taps(coords, n_in)
        shape = [1] * 5
        shape[axis] = size[i]
        w1 = w1.reshape(shape)
        a = np.take(y, i0, axis=axis)
        b = np.take(y, i1, axis=axis)
        b -= a
        b *= w1
        a += b  # a + w1 * (b - a)
        y = a
    return np.ascontiguousarray(y, dtype=np.float32)
