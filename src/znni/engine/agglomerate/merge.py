"""The global step: the blocks' graphs joined into basins, then mean-affinity agglomeration
of the basin graph for each threshold, on the graph alone (the volume is not read).

Agglomeration merges, while any is left, the pair of regions whose boundary has the highest
mean affinity, as long as 1 - mean < threshold (waterz's `OneMinus<MeanAffinity>`); a merged
region's boundary with a third is the union of both boundaries (sums and counts added).
The merges run in a compiled greedy loop (`greedy_numba.py`) over the edges that can take
part; ties are broken by the regions' canonical order, so the result is block-independent.

Memory per basin edge: the graph itself 4 + 4 bytes (regions, int32) and 8 + 8 (summed
affinity, count); the join peaks at about 85 bytes (`basin_graph`), the greedy loop at
about 110 (the graph, the loop's own int32 ends, sums and counts of the edges it sees, list
slots, hash slots and its indexed heap: `greedy_numba.py`). `MEMORY_PER_EDGE_BYTES` is the
measured peak per edge of the whole process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from znni.engine.agglomerate.fragments import QUANTUM
from znni.engine.agglomerate.graph import BlockGraph
from znni.engine.agglomerate.greedy_numba import greedy, index_dtype

# the whole process's peak memory per basin edge, measured: 2.18 GB of peak RSS for 16.8 M
# edges (130 bytes each, the process's ~0.6 GB before the global step included; znni 64^3
# blocks on benchmarks/agglomerate.py's 256x384x384 at noise 0.1) and 12.14 GB for a
# synthetic 96.5 M-edge graph (126 bytes each; benchmarks/agglomerate_memory.py; docs/
# benchmarks.md "Agglomeration")
MEMORY_PER_EDGE_BYTES = 135


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


def basin_graph(parts: Iterable[BlockGraph]) -> BasinGraph:
    """The blocks' graphs as one graph of basins: fragments joined across block faces made
    one basin (named by its least fragment), their edges summed per basin pair.

    Memory: the parts are taken one at a time (`GraphStore.blocks` reads them as they are
    asked for) and joined field by field, each array dropped once it is used; the peak is
    about 70 bytes per part edge (the joined fields, a sort of the fragment ids, the pair
    keys and their order)."""
    f = _joined(parts)
    fragments = sorted_unique(np.concatenate([f["u"], f["v"], f["joined_u"], f["joined_v"]]))
    n = len(fragments)
    ji = np.searchsorted(fragments, f.pop("joined_u"))
    jj = np.searchsorted(fragments, f.pop("joined_v"))
    links = coo_matrix((np.ones(len(ji), np.int8), (ji, jj)), shape=(n, n))
    del ji, jj
    component = connected_components(links, directed=False)[1]
    del links
    # a component's first fragment (ascending ids) is its least: the basin's canonical id
    first = np.full(int(component.max()) + 1 if n else 0, n, dtype=np.int64)
    positions = np.arange(n, dtype=np.int64)
    first[component[::-1]] = positions[::-1]  # the last write (the first position) wins
    order = np.argsort(first)  # basins in the order of their ids
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    ids = fragments[np.sort(first)]
    index = _index_dtype(len(ids))
    basin_of = rank[component].astype(index)
    del first, positions, order, rank, component
    a = basin_of[np.searchsorted(fragments, f.pop("u"))]
    b = basin_of[np.searchsorted(fragments, f.pop("v"))]
    key = _pair_keys(a, b, len(ids))
    del a, b
    a, b, total, count = _resum(key, f.pop("affinity_sum"), f.pop("count"), len(ids), index)
    return BasinGraph(ids, fragments, basin_of, a, b, total, count)


_PART_FIELDS = {"u": np.uint64, "v": np.uint64, "affinity_sum": np.int64, "count": np.int64,
                "joined_u": np.uint64, "joined_v": np.uint64}


def _joined(parts: Iterable[BlockGraph]) -> dict[str, np.ndarray]:
    """Each field of the parts concatenated; the pieces of one field are let go as soon as
    it is joined (so only one field is ever held twice)."""
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in _PART_FIELDS}
    for part in parts:
        for name in _PART_FIELDS:
            pieces[name].append(getattr(part, name))
    joined = {}
    for name, dtype in _PART_FIELDS.items():
        arrays = pieces.pop(name)
        joined[name] = np.concatenate(arrays) if arrays else np.zeros(0, dtype)
        del arrays
    return joined


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending; `values` is sorted in place (a sort: NumPy 2's
    hashing np.unique is slower here)."""
    values.sort()
    if len(values) == 0:
        return values
    return values[np.concatenate([[True], values[1:] != values[:-1]])]


