"""Direct convolution: im2col + one BLAS GEMM per slab of output rows.

Wins for 1^3-3^3 kernels and single-channel first layers, where FFTs of the
whole patch cost more than the few multiply-adds per output. Slabs (a
sample, a range of output z) are independent, so a thread pool runs them
concurrently; numpy releases the GIL in the copies and in BLAS.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from math import prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.cpu.threads import blas_single_thread

FLOAT_BYTES = 4


def _blocks(s: int, oz: int, oy: int, row_bytes: int, slab_bytes: int, workers: int) -> list:
    """(sample, z0, z1, y0, y1) blocks whose im2col matrix is about `slab_bytes`."""
    rows = max(1, slab_bytes // max(1, row_bytes))  # output (z, y) rows per block
    zb = max(1, min(oz, rows // oy))
    yb = oy if zb > 1 else max(1, min(oy, rows))
    while zb > 1 and s * -(-oz // zb) < 2 * workers:  # enough blocks for every worker
        zb = (zb + 1) // 2
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
    """Valid cross-correlation (S, Cin, n) x (Cout, Cin, k) -> (S, Cout, n-k+1), fused bias/act.

    Blocks of about `slab_bytes` of im2col: big enough for efficient GEMMs, never whole rows
    of a huge patch.
    """
    s, cin = x.shape[:2]
    cout = weight.shape[0]
    k = tuple(int(v) for v in weight.shape[2:])
    oz, oy, ox = (int(n) - kk + 1 for n, kk in zip(x.shape[2:], k, strict=True))
    depth = cin * prod(k)
    w2 = np.ascontiguousarray(weight.reshape(cout, depth), dtype=np.float32)  # (Cout, K)
    b2 = bias.astype(np.float32).reshape(cout, 1, 1, 1)
    out = np.empty((s, cout, oz, oy, ox), dtype=np.float32)

    def task(block: tuple[int, int, int, int, int]) -> None:
        si, z0, z1, y0, y1 = block
        src = x[si, :, z0 : z1 + k[0] - 1, y0 : y1 + k[1] - 1]
        win = sliding_window_view(src, k, axis=(1, 2, 3))  # (Cin, zb, yb, ox, kz, ky, kx)
        col = np.ascontiguousarray(win.transpose(0, 4, 5, 6, 1, 2, 3)).reshape(depth, -1)
        res = np.matmul(w2, col).reshape(cout, z1 - z0, y1 - y0, ox)  # (Cout, zb, yb, ox)
        res += b2
        if activation is not None:  # on the contiguous result, never on a strided view
            apply_activation(res, activation)
        out[si, :, z0:z1, y0:y1] = res

    blocks = _blocks(s, oz, oy, depth * ox * FLOAT_BYTES, slab_bytes, pool._max_workers)
    with blas_single_thread():
        list(pool.map(task, blocks))
    return out
