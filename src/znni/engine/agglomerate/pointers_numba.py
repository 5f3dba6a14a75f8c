"""The watershed's pointers of a block's voxels in two compiled passes (Numba, no GIL).

The NumPy form of the same rule (six (z, y, x) planes of edge values, their maximum, the
first direction equal to it, then the links per axis) made about ten block-sized
temporaries; two compute threads faulting them in at once ran 2.5x slower than one thread
alone (128^3 block, 2-core AMD EPYC, 2026-11-29). Here each voxel reads its six edges once
and two threads run side by side. `fragments.pointers` states the rule; the tests hold it
to a voxel-by-voxel reference (tests/support/agglomerate_ref.py). Numba compiles these
kernels and graph_numba's once per install and caches them (3.4 s of a first run on that
host; the greedy loop's kernels take another ~9.5 s).
"""

from __future__ import annotations

import numpy as np
from numba import njit

NONE = -1  # a background voxel's direction: no edge above `low`


@njit(cache=True, nogil=True)
def directions(affs: np.ndarray, valid: np.ndarray, lo: tuple[int, int, int],
               shape: tuple[int, int, int], low: np.float32) -> np.ndarray:
    """(z, y, x) int8 over the box: the first of -z, -y, -x, +z, +y, +x (0..5) among the
    voxel's strongest edges, NONE where that edge is at or below `low` or an edge is NaN
    (NumPy's maximum is then NaN, which is no foreground). An edge towards -c is stored at
    the voxel, one towards +c at v + e_c (none past the grown box, none where not valid)."""
    out = np.empty(shape, np.int8)
    ends = affs.shape[1:]
    for i in range(shape[0]):
        z = i + lo[0]
        for j in range(shape[1]):
            y = j + lo[1]
            for k in range(shape[2]):
                x = k + lo[2]
                best, choice, nan = np.float32(-np.inf), 0, False
                for c in range(3):  # towards -c
                    if valid[c, z, y, x]:
                        v = affs[c, z, y, x]
                        if v != v:
                            nan = True
                        elif v > best:
                            best, choice = v, c
                for c in range(3):  # towards +c
                    zz, yy, xx = z + (c == 0), y + (c == 1), x + (c == 2)
                    if zz < ends[0] and yy < ends[1] and xx < ends[2] and valid[c, zz, yy, xx]:
                        v = affs[c, zz, yy, xx]
                        if v != v:
                            nan = True
                        elif v > best:
                            best, choice = v, 3 + c
                out[i, j, k] = choice if best > low and not nan else NONE
    return out


@njit(cache=True, nogil=True)
def links_down(affs: np.ndarray, valid: np.ndarray, lo: tuple[int, int, int],
               choice: np.ndarray, high: np.float32) -> np.ndarray:
    """(3, z, y, x) bool: whether edge (v, v - e_c) joins its voxels: it exists and v points
    along it, or v - e_c (inside the box) points back along it, or it is at least `high`
    and the voxel at either end that says so is foreground."""
    nz, ny, nx = choice.shape
    down = np.zeros((3, nz, ny, nx), np.bool_)
    for c in range(3):
        for i in range(nz):
            for j in range(ny):
                for k in range(nx):
                    if not valid[c, i + lo[0], j + lo[1], k + lo[2]]:
                        continue
                    v = affs[c, i + lo[0], j + lo[1], k + lo[2]]
                    if v != v:  # NaN: no edge (NumPy's comparison with -inf is False)
                        continue
                    here = choice[i, j, k]
                    if here != NONE and (here == c or v >= high):
                        down[c, i, j, k] = True
                        continue
                    pi, pj, pk = i - (c == 0), j - (c == 1), k - (c == 2)
                    if pi < 0 or pj < 0 or pk < 0:
                        continue
                    there = choice[pi, pj, pk]
                    if there != NONE and (there == 3 + c or v >= high):
                        down[c, i, j, k] = True
    return down


@njit(cache=True, nogil=True)
def connectivity_bits(down: np.ndarray, minus_bits: tuple[int, int, int],
                      plus_bits: tuple[int, int, int]) -> np.ndarray:
    """(z, y, x) uint8: connected-components-3d's 6-way connectivity graph of the links
    inside the box: a link (v, v - e_c) with v - e_c in the box sets v's -c bit and
    v - e_c's +c bit (a link to the box below is joined across its face later)."""
    nz, ny, nx = down.shape[1:]
    graph = np.zeros((nz, ny, nx), np.uint8)
    for c in range(3):
        for i in range(nz):
            for j in range(ny):
                for k in range(nx):
                    if not down[c, i, j, k]:
                        continue
                    pi, pj, pk = i - (c == 0), j - (c == 1), k - (c == 2)
                    if pi < 0 or pj < 0 or pk < 0:
                        continue
                    graph[i, j, k] |= minus_bits[c]
                    graph[pi, pj, pk] |= plus_bits[c]
    return graph
