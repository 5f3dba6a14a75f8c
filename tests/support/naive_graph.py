"""Independent brute-force references for the graph ops (znni.primitives.cpu.graph_ops).

Nothing here imports znni. Every op is written from its ONNX definition with
explicit Python loops over output (or input) positions and kernel offsets, in
float64; only the channel contraction at one position is a numpy dot. Resize
coordinates use exact fractions, so rounding ties are decided exactly. Use on
tiny tensors only. Pads are ONNX-ordered (z_b, y_b, x_b, z_e, y_e, x_e).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from itertools import product

import numpy as np

Arr = np.ndarray
Ints = Sequence[int]


def _positions(length: int, span: int, stride: int) -> list[int]:
    """Window starts (in padded coordinates) of every window that fits in `length`."""
    starts, o = [], 0
    while o * stride + span <= length:
        starts.append(o * stride)
        o += 1
    return starts


def naive_conv3d(
    x: Arr, w: Arr, b: Arr | None, strides: Ints, pads: Ints, dilations: Ints, groups: int
) -> np.ndarray:
    """y[n, co, o] = b[co] + sum_{ci in group, k} x[n, ci, o*s + k*d - pb] * w[co, ci, k]."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, cin = x.shape[:2]
    cout, cg = w.shape[:2]
    kernel = w.shape[2:]
    span = [dilations[i] * (kernel[i] - 1) + 1 for i in range(3)]
    starts = [
        _positions(x.shape[2 + i] + pads[i] + pads[i + 3], span[i], strides[i]) for i in range(3)
    ]
    y = np.zeros((n, cout) + tuple(len(s) for s in starts))
    cog = cout // groups
    for bi, (oz, z0), (oy, y0), (ox, x0) in product(
        range(n), enumerate(starts[0]), enumerate(starts[1]), enumerate(starts[2])
    ):
        for g in range(groups):
            acc = np.zeros(cog)
            for a, bb, c in product(*(range(k) for k in kernel)):
                iz = z0 + a * dilations[0] - pads[0]
                iy = y0 + bb * dilations[1] - pads[1]
                ix = x0 + c * dilations[2] - pads[2]
                if not (0 <= iz < x.shape[2] and 0 <= iy < x.shape[3] and 0 <= ix < x.shape[4]):
                    continue  # zero padding
                v = x[bi, g * cg : (g + 1) * cg, iz, iy, ix]
                acc += w[g * cog : (g + 1) * cog, :, a, bb, c] @ v
            y[bi, g * cog : (g + 1) * cog, oz, oy, ox] = acc
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None, None]
    return y


