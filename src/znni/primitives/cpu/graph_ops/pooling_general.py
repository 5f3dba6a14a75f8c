"""Max and average pooling with ONNX MaxPool / AveragePool semantics.

The MPF pooling of the dense engine assumes valid, non-overlapping windows;
graph networks use pads, strides != kernel and ceil_mode. A box window is
separable, so each axis is reduced in turn from k strided views of the input
(k reads per axis instead of k^3), with no Python loop over voxels. A channels-last
input (an OpenVINO layer's output, engine.graph_forward) gives a channels-last output:
the channels are every tap's contiguous inner run, and no copy changes the layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.cpu.graph_ops._parallel import run_tiles
from znni.primitives.cpu.layout import is_channels_last
from znni.primitives.graph_args import (
    Six,
    Triple,
    as_volume,
    six,
    triple,
)
from znni.primitives.shapes import pool_out_size
from znni.triple import as_triple

CHANNEL_TILE_BYTES = 1 << 20  # input per channel range: whole channels, a few per core


def _geometry(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    ceil_mode: bool,
) -> tuple[Triple, Triple, Six, Triple, Triple]:
    """Validated (kernel, strides, pads, dilations, output size)."""
    k, s = triple(kernel, "kernel", 1), triple(strides, "strides", 1)
    p, d = six(pads), triple(dilations, "dilations", 1)
    for i in range(3):
        if max(p[i], p[i + 3]) >= d[i] * (k[i] - 1) + 1:
            raise ValueError(f"pads {p} must be smaller than the (dilated) kernel {k}")
    out = as_triple(
        pool_out_size(x.shape[2 + i], k[i], s[i], d[i], p[i], p[i + 3], bool(ceil_mode))
        for i in range(3)
    )
    if min(out) < 1:
        raise ValueError(f"empty output {out}: input {x.shape[2:]}, kernel {k}, pads {p}")
    return k, s, p, d, out


def _padded(
    x: np.ndarray, p: Six, k: Triple, s: Triple, d: Triple, out: Triple, fill: float
) -> np.ndarray:
    """x padded with `fill` by the pads plus whatever ceil-mode windows overrun (x itself
    when there is nothing to pad: the reduction never writes into its input)."""
    width = [(0, 0), (0, 0)]
    for i in range(3):
        need = (out[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1  # extent the windows cover
        width.append((p[i], max(0, need - p[i] - x.shape[2 + i])))
    if not any(a or b for a, b in width):
        return x
    if is_channels_last(x):  # padded as it lies: (N, Z, Y, X, C)
        last = [width[0], *width[2:], width[1]]
        return np.pad(x.transpose(0, 2, 3, 4, 1), last, constant_values=fill).transpose(
            0, 4, 1, 2, 3)
    return np.pad(x, width, constant_values=fill)


def _reduce_channels(
    xp: np.ndarray, k: Triple, s: Triple, d: Triple, out: Triple, op: np.ufunc
) -> np.ndarray:
    """`_reduce_axes` into a new (N, C, *out) array, channel ranges of about
    CHANNEL_TILE_BYTES of input each on every core (run_tiles)."""
    if is_channels_last(xp):
        return _reduce_planes(xp, k, s, d, out, op)
    n, c = xp.shape[:2]
    flat = xp.reshape(n * c, 1, *xp.shape[2:])  # (N*C, 1, Z, Y, X)
    y = np.empty((n * c, 1, *out), xp.dtype)  # (N*C, 1, *out)
    per = max(1, CHANNEL_TILE_BYTES // max(1, flat[0].nbytes))
    ranges = [(a, min(a + per, n * c)) for a in range(0, n * c, per)]

    def run(part: Sequence[tuple[int, int]]) -> list[None]:
        for a, b in part:
            y[a:b] = _reduce_axes(flat[a:b], k, s, d, out, op)
        return [None] * len(part)

    run_tiles(run, ranges, xp.nbytes)
    return y.reshape(n, c, *out)


def _reduce_planes(
    xp: np.ndarray, k: Triple, s: Triple, d: Triple, out: Triple, op: np.ufunc
) -> np.ndarray:
    """`_reduce_axes` of channels-last `xp` into a new channels-last (N, C, *out) array,
    slabs of output z planes (about CHANNEL_TILE_BYTES of input each) on every core."""
    n, c = xp.shape[:2]
    y = np.empty((n, *out, c), xp.dtype).transpose(0, 4, 1, 2, 3)  # (N, C, *out), C inner
    plane_bytes = xp[0, :, 0].nbytes * s[0]  # input per output z plane
    per = max(1, CHANNEL_TILE_BYTES // max(1, plane_bytes))
    slabs = [(b, z0, min(z0 + per, out[0])) for b in range(n) for z0 in range(0, out[0], per)]

    def run(part: Sequence[tuple[int, int, int]]) -> list[None]:
        for b, z0, z1 in part:
            lo, hi = z0 * s[0], (z1 - 1) * s[0] + d[0] * (k[0] - 1) + 1
            y[b : b + 1, :, z0:z1] = _reduce_axes(
                xp[b : b + 1, :, lo:hi], k, s, d, (z1 - z0, out[1], out[2]), op)
        return [None] * len(part)

    run_tiles(run, slabs, xp.nbytes)
    return y


def _reduce_axes(
    xp: np.ndarray, k: Triple, s: Triple, d: Triple, out: Triple, op: np.ufunc
) -> np.ndarray:
    """Separable strided window reduction over the three spatial axes.

    Per axis, the k taps are k strided views of the padded array combined with
    `op` into one accumulator: whole-array ufunc calls with contiguous inner rows,
    rather than a reduction over a short strided window axis (slow in numpy). The
    first two taps make the accumulator, so the input (maybe the caller's) is only read.
    """
    y = xp
    for i in range(3):
        axis = 2 + i
        sel = [slice(None)] * y.ndim
        taps = []
        for t in range(k[i]):
            sel[axis] = slice(t * d[i], t * d[i] + (out[i] - 1) * s[i] + 1, s[i])
            taps.append(y[tuple(sel)])  # (..., out along axis, ...)
        if len(taps) == 1:
            y = taps[0]
            continue
        y = op(taps[0], taps[1])
        for tap in taps[2:]:
            op(y, tap, out=y)
    return y


def max_pool3d(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int] = (0, 0, 0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
) -> np.ndarray:
    """ONNX MaxPool over (N, C, Z, Y, X): padding never wins (-inf)."""
    x = as_volume(x)
    k, s, p, d, out = _geometry(x, kernel, strides, pads, dilations, ceil_mode)
    return _reduce_channels(_padded(x, p, k, s, d, out, -np.inf), k, s, d, out, np.maximum)


def _counts(n: int, k: int, s: int, pb: int, pe: int, out: int, include_pad: bool) -> np.ndarray:
    """Divisor along one axis: window clipped to the padded input, or to the input itself."""
    start = np.arange(out) * s - pb
    end = np.minimum(start + k, n + pe)
    if not include_pad:
        start, end = np.maximum(start, 0), np.minimum(end, n)
    return (end - start).astype(np.float64)


def avg_pool3d(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int] = (0, 0, 0, 0, 0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> np.ndarray:
    """ONNX AveragePool over (N, C, Z, Y, X).

    The divisor counts pad voxels only with `count_include_pad`; ceil-mode overrun
    past the end padding is never counted (as torch and onnxruntime do).
    """
    x = as_volume(x)
    k, s, p, d, out = _geometry(x, kernel, strides, pads, (1, 1, 1), ceil_mode)
    xp = _padded(x, p, k, s, d, out, 0.0)
    total = _reduce_channels(xp, k, s, d, out, np.add)
    cz, cy, cx = (
        _counts(x.shape[2 + i], k[i], s[i], p[i], p[i + 3], out[i], count_include_pad)
        for i in range(3)
    )
    inv = 1.0 / (cz[:, None, None] * cy[None, :, None] * cx[None, None, :])
    return (total * inv.astype(np.float32)).astype(np.float32)
