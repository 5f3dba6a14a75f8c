"""Fragments: the basins of a steepest-ascent watershed on the affinity graph, found block
by block so that the partition does not depend on the blocks.

Every voxel points along its strongest edge (the first of -z, -y, -x, +z, +y, +x among equal
ones); edges at or above `high` join their voxels too; a voxel whose strongest edge is at or
below `low` is background (0), as in waterz's watershed. A pointer is decided by the voxel's
six edges alone, so the basins (the connected components of the pointer graph) are the same
whatever the blocking: a block labels the components of the pointer edges inside it
(connected-components-3d), and the pointer edges that cross its faces are joined later
(`graph.py` records them, `merge.py` unites them). A block's fragment is named by the
canonical id 1 + (the linear index, in the whole volume, of its first voxel in raster order),
so a basin's id (the least of its fragments') and a segment's are block-independent too.
"""

from __future__ import annotations

from dataclasses import dataclass

import cc3d
import fastremap
import numpy as np

from znni.engine.geometry import Box, Triple
from znni.triple import as_triple

# waterz's defaults for the initial watershed (waterz.agglomerate aff_threshold_low/high)
LOW = 0.0001
HIGH = 0.9999
# affinities are summed as integers of this scale, so sums are exact and the same in any
# order (block-independent statistics; the mean's resolution 2**-24 is float32's)
QUANTUM = 2**24
# connected-components-3d's voxel connectivity bits for axes (z, y, x) of a C-ordered array
# (it reads axis 0 as its x): (the bit towards -axis, the bit towards +axis)
_MINUS_BIT = (2, 8, 32)
_PLUS_BIT = (1, 4, 16)


def axis_slices(c: int, start: int | None, stop: int | None) -> tuple[slice, slice, slice]:
    """(z, y, x) slices taking start:stop along axis c and everything along the others."""
    index = [slice(None)] * 3
    index[c] = slice(start, stop)
    return (index[0], index[1], index[2])


@dataclass(frozen=True)
class Neighbourhood:
    """A box's voxels and the affinities of all their edges: `affs` (3, z, y, x) float32 over
    `box` grown by one voxel on each side within the region, `valid` (3, z, y, x) bool the
    edges (v, v - e_c) that exist (both voxels in the region and in the mask)."""

    box: Box  # the voxels whose six edges are known
    grown: Box  # what `affs` and `valid` cover
    affs: np.ndarray  # (3, Z, Y, X) over `grown`
    valid: np.ndarray  # (3, Z, Y, X) over `grown`


def edge_validity(grown: Box, region: Box, mask: np.ndarray | None) -> np.ndarray:
    """(3, z, y, x) over `grown`: whether edge (v, v - e_c) lies inside the region (and the
    mask, over `grown`, when given): the region's faces end the graph, as waterz's volume."""
    shape = grown.shape
    valid = np.ones((3, *shape), dtype=bool)  # (3, Z, Y, X)
    for c in range(3):
        if grown.lo[c] <= region.lo[c]:  # v - e_c leaves the region at its first plane
            valid[c][axis_slices(c, 0, region.lo[c] - grown.lo[c] + 1)] = False
    if mask is not None:
        inside = mask.astype(bool)
        valid &= inside[None]
        for c in range(3):
            before = np.zeros(shape, dtype=bool)  # whether v - e_c is in the mask
            before[axis_slices(c, 1, None)] = inside[axis_slices(c, 0, -1)]
            valid[c] &= before
    return valid


@dataclass(frozen=True)
class Pointers:
    """Each voxel's watershed links over a box: `down[c]` whether edge (v, v - e_c) joins
    its voxels (v points along it, v - e_c points back along it, or it is at least `high`);
    `foreground` whether the voxel belongs to any basin."""

    down: np.ndarray  # (3, z, y, x) bool, for the edges stored at each voxel
    foreground: np.ndarray  # (z, y, x) bool


def pointers(hood: Neighbourhood, low: float = LOW, high: float = HIGH) -> Pointers:
    """The watershed's links of the voxels of `hood.box` (module docstring). The edge to
    v - e_c counts when v - e_c is inside `hood.box` too (its own pointer is known). A
    voxel's six edges: towards -c the edge stored at the voxel, towards +c the one stored at
    v + e_c (none past the grown box); an edge that is not `hood.valid` does not exist."""
    from znni.engine.agglomerate.pointers_numba import NONE, directions, links_down

    lo = as_triple(b - g for b, g in zip(hood.box.lo, hood.grown.lo, strict=True))
    shape = hood.box.shape
    affs = np.ascontiguousarray(hood.affs, dtype=np.float32)  # (3, Z, Y, X) over grown
    valid = np.ascontiguousarray(hood.valid, dtype=bool)
    # the bounds as float32, as NumPy compares float32 values with a Python float
    choice = directions(affs, valid, lo, shape, np.float32(low))  # (z, y, x) int8
    down = links_down(affs, valid, lo, choice, np.float32(high))  # (3, z, y, x)
    return Pointers(down, choice != NONE)


def label_block(links: Pointers, box: Box, volume_shape: Triple) -> np.ndarray:
    """The block's fragments: connected components of its pointer links inside it, each
    named 1 + the whole-volume linear index of its first voxel (uint64; background 0)."""
    from znni.engine.agglomerate.pointers_numba import connectivity_bits

    graph = connectivity_bits(links.down, _MINUS_BIT, _PLUS_BIT)  # (z, y, x) uint8
    components = cc3d.color_connectivity_graph(graph, connectivity=6)
    components = np.where(links.foreground, components, 0)
    return canonical_ids(components, box, volume_shape)


def canonical_ids(components: np.ndarray, box: Box, volume_shape: Triple) -> np.ndarray:
    """Components (ids 0..N, 0 background) renamed 1 + the whole-volume linear index of
    their first voxel in raster order (uint64): the same name whatever labelled them."""
    flat = components.ravel()
    ids, first = fastremap.unique(flat, return_index=True)
    z, y, x = np.unravel_index(first, box.shape)
    Y, X = volume_shape[1], volume_shape[2]
    names = ((z + box.lo[0]).astype(np.uint64) * np.uint64(Y * X)
             + (y + box.lo[1]).astype(np.uint64) * np.uint64(X)
             + (x + box.lo[2]).astype(np.uint64) + np.uint64(1))
    names[ids == 0] = 0
    lookup = np.zeros(int(ids.max()) + 1, dtype=np.uint64)
    lookup[ids] = names
    return lookup[components]
