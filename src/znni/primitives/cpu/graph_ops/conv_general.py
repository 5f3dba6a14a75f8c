"""General 3D convolution (ONNX Conv / torch Conv3d): strides, pads, dilations, groups.

ONNX-exported U-Nets use strided, dilated, grouped and depthwise convs that the
FFT/direct primitives (valid, stride-1, dense) do not cover. Dense groups run as
blocked column GEMMs: a block of output rows gathers its (Cin/g * kvol) input
columns with one strided copy, then one batched matmul over groups, so the GEMM
has a deep K and the column buffer stays cache-sized. Groups with one input
channel (depthwise) skip BLAS and multiply-accumulate over kernel offsets.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from itertools import product
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from znni.primitives.cpu.graph_ops.conv_strided import conv_strided
from znni.primitives.cpu.graph_ops.padding import pad_constant
from znni.primitives.graph_args import (
    Six,
    Triple,
    as_volume,
    channel_vector,
    six,
    triple,
)
from znni.primitives.shapes import conv_out_size
from znni.triple import as_triple

COLUMN_BYTES = 4 * 2**20  # column buffer per block: a few MB keeps gather and GEMM in cache
DEPTHWISE_BYTES = 2 * 2**20  # depthwise accumulator block (2 MB measured best on 2 cores)
MAX_WORKERS = 8  # threads over independent output blocks (each holds its own buffers)

_lock = threading.Lock()
_controller: Any = None


def blas_single_thread() -> AbstractContextManager[Any]:
    """Limit BLAS to one thread (process-wide, restored on exit).

    Our workers split the blocks instead: OpenBLAS threads synchronising on every
    small per-block GEMM made conv3d 10x slower on a 2-core machine with one
    core busy, whereas one BLAS thread per worker degrades gracefully.
    """
    global _controller
    with _lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def run_parts(work: Callable[[list[Any]], None], tasks: list[Any]) -> None:
    """work(part) on interleaved parts of `tasks`, one thread per available core (capped)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = max(1, min(cpus or 1, MAX_WORKERS, len(tasks)))
    if workers == 1:
        work(tasks)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, [tasks[j::workers] for j in range(workers)]))  # re-raises errors


def pad_zero(x: np.ndarray, pads: Six) -> np.ndarray:
    """Zero-pad the spatial axes of (N, C, Z, Y, X); no copy when all pads are 0."""
    if not any(pads):
        return x
    return pad_constant(x, pads)


def windows(
    x: np.ndarray, kernel: Triple, s: Triple, d: Triple, p: Six, out: Triple
) -> tuple[np.ndarray, Triple]:
    """Zero-padded input as a (N, C, kz, ky, kx, gz, gy, gx) window view and its grid.

    With unit y and x strides each output z plane is computed on the padded
    (Yp * Xp) plane flattened (grid (oz, 1, Yp*Xp), cropped afterwards), so every
    kernel offset is one long contiguous run instead of oy short rows: numpy's
    per-row overhead dominates small tiles otherwise. One extra zero z plane keeps
    the runs of the last plane inside the buffer.
    """
    if s[1] != 1 or s[2] != 1:
        xp = pad_zero(x, p)
        return window_view(xp, kernel, d, s, out), out
    xp = pad_zero(x, p[:3] + (p[3] + 1,) + p[4:])
    n, c, _, yp, xw = xp.shape
    sn, sc, sz = xp.strides[:3]
    shape = (n, c) + tuple(kernel) + (out[0], 1, yp * xw)
    st = (sn, sc, sz * d[0], xp.strides[3] * d[1], xp.strides[4] * d[2], sz * s[0], 0, 4)
    return as_strided(xp, shape, st, writeable=False), (out[0], 1, yp * xw)


def crop_grid(y: np.ndarray, grid: Triple, out: Triple, padded_yx: tuple[int, int]) -> np.ndarray:
    """(N, C, *grid) -> (N, C, *out): drop the padded-plane columns of a flat grid."""
    if grid == out:
        return y
    full = y.reshape(y.shape[:2] + (out[0],) + padded_yx)  # (N, C, oz, Yp, Xp)
    return np.ascontiguousarray(full[..., : out[1], : out[2]])


