"""Vectorised max-pool and max-pooling fragments (MPF).

MPF = a dense (stride-1) max filter of window p, computed separably with
p - 1 `np.maximum` calls per axis, then strided slices: fragment offset o
holds the filtered positions o + p*i. The result is laid out exactly as
`fragments.fragments_reference` (sample outer, then offsets z, y, x).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from znni.primitives.base import Triple
from znni.primitives.fragments import fragment_size


def sliding_max(x: np.ndarray, window: Triple) -> np.ndarray:
    """Stride-1 max filter over the last three axes: (..., n) -> (..., n - p + 1)."""
    out = x
    for axis, p in zip((-3, -2, -1), window, strict=True):
        if p == 1:
            continue
        n = out.shape[axis] - p + 1
        idx = [slice(None)] * out.ndim
        idx[axis] = slice(0, n)
        acc = out[tuple(idx)].copy()
        for o in range(1, p):
            idx[axis] = slice(o, o + n)
            np.maximum(acc, out[tuple(idx)], out=acc)
        out = acc
    return out if out is not x else x.copy()


def mpf(x: np.ndarray, window: Triple, pool: ThreadPoolExecutor | None = None) -> np.ndarray:
    """(S, C, Z, Y, X) -> (S*pz*py*px, C, mz, my, mx) max-pooling fragments.

    With a `pool`, (sample, channel-range) slices run concurrently (numpy releases the
    GIL in `np.maximum` and the copies); each slice's sliding-max temporaries are the
    slice's size, so the peak is below the single-threaded one.
    """
    s, c, nz, ny, nx = x.shape
    pz, py, px = window
    mz, my, mx = fragment_size(nz, pz), fragment_size(ny, py), fragment_size(nx, px)
    out = np.empty((s, pz, py, px, c, mz, my, mx), dtype=x.dtype)
    workers = pool._max_workers if pool is not None else 1
    step = max(1, -(-c // max(1, -(-2 * workers // s))))  # >= 2 slices per worker
    slices = [(si, c0, min(c, c0 + step)) for si in range(s) for c0 in range(0, c, step)]

    def task(sl: tuple[int, int, int]) -> None:
        si, c0, c1 = sl
        dense = sliding_max(x[si, c0:c1], window)  # (c1-c0, nz-pz+1, ny-py+1, nx-px+1)
        for oz in range(pz):
            for oy in range(py):
                for ox in range(px):
                    out[si, oz, oy, ox, c0:c1] = dense[
                        :, oz : oz + pz * mz : pz, oy : oy + py * my : py, ox : ox + px * mx : px
                    ]

    if pool is None or len(slices) == 1:
        for sl in slices:
            task(sl)
    else:
        list(pool.map(task, slices))
    return out.reshape(s * pz * py * px, c, mz, my, mx)  # (S*P, C, mz, my, mx)


def maxpool(x: np.ndarray, window: Triple) -> np.ndarray:
    """Strided max-pool (S, C, Z, Y, X) -> (S, C, Z//pz, Y//py, X//px), remainders dropped."""
    pz, py, px = window
    mz, my, mx = (n // p for n, p in zip(x.shape[2:], window, strict=True))
    out: np.ndarray | None = None
    for oz in range(pz):
        for oy in range(py):
            for ox in range(px):
                v = x[:, :, oz : oz + pz * mz : pz, oy : oy + py * my : py, ox : ox + px * mx : px]
                out = v.copy() if out is None else np.maximum(out, v, out=out)
    assert out is not None  # windows are >= 1
    return out
