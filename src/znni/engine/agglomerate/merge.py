"""The global step: the blocks' graphs joined into basins, then mean-affinity agglomeration
of the basin graph for each threshold, on the graph alone (the volume is not read).

Agglomeration merges, while any is left, the pair of regions whose boundary has the highest
mean affinity, as long as 1 - mean < threshold (waterz's `OneMinus<MeanAffinity>`); a merged
region's boundary with a third is the union of both boundaries (sums and counts added).
The merges run in a compiled greedy loop (`greedy_numba.py`) over the edges that can take
part; ties are broken by the regions' canonical order, so the result is block-independent.

Memory: per basin edge 4 + 4 bytes (regions, int32) and 8 + 8 (summed affinity, count);
the greedy loop about 100 bytes per edge it sees. `MEMORY_PER_EDGE_BYTES` is the measured
peak per edge of the whole step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from znni.engine.agglomerate.fragments import QUANTUM
from znni.engine.agglomerate.graph import BlockGraph
from znni.engine.agglomerate.greedy_numba import greedy

# the whole process's peak memory per edge of the joined blocks' graphs, measured: 4.4 GB
# of peak RSS for 22 M edges (benchmarks/agglomerate.py, 256x384x384, noise 0.1; docs/
# benchmarks.md "Agglomeration"): a 10**8-edge graph needs about 19 GiB
MEMORY_PER_EDGE_BYTES = 200


@dataclass(frozen=True)
class BasinGraph:
    """Basins (ids ascending, canonical: 1 + their first voxel's linear index) and the
    edges between them, as indices into `ids` (a < b), summed."""

    ids: np.ndarray  # uint64, ascending
    fragments: np.ndarray  # uint64, every fragment with an edge, ascending
    basin_of: np.ndarray  # int32/int64: each of `fragments`' basin (index into ids)
    a: np.ndarray
    b: np.ndarray
    total: np.ndarray  # int64, quantised affinities summed
    count: np.ndarray  # int64


def basin_graph(parts: Sequence[BlockGraph]) -> BasinGraph:
    """The blocks' graphs as one graph of basins: fragments joined across block faces made
    one basin (named by its least fragment), their edges summed per basin pair."""
    u = np.concatenate([p.u for p in parts]) if parts else np.zeros(0, np.uint64)
    v = np.concatenate([p.v for p in parts]) if parts else np.zeros(0, np.uint64)
    ju = np.concatenate([p.joined_u for p in parts]) if parts else np.zeros(0, np.uint64)
    jv = np.concatenate([p.joined_v for p in parts]) if parts else np.zeros(0, np.uint64)
    fragments = sorted_unique(np.concatenate([u, v, ju, jv]))
    n = len(fragments)
    ji, jj = np.searchsorted(fragments, ju), np.searchsorted(fragments, jv)
    links = coo_matrix((np.ones(len(ji), np.int8), (ji, jj)), shape=(n, n))
    _, component = connected_components(links, directed=False)
    # a component's first fragment (ascending ids) is its least: the basin's canonical id
    first = np.full(int(component.max()) + 1 if n else 0, n, dtype=np.int64)
    positions = np.arange(n, dtype=np.int64)
    first[component[::-1]] = positions[::-1]  # the last write (the first position) wins
    order = np.argsort(first)  # basins in the order of their ids
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    basin_of = rank[component]
    ids = fragments[np.sort(first)]
    index = _index_dtype(len(ids))
    a = basin_of[np.searchsorted(fragments, u)].astype(index)
    b = basin_of[np.searchsorted(fragments, v)].astype(index)
    total = np.concatenate([p.affinity_sum for p in parts]) if parts else np.zeros(0, np.int64)
    count = np.concatenate([p.count for p in parts]) if parts else np.zeros(0, np.int64)
    a, b, total, count = _resum(np.minimum(a, b), np.maximum(a, b), total, count, len(ids))
    return BasinGraph(ids, fragments, basin_of.astype(index), a, b, total, count)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (a sort: NumPy 2's hashing np.unique is slower here)."""
    ordered = np.sort(values)
    if len(ordered) == 0:
        return ordered
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]


def _index_dtype(n: int) -> type[np.signedinteger]:
    return np.int32 if n < 2**31 else np.int64


