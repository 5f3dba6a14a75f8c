"""Direct convolution: GEMMs over shifted flat views of the input (no full im2col).

Wins for 1^3-3^3 kernels and single-channel first layers, where FFTs of the
whole patch cost more than the few multiply-adds per output. With the input
image flattened to (Cin, Z*Y*X), kernel offset (dz, dy, dx) is a constant
shift dz*Y*X + dy*X + dx, so the columns of a block of consecutive output
positions are contiguous runs of the input: one strided view (Cin, kz, ky,
kx, L) gathers them with memcpy-like copies into a small per-worker column
buffer that stays in cache, then one BLAS GEMM (Cout, Cin*k^3) @ (Cin*k^3, L)
makes L outputs. Positions with x >= ox or y >= oy inside a block are
computed and dropped (a (Y*X)/(oy*ox) overhead, ~7% at 64^3 with k = 3).

Memory (for the planner): the output (S, Cout, oz, oy, ox) float32, plus per
worker thread one column buffer (Cin*kz*ky*kx, L) (none when the kernel is
1x1x1: the view is used directly) and one GEMM result (Cout, L), float32,
where L = (zb - 1)*Y*X + (yb - 1)*X + ox for blocks of zb planes (yb = oy)
or of yb rows in one plane (zb = 1); see `_blocks` for how zb, yb follow
from `slab_bytes`. Workers pull blocks from a shared queue, so both cores
stay busy on a shared machine; BLAS runs single-threaded inside the pool.
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

FLOAT_BYTES = 4

Block = tuple[int, int, int, int, int]  # (sample, z0, z1, y0, y1) of the output


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
    """(zb, yb): blocks whose column buffer (depth, L) is about `slab_bytes`, >= 2 per worker
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
    kz, ky, kx = (int(v) for v in weight.shape[2:])
    out_size = (nz - kz + 1, ny - ky + 1, nx - kx + 1)
    oz, oy, ox = out_size
    depth = cin * kz * ky * kx
    w2 = np.ascontiguousarray(weight.reshape(cout, depth), dtype=np.float32)  # (Cout, K)
    b2 = bias.astype(np.float32).reshape(cout, 1)
    out = np.empty((s, cout, *out_size), dtype=np.float32)
    blocks = _blocks(s, out_size, (nz, ny, nx), depth, slab_bytes, pool._max_workers)
    plane, vol = ny * nx, nz * ny * nx
    it = iter(blocks)
    lock = threading.Lock()

    def next_block() -> Block | None:
        with lock:
            return next(it, None)

    def worker() -> None:
        cap = max(block_columns(b[2] - b[1], b[4] - b[3], ny, nx, ox) for b in blocks)
        col_buf = np.empty(depth * cap, np.float32) if kz * ky * kx > 1 else None
        res_buf = np.empty(cout * cap, np.float32)
        while (blk := next_block()) is not None:
            si, z0, z1, y0, y1 = blk
            cols = block_columns(z1 - z0, y1 - y0, ny, nx, ox)
            src = x[si].reshape(cin, vol)[:, z0 * plane + y0 * nx :]  # (Cin, ...) a view
            st = FLOAT_BYTES
            shifted = as_strided(  # (Cin, kz, ky, kx, L): column (c, dz, dy, dx) at a shift
                src,
                (cin, kz, ky, kx, cols),
                (vol * st, plane * st, nx * st, st, st),
                writeable=False,
            )
            if col_buf is None:
                col = shifted.reshape(cin, cols)  # 1x1x1 kernel: a strided view, no copy
            else:
                col = col_buf[: depth * cols].reshape(cin, kz, ky, kx, cols)
                np.copyto(col, shifted)
                col = col.reshape(depth, cols)
            res = res_buf[: cout * cols].reshape(cout, cols)
            np.matmul(w2, col, out=res)
            res += b2
            if activation is not None:  # on the contiguous result, never on a strided view
                apply_activation(res, activation)
            r = res_buf[: cout * cols]
            valid = as_strided(  # (Cout, zb, yb, ox) of the flat result
                r,
                (cout, z1 - z0, y1 - y0, ox),
                (cols * st, plane * st, nx * st, st),
                writeable=False,
            )
            out[si, :, z0:z1, y0:y1] = valid

    workers = min(pool._max_workers, len(blocks))
    with blas_single_thread():
        futures = [pool.submit(worker) for _ in range(workers)]
        for f in futures:
            f.result()
    return out


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
    out = tuple(a - k + 1 for a, k in zip(n, kernel, strict=True))
    depth = cin * prod(kernel)
    blocks = _blocks(s, out, n, depth, slab_bytes, workers)  # type: ignore[arg-type]
    cap = max(block_columns(b[2] - b[1], b[4] - b[3], n[1], n[2], out[2]) for b in blocks)
    per_worker = (cout + (depth if prod(kernel) > 1 else 0)) * cap * FLOAT_BYTES
    return s * cout * prod(out) * FLOAT_BYTES + min(workers, len(blocks)) * per_worker
