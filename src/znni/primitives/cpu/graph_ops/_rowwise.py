"""Per-row moments and per-row affine maps (+ activation) of a (R, L) float32 array.

The normalisations read a volume once for its statistics and once more for the
fused (x - c) * a + b and activation, in cache-sized tiles (a few rows, or a
part of one row): the temporaries stay in L2 and the tiles run on all cores.
Each tile's moments are taken about the tile's own float32 mean (so |mean| >>
std loses nothing), then the tiles combine exactly in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.cpu.graph_ops._parallel import PIN_BLAS_BYTES, run_tiles

# elements per tile: cache-sized, yet few numpy calls per volume (the affine pass's
# five calls per tile favour the larger)
MOMENTS_TILE = 1 << 16
AFFINE_TILE = 1 << 17
# values per row of a tile that pick its centre
SAMPLE = 1024

Tile = tuple[int, int, int, int]  # rows r0:r1, columns c0:c1
Moments = tuple[list[float], list[float]]  # (means, M2s) of a tile's rows


def tiles(rows: int, length: int, tile: int) -> list[Tile]:
    """(r0, r1, c0, c1) covering a (rows, length) array with tiles of about `tile`
    elements: whole rows, or even parts of one."""
    if length >= tile:
        parts = -(-length // tile)
        cuts = [length * i // parts for i in range(parts + 1)]
        return [(r, r + 1, cuts[i], cuts[i + 1]) for r in range(rows) for i in range(parts)]
    per = max(1, tile // length)
    return [(r, min(r + per, rows), 0, length) for r in range(0, rows, per)]


def _one_row(t: np.ndarray, ones: np.ndarray, scratch: np.ndarray) -> tuple[float, float]:
    """(mean, M2) of a contiguous 1-D tile, by BLAS dots about its head's mean."""
    k = t.size
    centre = t[:SAMPLE].sum() / np.float32(min(k, SAMPLE))  # float32
    d = np.subtract(t, centre, out=scratch[:k])
    s1, s2 = float(np.dot(d, ones[:k])), float(np.dot(d, d))  # sdot: faster than numpy's sum
    return float(centre) + s1 / k, max(s2 - s1 * s1 / k, 0.0)


def _rows(t: np.ndarray, ones: np.ndarray, scratch: np.ndarray) -> Moments:
    """(means, M2s) of the whole rows of a contiguous (r, k) tile, as `_one_row`."""
    k = t.shape[1]
    centre = t[:, :SAMPLE].sum(axis=1) / np.float32(min(k, SAMPLE))  # float32 (r,)
    d = np.subtract(t, centre[:, None], out=scratch[: t.size].reshape(t.shape))
    s1 = np.dot(d, ones[:k]).astype(np.float64)
    vecdot = getattr(np, "vecdot", None)  # numpy >= 2
    s2 = vecdot(d, d) if vecdot is not None else np.einsum("ij,ij->i", d, d)
    m2 = np.maximum(s2.astype(np.float64) - s1 * s1 / k, 0.0)
    return (centre + s1 / k).tolist(), m2.tolist()


def _tile_moments(rows: np.ndarray, run: Sequence[Tile]) -> list[Moments]:
    """(means, M2s = sums of squared deviations) of each tile's rows, float64.

    Each row is centred on the mean of its first SAMPLE values: near the mean, in
    units of the spread, is all the centred sums need (a centre c standard deviations
    off costs a factor 1 + c^2 in the rounding of M2); the centred tile's own sum
    (s1) then corrects the centre exactly. (A strided sample missed the cache.)"""
    scratch = np.empty(max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in run), np.float32)
    ones = np.ones(max(c1 - c0 for _, _, c0, c1 in run), np.float32)
    out = []
    for r0, r1, c0, c1 in run:
        if r1 - r0 == 1:  # scalar bookkeeping: numpy's per-call cost shows on 1-row tiles
            m, q = _one_row(rows[r0, c0:c1], ones, scratch)
            out.append(([m], [q]))
        else:
            out.append(_rows(rows[r0:r1, c0:c1], ones, scratch))  # (r, k) whole rows
    return out


def row_moments(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and biased variance of each row of a C-contiguous (R, L) float32 array, float64."""
    r, length = rows.shape
    if rows.nbytes < PIN_BLAS_BYTES:  # small: numpy's pairwise sums, no BLAS threads, whose
        # split of a long dot product would make the last bits depend on the thread count
        mean = rows.mean(axis=1, dtype=np.float64)
        return mean, np.square(rows - mean[:, None]).mean(axis=1)
    grid = tiles(r, length, MOMENTS_TILE)
    parts = run_tiles(lambda run: _tile_moments(rows, run), grid, rows.nbytes)
    row = np.concatenate([np.arange(r0, r1) for r0, r1, _, _ in grid])  # (tiles' rows,)
    k = np.concatenate([np.full(r1 - r0, c1 - c0, np.float64) for r0, r1, c0, c1 in grid])
    m = np.array([v for p in parts for v in p[0]])
    q = np.array([v for p in parts for v in p[1]])
    mean = np.bincount(row, k * m, r) / length
    # Chan et al.'s exact merge of the tiles' M2 about their own means
    m2 = np.bincount(row, q + k * (m - mean[row]) ** 2, r)
    return mean, m2 / length


def _activate(o: np.ndarray, act: Activation | None, scratch: np.ndarray) -> None:
    """act on a contiguous tile in place (scratch: a buffer of the tile's size)."""
    if act is None or act.kind == "linear":
        return
    if act.kind == "relu":
        np.maximum(o, np.float32(0), out=o)
    elif act.kind == "leaky_relu":
        slope = np.float32(act.slope)
        neg = np.multiply(o, slope, out=scratch)  # max(x, s x) for s <= 1, else min
        (np.maximum if slope <= 1 else np.minimum)(o, neg, out=o)
    else:
        apply_activation(o, act)


def _tile_affine(
    src: np.ndarray,
    dst: np.ndarray,
    coef: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    act: Activation | None,
    run: Sequence[Tile],
) -> list[None]:
    a, b, centre = coef
    scratch = np.empty(max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in run), np.float32)
    for r0, r1, c0, c1 in run:
        t, o = src[r0:r1, c0:c1], dst[r0:r1, c0:c1]  # (r, k)
        if centre is not None:
            np.subtract(t, centre[r0:r1], out=o)
            np.multiply(o, a[r0:r1], out=o)
        else:
            np.multiply(t, a[r0:r1], out=o)
        np.add(o, b[r0:r1], out=o)
        _activate(o, act, scratch[: o.size].reshape(o.shape))
    return [None] * len(run)


def affine_rows(
    src: np.ndarray,
    dst: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    centre: np.ndarray | None,
    act: Activation | None,
) -> np.ndarray:
    """dst[r] = act((src[r] - centre[r]) * a[r] + b[r]) on C-contiguous (R, L); dst may be src."""
    r, length = src.shape
    coef = (
        a.astype(np.float32).reshape(r, 1),
        b.astype(np.float32).reshape(r, 1),
        None if centre is None else centre.astype(np.float32).reshape(r, 1),
    )
    run_tiles(
        lambda run: _tile_affine(src, dst, coef, act, run),
        tiles(r, length, AFFINE_TILE),
        src.nbytes,
    )
    return dst
