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


def direct_conv3d(
    pool: ThreadPoolExecutor,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    activation: Activation | None,
    slab_bytes: int = 2**23,
) -> np.ndarray:
    """Valid cross-correlation (S, Cin, n) x (Cout, Cin, k) -> (S, Cout, n-k+1), fused bias/act."""
    s, cin = x.shape[:2]
    cout = weight.shape[0]
    k = tuple(int(v) for v in weight.shape[2:])
    oz, oy, ox = (int(n) - kk + 1 for n, kk in zip(x.shape[2:], k, strict=True))
    depth = cin * prod(k)
    w2 = np.ascontiguousarray(weight.reshape(cout, depth), dtype=np.float32)  # (Cout, K)
    b2 = bias.astype(np.float32).reshape(cout, 1, 1, 1)
    out = np.empty((s, cout, oz, oy, ox), dtype=np.float32)
    zb = max(1, min(oz, slab_bytes // max(1, depth * oy * ox * FLOAT_BYTES)))
    # Enough slabs to keep every worker busy.
    workers = pool._max_workers
    while zb > 1 and s * -(-oz // zb) < 2 * workers:
        zb = (zb + 1) // 2

    def task(item: tuple[int, int]) -> None:
        si, z0 = item
        z1 = min(oz, z0 + zb)
        src = x[si, :, z0 : z1 + k[0] - 1]
        if depth == cin:  # 1x1x1 kernel: no copy needed
            col = src.reshape(cin, -1)
        else:
            win = sliding_window_view(src, k, axis=(1, 2, 3))  # (Cin, zb, oy, ox, kz, ky, kx)
            col = np.ascontiguousarray(win.transpose(0, 4, 5, 6, 1, 2, 3)).reshape(depth, -1)
        res = np.matmul(w2, col).reshape(cout, z1 - z0, oy, ox)  # (Cout, zb, oy, ox)
        res += b2
        if activation is not None:  # on the contiguous result, never on a strided view
            apply_activation(res, activation)
        out[si, :, z0:z1] = res

    with blas_single_thread():
        list(pool.map(task, [(si, z0) for si in range(s) for z0 in range(0, oz, zb)]))
    return out