def naive_conv_transpose3d(
    x: Arr,
    w: Arr,
    b: Arr | None,
    strides: Ints,
    pads: Ints,
    output_padding: Ints,
    dilations: Ints,
    groups: int,
) -> np.ndarray:
    """Scatter: y[n, co, i*s + k*d - pb] += x[n, ci, i] * w[ci, co, k] (w is (Cin, Cout/g, k))."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, cin = x.shape[:2]
    cog = w.shape[1]
    cg = cin // groups
    kernel = w.shape[2:]
    out = [
        (x.shape[2 + i] - 1) * strides[i]
        - pads[i]
        - pads[i + 3]
        + dilations[i] * (kernel[i] - 1)
        + output_padding[i]
        + 1
        for i in range(3)
    ]
    y = np.zeros((n, cog * groups) + tuple(out))
    for bi, iz, iy, ix in product(range(n), *(range(s) for s in x.shape[2:])):
        for a, bb, c in product(*(range(k) for k in kernel)):
            pos = [
                i * strides[j] + k * dilations[j] - pads[j]
                for j, (i, k) in enumerate(((iz, a), (iy, bb), (ix, c)))
            ]
            if not all(0 <= pos[j] < out[j] for j in range(3)):
                continue
            for g in range(groups):
                v = x[bi, g * cg : (g + 1) * cg, iz, iy, ix]
                y[bi, g * cog : (g + 1) * cog, pos[0], pos[1], pos[2]] += (
                    v @ w[g * cg : (g + 1) * cg, :, a, bb, c]
                )
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None, None]
    return y


def _pool_starts(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool) -> list[int]:
    """Window starts in input coordinates.

    Floor mode: windows that fit in the padded input. Ceil mode (ONNX output-shape
    formula with ceil, plus torch's rule): a window may overrun the end padding by
    up to s - 1 voxels, but one that starts in the end padding is ignored.
    """
    span, length = d * (k - 1) + 1, n + pb + pe
    starts, o = [], 0
    while True:
        fits = o * s + span <= length
        overrun_ok = ceil_mode and o * s < length - span + s and o * s - pb < n
        if not (fits or overrun_ok):
            return starts
        starts.append(o * s - pb)
        o += 1


def naive_max_pool3d(
    x: Arr, kernel: Ints, strides: Ints, pads: Ints, dilations: Ints, ceil_mode: bool
) -> np.ndarray:
    """Max over the in-input taps of each window (pads are -inf, so never win)."""
    x = np.asarray(x, np.float64)
    starts = [
        _pool_starts(
            x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[i + 3], ceil_mode
        )
        for i in range(3)
    ]
    y = np.full(x.shape[:2] + tuple(len(s) for s in starts), -np.inf)
    for (oz, z0), (oy, y0), (ox, x0) in product(*(enumerate(s) for s in starts)):
        for a, b, c in product(*(range(k) for k in kernel)):
            iz, iy, ix = z0 + a * dilations[0], y0 + b * dilations[1], x0 + c * dilations[2]
            if 0 <= iz < x.shape[2] and 0 <= iy < x.shape[3] and 0 <= ix < x.shape[4]:
                y[:, :, oz, oy, ox] = np.maximum(y[:, :, oz, oy, ox], x[:, :, iz, iy, ix])
    return y


def naive_avg_pool3d(
    x: Arr, kernel: Ints, strides: Ints, pads: Ints, ceil_mode: bool, count_include_pad: bool
) -> np.ndarray:
    """Sum of in-input taps / number of taps in the input (or in the padded input)."""
    x = np.asarray(x, np.float64)
    size = x.shape[2:]
    starts = [
        _pool_starts(size[i], kernel[i], strides[i], 1, pads[i], pads[i + 3], ceil_mode)
        for i in range(3)
    ]
    y = np.zeros(x.shape[:2] + tuple(len(s) for s in starts))
    for (oz, z0), (oy, y0), (ox, x0) in product(*(enumerate(s) for s in starts)):
        total, count = np.zeros(x.shape[:2]), 0
        for a, b, c in product(*(range(k) for k in kernel)):
            pos = (z0 + a, y0 + b, x0 + c)
            inside = all(0 <= pos[i] < size[i] for i in range(3))
            in_padded = all(-pads[i] <= pos[i] < size[i] + pads[i + 3] for i in range(3))
            if inside:
                total += x[:, :, pos[0], pos[1], pos[2]]
            if inside or (count_include_pad and in_padded):
                count += 1
        y[:, :, oz, oy, ox] = total / count
    return y


def _source(i: int, n_in: int, n_out: int, transform: str, scale: float | None) -> Fraction:
    """ONNX Resize coordinate_transformation_mode, as an exact Fraction."""
    sc = Fraction(n_out, n_in) if scale is None else Fraction(scale)
    if transform == "align_corners":
        return Fraction(0) if n_out == 1 else Fraction(i * (n_in - 1), n_out - 1)
    if transform == "asymmetric":
        return Fraction(i) / sc
    if transform == "pytorch_half_pixel" and n_out == 1:
        return Fraction(0)
    return (i + Fraction(1, 2)) / sc - Fraction(1, 2)  # half_pixel, pytorch_half_pixel


def _nearest(c: Fraction, n_in: int, nearest_mode: str) -> int:
    fl = math.floor(c)
    if nearest_mode == "floor":
        i = fl
    elif nearest_mode == "ceil":
        i = math.ceil(c)
    elif c - fl == Fraction(1, 2):
        i = fl if nearest_mode == "round_prefer_floor" else fl + 1
    else:
        i = math.floor(c + Fraction(1, 2))
    return min(max(i, 0), n_in - 1)


def _linear(c: Fraction, n_in: int) -> list[tuple[int, float]]:
    """[(index, weight)] of the two neighbours; outside indices take the edge value."""
    fl = math.floor(c)
    t = float(c - fl)
    return [(min(max(fl, 0), n_in - 1), 1.0 - t), (min(max(fl + 1, 0), n_in - 1), t)]


def naive_resize3d(
    x: Arr,
    out_size: Ints,
    mode: str,
    transform: str,
    nearest_mode: str = "round_prefer_floor",
    scales: Sequence[float] | None = None,
) -> np.ndarray:
    """Per output voxel: its source coordinate per axis, then nearest tap or 8 trilinear taps."""
    x = np.asarray(x, np.float64)
    size = x.shape[2:]
    scales = scales or (None, None, None)
    y = np.zeros(x.shape[:2] + tuple(out_size))
    for o in product(*(range(s) for s in out_size)):
        coords = [_source(o[i], size[i], out_size[i], transform, scales[i]) for i in range(3)]
        if mode == "nearest":
            idx = [_nearest(coords[i], size[i], nearest_mode) for i in range(3)]
            y[(slice(None), slice(None)) + o] = x[:, :, idx[0], idx[1], idx[2]]
            continue
        taps = [_linear(coords[i], size[i]) for i in range(3)]
        for (iz, wz), (iy, wy), (ix, wx) in product(*taps):
            y[(slice(None), slice(None)) + o] += wz * wy * wx * x[:, :, iz, iy, ix]
    return y


def _moments(values: Arr) -> tuple[float, float]:
    """Mean and biased variance by explicit sums."""
    values = np.asarray(values, np.float64).ravel()
    mean = sum(values.tolist()) / values.size
    var = sum((v - mean) ** 2 for v in values.tolist()) / values.size
    return mean, var


def naive_instance_norm(x: Arr, scale: Arr, bias: Arr, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = np.empty_like(x)
    for n, c in product(range(x.shape[0]), range(x.shape[1])):
        mean, var = _moments(x[n, c])
        y[n, c] = (x[n, c] - mean) / math.sqrt(var + eps) * scale[c] + bias[c]
    return y


def naive_group_norm(x: Arr, groups: int, scale: Arr, bias: Arr, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = np.empty_like(x)
    cg = x.shape[1] // groups
    for n, g in product(range(x.shape[0]), range(groups)):
        mean, var = _moments(x[n, g * cg : (g + 1) * cg])
        for c in range(g * cg, (g + 1) * cg):
            y[n, c] = (x[n, c] - mean) / math.sqrt(var + eps) * scale[c] + bias[c]
    return y


def naive_batch_norm(x: Arr, scale: Arr, bias: Arr, mean: Arr, var: Arr, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        y[:, c] = (x[:, c] - mean[c]) / math.sqrt(var[c] + eps) * scale[c] + bias[c]
    return y


def _pad_source(j: int, n: int, pb: int, mode: str) -> int | None:
    """Input index that padded index j copies, or None for the constant."""
    i = j - pb
    if 0 <= i < n:
        return i
    if mode == "constant":
        return None
    if mode == "edge":
        return min(max(i, 0), n - 1)
    if n == 1:
        return 0
    while not 0 <= i < n:  # reflect: mirror about the first / last element, repeatedly
        i = -i if i < 0 else 2 * (n - 1) - i
    return i


def naive_pad3d(x: Arr, pads: Ints, mode: str, value: float = 0.0) -> np.ndarray:
    """Explicit index map per axis; negative pads crop first, then pad the rest."""
    x = np.asarray(x, np.float64)
    crop = tuple(slice(max(0, -pads[i]), x.shape[2 + i] - max(0, -pads[i + 3])) for i in range(3))
    x = x[(slice(None), slice(None)) + crop]
    pb = [max(0, pads[i]) for i in range(3)]
    out = [x.shape[2 + i] + pb[i] + max(0, pads[i + 3]) for i in range(3)]
    y = np.full(x.shape[:2] + tuple(out), float(value))
    for o in product(*(range(s) for s in out)):
        src = [_pad_source(o[i], x.shape[2 + i], pb[i], mode) for i in range(3)]
        if None not in src:
            y[(slice(None), slice(None)) + o] = x[:, :, src[0], src[1], src[2]]
    return y


def naive_elementwise(x: Arr, fn: Callable[[float], float]) -> np.ndarray:
    """fn applied to every element with Python floats."""
    x = np.asarray(x, np.float64)
    return np.array([fn(float(v)) for v in x.ravel()]).reshape(x.shape)


def naive_softmax_channels(x: Arr) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = np.empty_like(x)
    for idx in product(range(x.shape[0]), *(range(s) for s in x.shape[2:])):
        col = [x[(idx[0], c) + idx[1:]] for c in range(x.shape[1])]
        m = max(col)
        e = [math.exp(v - m) for v in col]
        for c in range(x.shape[1]):
            y[(idx[0], c) + idx[1:]] = e[c] / sum(e)
    return y