def window_view(
    xp: np.ndarray, kernel: Triple, dilations: Triple, strides: Triple, out: Triple
) -> np.ndarray:
    """(..., Z, Y, X) -> (..., kz, ky, kx, oz, oy, ox): input at o*s + k*d, no copy."""
    lead, sp = xp.shape[:-3], xp.strides
    shape = lead + tuple(kernel) + tuple(out)
    kst = tuple(sp[-3 + i] * dilations[i] for i in range(3))
    ost = tuple(sp[-3 + i] * strides[i] for i in range(3))
    return as_strided(xp, shape, sp[:-3] + kst + ost, writeable=False)


def _check(x: np.ndarray, weight: np.ndarray, groups: int) -> np.ndarray:
    """Validated float32 weight (Cout, Cin/groups, kz, ky, kx)."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 5:
        raise ValueError(f"weight must be 5-D (Cout, Cin/groups, kz, ky, kx), got {w.shape}")
    cin, cout = x.shape[1], w.shape[0]
    if groups < 1 or cin % groups or cout % groups:
        raise ValueError(f"groups={groups} must divide Cin={cin} and Cout={cout}")
    if w.shape[1] * groups != cin:
        raise ValueError(
            f"weight has {w.shape[1]} input channels per group, Cin/groups = {cin}/{groups}"
        )
    return w


def conv3d(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    *,
    strides: Sequence[int] = (1, 1, 1),
    pads: Sequence[int] = (0, 0, 0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1, 1),
    groups: int = 1,
) -> np.ndarray:
    """Cross-correlation of (N, Cin, Z, Y, X) with (Cout, Cin/groups, kz, ky, kx) -> float32."""
    x = as_volume(x)
    w = _check(x, weight, int(groups))
    s, d = triple(strides, "strides", 1), triple(dilations, "dilations", 1)
    p = six(pads)
    kernel = as_triple(w.shape[2:])
    out = as_triple(
        conv_out_size(x.shape[2 + i], kernel[i], s[i], d[i], p[i], p[i + 3]) for i in range(3)
    )
    if min(out) < 1:
        raise ValueError(
            f"empty output {out}: input {x.shape[2:]}, kernel {kernel}, dilations {d}, pads {p}"
        )
    b = channel_vector(bias, w.shape[0], "bias")
    if kernel == (1, 1, 1) and s == (1, 1, 1):
        y = _conv_pointwise(pad_zero(x, p), w, groups)
    else:
        y = _conv_windows(x, w, groups, s, d, p, out)
    if b is not None:
        y += b[None, :, None, None, None]
    return y


def _conv_pointwise(xp: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    """1x1x1 kernel, unit strides: a plain (grouped) GEMM on the input, no gather."""
    n, cin, *size = xp.shape
    cout = w.shape[0]
    wm = w.reshape(groups, cout // groups, cin // groups)  # (G, Cout/g, Cin/g)
    xg = xp.reshape(n, groups, cin // groups, -1)  # (N, G, Cin/g, Z*Y*X)
    return np.matmul(wm, xg).reshape(n, cout, *size)  # (N, G, Cout/g, Z*Y*X) -> (N, Cout, ...)


def _conv_windows(
    x: np.ndarray, w: np.ndarray, groups: int, s: Triple, d: Triple, p: Six, out: Triple
) -> np.ndarray:
    """Depthwise multiply-accumulate, phase-split GEMM (strided, undilated, dense groups),
    or blocked column GEMM over the window view."""
    depthwise = w.shape[1] == 1 and groups > 1  # one input channel alone is a K = k^3 GEMM
    if s != (1, 1, 1) and d == (1, 1, 1) and not depthwise:
        return conv_strided(x, w, groups, s, p, out)
    view, grid = windows(x, w.shape[2:], s, d, p, out)
    if depthwise:
        y = _conv_depthwise(view, w, groups, grid)
    else:
        y = _conv_gemm(view, w, groups, grid)
    padded = (x.shape[3] + p[1] + p[4], x.shape[4] + p[2] + p[5])
    return crop_grid(y, grid, out, padded)


def _conv_depthwise(view: np.ndarray, w: np.ndarray, groups: int, grid: Triple) -> np.ndarray:
    """One input channel per group: out[n, g, m] += w[g, m, k] * x[n, g, shifted by k].

    Blocked over output z planes so each block's accumulator stays in cache while
    all kernel offsets are added into it; no BLAS (K would be 1).
    """
    n, m = view.shape[0], w.shape[0] // groups
    kernel = w.shape[2:]
    gz, gy, gx = grid
    wk = w.reshape(groups, m, *kernel)  # (G, m, kz, ky, kx)
    y = np.zeros((n, groups, m) + grid, np.float32)  # (N, G, m, gz, gy, gx)
    bz = max(1, min(gz, DEPTHWISE_BYTES // (4 * n * groups * m * gy * gx)))

    def work(starts: list[int]) -> None:
        tmp = np.empty((n, groups, m, bz, gy, gx), np.float32)
        for z0 in starts:
            yb = y[:, :, :, z0 : z0 + bz]  # (N, G, m, bz, gy, gx)
            tb = tmp[:, :, :, : yb.shape[3]]
            for a, bb, c in np.ndindex(*kernel):
                src = view[:, :, a, bb, c, None, z0 : z0 + bz]  # (N, G, 1, bz, gy, gx)
                coef = wk[None, :, :, a, bb, c, None, None, None]  # (1, G, m, 1, 1, 1)
                np.multiply(src, coef, out=tb)
                yb += tb

    run_parts(work, list(range(0, gz, bz)))
    return y.reshape((n, groups * m) + grid)


def _blocks(cols_per_voxel: int, grid: Triple) -> Triple:
    """(z, y, x) extents of an output block whose columns take about COLUMN_BYTES."""
    gz, gy, gx = grid
    voxels = max(1, COLUMN_BYTES // max(1, cols_per_voxel * 4))
    if voxels < gx:
        return 1, 1, voxels
    if voxels < gy * gx:
        return 1, voxels // gx, gx
    return min(gz, voxels // (gy * gx)), gy, gx


def _conv_gemm(view: np.ndarray, w: np.ndarray, groups: int, grid: Triple) -> np.ndarray:
    """Blocked column GEMM, batched over groups: (G, Cout/g, K) @ (G, K, block voxels)."""
    n, cin = view.shape[:2]
    cg, cout = cin // groups, w.shape[0]
    kernel = w.shape[2:]
    kdim = cg * int(np.prod(kernel))
    wmat = w.reshape(groups, cout // groups, kdim)  # (G, Cout/g, Cin/g*kz*ky*kx)
    vg = view.reshape((n, groups, cg) + view.shape[2:])  # (N, G, Cin/g, kz, ky, kx, gz, gy, gx)
    y = np.empty((n, cout) + grid, np.float32)
    bz, by, bx = _blocks(groups * kdim, grid)

    def work(blocks: list[tuple[int, int, int, int]]) -> None:
        buf = np.empty(groups * kdim * bz * by * bx, np.float32)
        for i, z0, y0, x0 in blocks:
            blk = vg[i, ..., z0 : z0 + bz, y0 : y0 + by, x0 : x0 + bx]
            tz, ty, tx = blk.shape[-3:]
            cols = buf[: groups * kdim * tz * ty * tx].reshape(blk.shape)
            np.copyto(cols, blk)  # the single gather of this block's columns
            res = np.matmul(wmat, cols.reshape(groups, kdim, -1))  # (G, Cout/g, tz*ty*tx)
            y[i, :, z0 : z0 + tz, y0 : y0 + ty, x0 : x0 + tx] = res.reshape(cout, tz, ty, tx)

    ranges = (range(n), range(0, grid[0], bz), range(0, grid[1], by), range(0, grid[2], bx))
    with blas_single_thread():
        run_parts(work, list(product(*ranges)))
    return y