def _index_dtype(n: int) -> type[np.signedinteger]:
    return np.int32 if n < 2**31 else np.int64


def _pair_keys(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Each unordered pair (a, b) of regions 0..n-1 as the int64 min * n + max."""
    key = np.minimum(a, b).astype(np.int64)
    key *= n
    key += np.maximum(a, b)
    return key


def _resum(key: np.ndarray, total: np.ndarray, count: np.ndarray, n: int,
           dtype: np.dtype | type[np.signedinteger]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
    """(a, b of `dtype`, total, count): the rows of equal pair key (`_pair_keys`) added up
    and self-loops (a == b, whose key is a multiple of n + 1) dropped; sorted by (a, b).
    Integer sums, exact."""
    keep = key % (n + 1) != 0
    if not keep.all():
        key, total, count = key[keep], total[keep], count[keep]
    del keep
    order = np.argsort(key)
    key = key[order]
    starts = np.flatnonzero(np.diff(key, prepend=-1)) if len(key) else np.zeros(0, np.int64)
    key = key[starts]
    total = np.add.reduceat(total[order], starts) if len(order) else np.zeros(0, np.int64)
    count = np.add.reduceat(count[order], starts) if len(order) else np.zeros(0, np.int64)
    return (key // n).astype(dtype), (key % n).astype(dtype), total, count


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
        key = _pair_keys(names[a], names[b], n)
        a, b, total, count = _resum(key, total, count, n, segment.dtype)
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
    del below
    component = connected_components(links, directed=False)[1]
    del links  # the temporaries go before the greedy loop's arrays come
    inside = component[a] == component[b]
    del component
    a, b, total, count = a[inside], b[inside], total[inside], count[inside]  # ours to change
    del inside
    regions = sorted_unique(np.concatenate([a, b]))
    index = index_dtype(len(a), len(regions))
    a = np.searchsorted(regions, a).astype(index)
    b = np.searchsorted(regions, b).astype(index)
    roots = _roots(greedy(a, b, total, count, len(regions), threshold))
    del a, b, total, count
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
    index = index_dtype(len(inner.u), len(fragments))
    a = np.searchsorted(fragments, inner.u).astype(index)
    b = np.searchsorted(fragments, inner.v).astype(index)
    frozen = np.isin(fragments, open_fragments)
    parent = greedy(a.copy(), b.copy(), inner.affinity_sum.astype(np.int64),
                    inner.count.astype(np.int64), len(fragments), threshold, frozen)
    roots = _roots(parent)
    least = np.arange(len(fragments))
    np.minimum.at(least, roots, np.arange(len(fragments)))
    region = least[roots]  # (k,) each fragment's region, as an index of its least fragment
    ra, rb, total, count = _resum(_pair_keys(region[a], region[b], len(fragments)),
                                  inner.affinity_sum, inner.count, len(fragments), np.int64)
    empty = np.zeros(0, np.uint64)
    graph = BlockGraph(fragments[ra], fragments[rb], total, count, empty, empty)
    return fragments, fragments[region], graph


def segment_table(graph: BasinGraph, segment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fragments, their segment ids): every fragment with an edge and the canonical id of
    its segment; a fragment that is not listed is a segment of its own."""
    return graph.fragments, graph.ids[segment[graph.basin_of]]
