"""A block's part of the region graph: for every edge (v, v - e_c) with v in the block,
the fragments it joins, summed as exact integers per fragment pair (`fragments.QUANTUM`),
and the watershed links that cross the block's lower faces (the pairs of fragments that
are one basin). The fragment stage adds a block's inner edges (both voxels in it), the
face stage the edges across its three lower faces: each edge is counted once, and no
fragment pair appears in two parts (fragments are block-local), so the parts add up to the
whole volume's graph."""

from __future__ import annotations

from dataclasses import dataclass

import fastremap
import numpy as np

from znni.engine.agglomerate.fragments import (
    HIGH,
    LOW,
    QUANTUM,
    Neighbourhood,
    Pointers,
    pointers,
)
from znni.engine.agglomerate.graph_numba import Q_BITS as _Q_BITS
from znni.engine.agglomerate.graph_numba import edge_keys
from znni.engine.geometry import Box
from znni.triple import as_triple


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
                links: Pointers | None = None, axes: tuple[int, ...] = (0, 1, 2),
                low: float = LOW, high: float = HIGH) -> BlockGraph:
    """The graph of the edges (v, v - e_c) with v in `block`, v - e_c in `hood.box`, c in
    `axes`; `fragments` are `hood.box`'s, `links` its watershed links (computed when not
    given). With `hood.box` the block itself: the block's inner edges; with it grown by one
    plane below a face: the face's edges and the links across it."""
    links = links if links is not None else pointers(hood, low, high)
    box = hood.box
    local, ids = renumbered(fragments)  # (z, y, x) over `box`
    _check_pairs(np.int64(len(ids)))
    at = as_triple(e - g for e, g in zip(box.lo, hood.grown.lo, strict=True))
    inner = block.slices(box.lo)  # the block within `box`
    keys, joins = edge_keys(
        np.ascontiguousarray(local), np.ascontiguousarray(hood.valid, dtype=bool),
        np.ascontiguousarray(hood.affs, dtype=np.float32), links.down, at,
        as_triple(s.start for s in inner), as_triple(s.stop for s in inner),
        np.array(axes, np.int64), np.int64(len(ids)), float(QUANTUM))
    return _summed(keys, joins, ids, np.int64(len(ids)))


def renumbered(fragments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(local ids 0..k-1, 0 for background; the fragment of each local id)."""
    local, mapping = fastremap.renumber(fragments, preserve_zero=True, in_place=False)
    ids = np.zeros(len(mapping) + 1, dtype=np.uint64)
    names = np.fromiter(mapping.keys(), dtype=np.uint64, count=len(mapping))
    ids[np.fromiter(mapping.values(), dtype=np.int64, count=len(mapping))] = names
    return local, ids  # local: uint16/32, as narrow as the count allows (fast compares)


def _check_pairs(k: np.int64) -> None:
    """Pair keys (pair << _Q_BITS, pair < k^2) must fit an int64."""
    if int(k) ** 2 >= 2 ** (63 - _Q_BITS):
        raise ValueError(f"a block holds {int(k)} fragments, too many for its pair keys; "
                         "use smaller blocks")


def _summed(keys: np.ndarray, joins: np.ndarray, ids: np.ndarray, k: np.int64) -> BlockGraph:
    """Edges summed per fragment pair (one sort of pair << 25 | affinity, then sums over
    runs of equal pairs), joined pairs once each; pairs named by their fragments' ids."""
    packed = np.sort(keys)
    pair, q = packed >> _Q_BITS, packed & ((1 << _Q_BITS) - 1)
    starts = np.flatnonzero(np.diff(pair, prepend=-1)) if len(pair) else np.zeros(0, np.int64)
    total = np.add.reduceat(q, starts) if len(q) else np.zeros(0, np.int64)
    count = np.diff(np.append(starts, len(pair))).astype(np.int64)
    unique_pairs = pair[starts]
    joined = np.sort(joins)
    joined = joined[np.concatenate([[True], joined[1:] != joined[:-1]])] if len(joined) \
        else joined
    u, v = ids[unique_pairs // k], ids[unique_pairs % k]  # local order is not the ids'
    ju, jv = ids[joined // k], ids[joined % k]
    return BlockGraph(np.minimum(u, v), np.maximum(u, v), total.astype(np.int64), count,
                      np.minimum(ju, jv), np.maximum(ju, jv))


def concatenate(parts: list[BlockGraph]) -> BlockGraph:
    """Parts with no fragment pair in common, as one."""
    def joined(name: str, dtype: type) -> np.ndarray:
        arrays = [getattr(p, name) for p in parts]
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)

    return BlockGraph(joined("u", np.uint64), joined("v", np.uint64),
                      joined("affinity_sum", np.int64), joined("count", np.int64),
                      joined("joined_u", np.uint64), joined("joined_v", np.uint64))