def _resum(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray, n: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of equal (a, b) added up and self-loops (a == b) dropped; sorted by (a, b).
    Sums through float64 bincounts are exact below 2**53."""
    loop = a == b
    if loop.any():
        keep = ~loop
        a, b, total, count = a[keep], b[keep], total[keep], count[keep]
    key = a.astype(np.int64) * np.int64(n) + b
    order = np.argsort(key)
    key = key[order]
    starts = np.flatnonzero(np.diff(key, prepend=-1)) if len(key) else np.zeros(0, np.int64)
    keys = key[starts]
    summed = np.add.reduceat(total[order], starts) if len(key) else np.zeros(0, np.int64)
    counts = np.add.reduceat(count[order], starts) if len(key) else np.zeros(0, np.int64)
    dtype = a.dtype
    return (keys // n).astype(dtype), (keys % n).astype(dtype), summed, counts


def agglomerate(graph: BasinGraph, thresholds: Sequence[float]) -> Iterator[np.ndarray]:
    """For each threshold (ascending), each basin's segment as the index of its least basin
    (so a segment's canonical id is `graph.ids[segment]`). Each threshold continues from the
    previous one's merges, as waterz's threshold sweep does."""
    n = len(graph.ids)
    segment = np.arange(n, dtype=_index_dtype(n))
    a, b, total, count = graph.a, graph.b, graph.total, graph.count
    for threshold in sorted(thresholds):
        names = merge_until(a, b, total, count, n, threshold).astype(segment.dtype)
        segment = names[segment]
        na, nb = names[a], names[b]
        a, b, total, count = _resum(np.minimum(na, nb), np.maximum(na, nb), total, count, n)
        yield segment


def merge_until(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray, n: int,
                threshold: float) -> np.ndarray:
    """Each region's name after merging until no edge scores below the threshold (the
    least region merged with it).

    Only edges inside the connected components of the edges below the threshold take part:
    a merged edge's mean lies between its parts', so an edge between two such components is
    never below the threshold. The merges are the compiled greedy loop's
    (`greedy_numba.py`), on the regions those edges name (renumbered 0..k-1 for it)."""
    parent = np.arange(n, dtype=np.int64)
    below = scores(total, count) < threshold
    if not below.any():
        return parent
    links = coo_matrix((np.ones(int(below.sum()), np.int8), (a[below], b[below])), shape=(n, n))
    _, component = connected_components(links, directed=False)
    inside = component[a] == component[b]
    a, b, total, count = a[inside], b[inside], total[inside], count[inside]
    regions = sorted_unique(np.concatenate([a, b]))
    local = greedy(np.searchsorted(regions, a), np.searchsorted(regions, b), total, count,
                   len(regions), threshold)
    roots = _roots(local)
    least = np.arange(len(regions))  # each tree's least region (the merged region's name)
    np.minimum.at(least, roots, np.arange(len(regions)))
    parent[regions] = regions[least[roots]]
    return parent


def _roots(parent: np.ndarray) -> np.ndarray:
    """Each region's root (vectorised pointer jumping)."""
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


def scores(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """1 - mean affinity of each edge (waterz's OneMinus<MeanAffinity>), float64."""
    return 1.0 - total / (count.astype(np.float64) * QUANTUM)


def premerge(inner: BlockGraph, open_fragments: np.ndarray, threshold: float
             ) -> tuple[np.ndarray, np.ndarray, BlockGraph]:
    """A block's inner graph agglomerated as far as it can be without its neighbours:
    (fragments, the region each became (its least fragment), the graph between regions).
    `open_fragments` touch a face shared with another block; they and any fragment whose
    best edge leads to one stay (`greedy`'s `frozen`). Every merge made here is one the
    whole volume's agglomeration makes at `threshold` and above."""
    fragments = sorted_unique(np.concatenate([inner.u, inner.v]))
    a, b = np.searchsorted(fragments, inner.u), np.searchsorted(fragments, inner.v)
    frozen = np.isin(fragments, open_fragments)
    parent = greedy(a, b, inner.affinity_sum, inner.count, len(fragments), threshold, frozen)
    roots = _roots(parent)
    least = np.arange(len(fragments))
    np.minimum.at(least, roots, np.arange(len(fragments)))
    region = least[roots]  # (k,) each fragment's region, as an index of its least fragment
    ra, rb = region[a], region[b]
    ra, rb, total, count = _resum(np.minimum(ra, rb), np.maximum(ra, rb), inner.affinity_sum,
                                  inner.count, len(fragments))
    empty = np.zeros(0, np.uint64)
    graph = BlockGraph(fragments[ra], fragments[rb], total, count, empty, empty)
    return fragments, fragments[region], graph


def segment_table(graph: BasinGraph, segment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fragments, their segment ids): every fragment with an edge and the canonical id of
    its segment; a fragment that is not listed is a segment of its own."""
    return graph.fragments, graph.ids[segment[graph.basin_of]]
