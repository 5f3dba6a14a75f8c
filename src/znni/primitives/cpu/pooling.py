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


BLOCK_BYTES = 2**20  # input per MPF block: about L2-sized, so temporaries stay in cache


def mpf_blocks(
    c: int, nz: int, ny: int, nx: int, pz: int, itemsize: int, block_bytes: int = BLOCK_BYTES
) -> tuple[int, int]:
    """(channels, fragment rows) per MPF block: whole small images grouped by channel, big
    images one channel and a few z-planes at a time, about `block_bytes` of input each."""
    mz = fragment_size(nz, pz)
    image_bytes = nz * ny * nx * itemsize
    if image_bytes <= block_bytes:
        return max(1, min(c, block_bytes // image_bytes)), mz
    return 1, max(1, min(mz, block_bytes // (pz * ny * nx * itemsize)))


def mpf(
    x: np.ndarray,
    window: Triple,
    pool: ThreadPoolExecutor | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> np.ndarray:
    """(S, C, Z, Y, X) -> (S*pz*py*px, C, mz, my, mx) max-pooling fragments.

    Blocks of about BLOCK_BYTES (mpf_blocks) are filtered one at a time so the sliding-max
    temporaries stay in cache: the input is read once and the fragments written once,
    instead of a full-size temporary per axis (fresh, page-faulted arrays the input's size,
    each passing through DRAM). With a `pool`, blocks of channels run concurrently (numpy
    releases the GIL in `np.maximum` and the copies).
    """
    s, c, nz, ny, nx = x.shape
    pz, py, px = window
    mz, my, mx = fragment_size(nz, pz), fragment_size(ny, py), fragment_size(nx, px)
    out = np.empty((s, pz, py, px, c, mz, my, mx), dtype=x.dtype)
    cc, rows = mpf_blocks(c, nz, ny, nx, pz, x.dtype.itemsize, block_bytes)

    def task(block: tuple[int, int]) -> None:
        si, c0 = block
        c1 = min(c, c0 + cc)
        for i0 in range(0, mz, rows):
            i1 = min(mz, i0 + rows)
            # dense rows pz*i0 .. pz*i1 - 1 need input rows up to pz*i1 + pz - 2 (< nz)
            dense = sliding_max(x[si, c0:c1, pz * i0 : pz * i1 + pz - 1], window)
            for oz in range(pz):
                for oy in range(py):
                    for ox in range(px):
                        out[si, oz, oy, ox, c0:c1, i0:i1] = dense[
                            :, oz::pz, oy : oy + py * my : py, ox : ox + px * mx : px
                        ]

    blocks = [(si, c0) for si in range(s) for c0 in range(0, c, cc)]
    if pool is None or len(blocks) == 1:
        for block in blocks:
            task(block)
    else:
        list(pool.map(task, blocks))
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
