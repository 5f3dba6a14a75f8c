"""Direct convolution: GEMMs over shifted flat views of the input (no full im2col).

Wins for 1^3-3^3 kernels and single-channel first layers, where FFTs of the
whole patch cost more than the few multiply-adds per output. With the input
image flattened to (Cin, Z*Y*X), kernel offset (dz, dy, dx) is a constant
shift dz*Y*X + dy*X + dx, so the columns of a block of consecutive output
positions are contiguous runs of the input: one strided view gathers them
with memcpy-like copies into a small per-worker column buffer that stays in
cache, then BLAS GEMMs (Cout, rows) @ (rows, L) make L outputs. Positions
with x >= ox or y >= oy inside a block are computed and dropped (a
(Y*X)/(oy*ox) overhead, ~7% at 64^3 with k = 3).

Deep layers gather the columns once per (c, dz, dx), over L + (ky-1)*X
positions, and run ky GEMMs on row-shifted views of that buffer (offset dy
is a shift of dy*X): a third of the copying of a full (Cin*k^3, L) gather
for 3^3 kernels, 10-13% faster on (40,40,3,64) and (32,32,3,128). Shallow
ones (Cin*kz*kx < SPLIT_MIN_ROWS, e.g. single-channel first layers) gather
everything and run one GEMM, whose depth BLAS needs to run well.

Memory (for the planner): the output (S, Cout, oz, oy, ox) float32, plus per
worker thread one column buffer (rows, L + (gemms-1)*X) (none when the
kernel is 1x1x1: the view is used directly), one GEMM result (Cout, L) and,
with several GEMMs, one more (Cout, L) to accumulate from, float32, where
L = (zb - 1)*Y*X + (yb - 1)*X + ox for blocks of zb planes (yb = oy) or of yb
rows in one plane (zb = 1); see `_blocks` for how zb, yb follow from
`slab_bytes` and the full depth Cin*k^3: a split gather keeps the blocks of
the full one, its buffer ky times smaller (3-4 MiB measured best on both
split shapes). Workers pull blocks from a shared queue, so both cores stay
busy on a shared machine; BLAS runs single-threaded inside the pool.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from math import prod

import numpy as np
from numpy.lib.stride_tricks import as_strided

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.cpu.threads import blas_single_thread
from znni.triple import as_triple

FLOAT_BYTES = 4
SPLIT_MIN_ROWS = 128  # fewer column rows per GEMM than this: one full-depth GEMM instead

Block = tuple[int, int, int, int, int]  # (sample, z0, z1, y0, y1) of the output


def column_layout(cin: int, kernel: tuple[int, int, int]) -> tuple[int, int]:
    """(column rows per GEMM, GEMMs per block): one per dy when Cin*kz*kx is deep enough."""
    kz, ky, kx = kernel
    if ky > 1 and cin * kz * kx >= SPLIT_MIN_ROWS:
        return cin * kz * kx, ky
    return cin * kz * ky * kx, 1


def block_columns(zb: int, yb: int, ny: int, nx: int, ox: int) -> int:
    """L: flat input positions spanned by a block of zb planes x yb rows (x < ox on the last)."""
    return (zb - 1) * ny * nx + (yb - 1) * nx + ox


def block_shape(
    s: int,
    out: tuple[int, int, int],
    n: tuple[int, int, int],
    depth: int,
    slab_bytes: int,
    workers: int,
) -> tuple[int, int]:
    """(zb, yb): blocks whose column buffer (depth rows, L) is about `slab_bytes`, >= 2 per worker
    if possible. Whole planes (zb >= 1, every row) when a plane fits, else yb rows of one
    plane. The planner's memory model (planner/hostsim.py) sizes buffers with this rule."""
    oz, oy, _ = out
    _, ny, nx = n
    cols = max(1, slab_bytes // (max(1, depth) * FLOAT_BYTES))
    rows = max(1, cols // nx)  # input rows (of nx positions) per block
    if rows < ny:
        return 1, min(oy, rows)
    zb = max(1, min(oz, rows // ny))
    while zb > 1 and s * -(-oz // zb) < 2 * workers:
        zb = (zb + 1) // 2
    return zb, oy


def computed_columns(
    s: int, out: tuple[int, int, int], n: tuple[int, int, int], zb: int, yb: int
) -> tuple[int, int]:
    """(positions the GEMMs compute, blocks) over all (zb, yb) blocks: the valid outputs
    plus the dropped x >= ox and y >= oy between them (3x the valid ones on 9^3 -> 5^3
    fragments). Closed form of summing `block_columns` over `_blocks`."""
    oz, oy, ox = out

    def runs(total: int, step: int) -> list[tuple[int, int]]:  # (size, count)
        full, rest = divmod(total, step)
        return [(step, full)] + ([(rest, 1)] if rest else [])

    cols = blocks = 0
    for zc, zn in runs(oz, zb):
        for yc, yn in runs(oy, yb):
            cols += zn * yn * block_columns(zc, yc, n[1], n[2], ox)
            blocks += zn * yn
    return s * cols, s * blocks


def _blocks(
    s: int,
    out: tuple[int, int, int],
    n: tuple[int, int, int],
    depth: int,
    slab_bytes: int,
    workers: int,
) -> list[Block]:
    """Every (sample, z0, z1, y0, y1) block of the output, shaped by `block_shape`."""
    oz, oy, _ = out
    zb, yb = block_shape(s, out, n, depth, slab_bytes, workers)
    return [
        (si, z0, min(oz, z0 + zb), y0, min(oy, y0 + yb))
        for si in range(s)
        for z0 in range(0, oz, zb)
        for y0 in range(0, oy, yb)
    ]


def direct_conv3d(
    pool: ThreadPoolExecutor,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    activation: Activation | None,
    slab_bytes: int = 2**23,
) -> np.ndarray:
    """Valid cross-correlation (S, Cin, n) x (Cout, Cin, k) -> (S, Cout, n-k+1), fused bias/act."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    s, cin, nz, ny, nx = (int(v) for v in x.shape)
    cout = int(weight.shape[0])
    kernel = as_triple(weight.shape[2:])
    out_size = as_triple(n - k + 1 for n, k in zip((nz, ny, nx), kernel, strict=True))
    rows, gemms = column_layout(cin, kernel)
    ky_g = kernel[1] // gemms  # kernel rows each GEMM's columns cover: ky, or 1 when split
    w = np.asarray(weight, dtype=np.float32)
    wg = [np.ascontiguousarray(w[:, :, :, g : g + ky_g].reshape(cout, rows))  # (Cout, rows)
          for g in range(0, kernel[1], ky_g)]
    out = np.empty((s, cout, *out_size), dtype=np.float32)
    blocks = _blocks(s, out_size, (nz, ny, nx), rows * gemms, slab_bytes, pool._max_workers)
    cap = max(block_columns(b[2] - b[1], b[4] - b[3], ny, nx, out_size[2]) for b in blocks)
    conv = _ColumnConv(x, wg, bias.astype(np.float32).reshape(cout, 1), activation, out,
                       kernel, ky_g)
    it = iter(blocks)
    lock = threading.Lock()

    def worker() -> None:
        buffers = conv.buffers(cap)
        while True:
            with lock:
                blk = next(it, None)
            if blk is None:
                return
            conv.block(blk, *buffers)

    workers = min(pool._max_workers, len(blocks))
    with blas_single_thread():
        futures = [pool.submit(worker) for _ in range(workers)]
        for f in futures:
            f.result()
    return out


class _ColumnConv:
    """direct_conv3d's per-block work: gather a block's columns, one GEMM per kernel row
    group (`wg`), bias and activation on the contiguous result, copy its valid part out."""

    def __init__(self, x: np.ndarray, wg: list[np.ndarray], bias: np.ndarray,
                 activation: Activation | None, out: np.ndarray,
                 kernel: tuple[int, int, int],
                 ky_g: int) -> None:
        self.x, self.wg, self.bias, self.activation, self.out = x, wg, bias, activation, out
        self.kernel, self.ky_g = kernel, ky_g
        _, self.cin, nz, self.ny, self.nx = x.shape
        self.cout, self.rows = wg[0].shape
        self.plane, self.vol = self.ny * self.nx, nz * self.ny * self.nx
        self.shift = (len(wg) - 1) * self.nx  # extra positions the split gather covers

    def buffers(self, cap: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
        """One worker's (columns, result, accumulator) for blocks of up to `cap` columns."""
        col = (np.empty(self.rows * (cap + self.shift), np.float32)
               if prod(self.kernel) > 1 else None)
        acc = np.empty(self.cout * cap, np.float32) if len(self.wg) > 1 else None
        return col, np.empty(self.cout * cap, np.float32), acc

    def block(self, blk: Block, col_buf: np.ndarray | None, res_buf: np.ndarray,
              acc_buf: np.ndarray | None) -> None:
        si, z0, z1, y0, y1 = blk
        cin, nx, plane, vol, st = self.cin, self.nx, self.plane, self.vol, FLOAT_BYTES
        kz, _, kx = self.kernel
        ox = self.out.shape[4]
        cols = block_columns(z1 - z0, y1 - y0, self.ny, nx, ox)
        ext = cols + self.shift
        src = self.x[si].reshape(cin, vol)[:, z0 * plane + y0 * nx :]  # (Cin, ...) a view
        shifted = as_strided(  # (Cin, kz, ky_g, kx, ext): column (c, dz, dy, dx) at a shift
            src, (cin, kz, self.ky_g, kx, ext), (vol * st, plane * st, nx * st, st, st),
            writeable=False,
        )
        if col_buf is None:
            col = shifted.reshape(cin, ext)  # 1x1x1 kernel: a strided view, no copy
        else:
            col = col_buf[: self.rows * ext].reshape(cin, kz, self.ky_g, kx, ext)
            np.copyto(col, shifted)
            col = col.reshape(self.rows, ext)
        res = res_buf[: self.cout * cols].reshape(self.cout, cols)
        np.matmul(self.wg[0], col[:, :cols], out=res)
        for g in range(1, len(self.wg)):  # offset dy = g: the same columns, g rows further on
            if acc_buf is None:  # buffers() makes one wherever there are several GEMMs
                raise TypeError("several GEMMs need an accumulator buffer")
            acc = acc_buf[: self.cout * cols].reshape(self.cout, cols)
            np.matmul(self.wg[g], col[:, g * nx : g * nx + cols], out=acc)
            res += acc
        res += self.bias
        if self.activation is not None:  # on the contiguous result, never on a strided view
            apply_activation(res, self.activation)
        valid = as_strided(  # (Cout, zb, yb, ox) of the flat result
            res_buf[: self.cout * cols], (self.cout, z1 - z0, y1 - y0, ox),
            (cols * st, plane * st, nx * st, st), writeable=False,
        )
        self.out[si, :, z0:z1, y0:y1] = valid


def direct_bytes(
    s: int,
    cin: int,
    cout: int,
    n: tuple[int, int, int],
    kernel: tuple[int, int, int],
    workers: int,
    slab_bytes: int = 2**23,
) -> int:
    """Peak bytes of `direct_conv3d` besides its input: output + per-worker buffers."""
    out = as_triple(a - k + 1 for a, k in zip(n, kernel, strict=True))
    blocks = _blocks(s, out, n, cin * prod(kernel), slab_bytes, workers)
    cap = max(block_columns(b[2] - b[1], b[4] - b[3], n[1], n[2], out[2]) for b in blocks)
    per_worker = worker_bytes(cin, cout, kernel, cap, n[2])
    return s * cout * prod(out) * FLOAT_BYTES + min(workers, len(blocks)) * per_worker


def worker_bytes(cin: int, cout: int, kernel: tuple[int, int, int], cap: int, nx: int) -> int:
    """One worker's buffers for blocks of at most `cap` positions: the column buffer (none
    for 1x1x1 kernels), the GEMM result and, with several GEMMs, the one added from."""
    rows, gemms = column_layout(cin, kernel)
    cols = rows * (cap + (gemms - 1) * nx) if prod(kernel) > 1 else 0
    return (cols + (2 if gemms > 1 else 1) * cout * cap) * FLOAT_BYTES
