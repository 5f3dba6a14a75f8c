"""A block's part of the region graph: for every edge (v, v - e_c) with v in the block,
the fragments it joins, summed as exact integers per fragment pair (`fragments.QUANTUM`),
and the watershed links that cross the block's lower faces (the pairs of fragments that
are one basin). Each edge belongs to exactly one block (the one holding v), so the blocks'
graphs add up to the whole volume's with no pair counted twice."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from znni.engine.agglomerate.fragments import (
    HIGH,
    LOW,
    QUANTUM,
    Neighbourhood,
    axis_slices,
    pointers,
)
from znni.engine.geometry import Box


@dataclass(frozen=True)
class BlockGraph:
    """Fragment pairs (u < v) with their summed quantised affinity and edge count, and the
    fragment pairs one basin joins across the block's faces."""

    u: np.ndarray  # uint64
    v: np.ndarray  # uint64
    affinity_sum: np.ndarray  # int64, affinities times QUANTUM, summed
    count: np.ndarray  # int64, voxel edges
    joined_u: np.ndarray  # uint64
    joined_v: np.ndarray  # uint64

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.u, self.v, self.affinity_sum, self.count,
                                      self.joined_u, self.joined_v))


def block_graph(block: Box, hood: Neighbourhood, fragments: np.ndarray,
                low: float = LOW, high: float = HIGH) -> BlockGraph:
    """The graph of the edges at the voxels of `block`; `hood.box` is the block grown by one
    voxel towards -z, -y, -x (within the region) and `fragments` its fragments."""
    links = pointers(hood, low, high)
    box = hood.box
    in_block = np.zeros(box.shape, dtype=bool)
    in_block[block.slices(box.lo)] = True
    at = tuple(slice(e - g, e - g + n)  # `box` within the grown arrays
               for e, g, n in zip(box.lo, hood.grown.lo, box.shape, strict=True))
    pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    joins: list[tuple[np.ndarray, np.ndarray]] = []
    for c in range(3):
        v_at, below = axis_slices(c, 1, None), axis_slices(c, 0, -1)  # v, v - e_c in box
        fu, fv = fragments[v_at], fragments[below]
        valid = hood.valid[c][at][v_at]
        keep = valid & in_block[v_at] & (fu != 0) & (fv != 0) & (fu != fv)
        affs = hood.affs[c][at][v_at][keep]
        q = np.rint(affs.astype(np.float64) * QUANTUM).astype(np.int64)
        a, b = fu[keep], fv[keep]
        pairs.append((np.minimum(a, b), np.maximum(a, b), q))
        crossing = keep & ~in_block[below] & links.down[c][v_at]  # a link across a face
        a, b = fu[crossing], fv[crossing]
        joins.append((np.minimum(a, b), np.maximum(a, b)))
    return _summed(pairs, joins)


def _summed(pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
            joins: list[tuple[np.ndarray, np.ndarray]]) -> BlockGraph:
    """Edges summed per fragment pair; joined pairs once each."""
    u = np.concatenate([p[0] for p in pairs]).astype(np.uint64)
    v = np.concatenate([p[1] for p in pairs]).astype(np.uint64)
    q = np.concatenate([p[2] for p in pairs])
    u, v, total, count = sum_pairs(u, v, q, np.ones(len(q), dtype=np.int64))
    ju = np.concatenate([j[0] for j in joins]).astype(np.uint64)
    jv = np.concatenate([j[1] for j in joins]).astype(np.uint64)
    ju, jv, _, _ = sum_pairs(ju, jv, np.zeros(len(ju), np.int64), np.zeros(len(ju), np.int64))
    return BlockGraph(u, v, total, count, ju, jv)


def sum_pairs(u: np.ndarray, v: np.ndarray, total: np.ndarray, count: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows with equal (u, v) added up, sorted by (u, v). Sums go through float64 bincounts,
    exact while they stay below 2**53 (a pair's quantised sum: 2**24 per voxel edge)."""
    if len(u) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return u.astype(np.uint64), v.astype(np.uint64), empty, empty
    ids, inverse = np.unique(np.concatenate([u, v]), return_inverse=True)
    n = np.int64(len(ids))
    key = inverse[:len(u)].astype(np.int64) * n + inverse[len(u):]  # (u, v) as one int64
    keys, rows = np.unique(key, return_inverse=True)
    summed = np.bincount(rows, weights=total, minlength=len(keys))
    counts = np.bincount(rows, weights=count, minlength=len(keys))
    return (ids[keys // n], ids[keys % n], summed.astype(np.int64), counts.astype(np.int64))
