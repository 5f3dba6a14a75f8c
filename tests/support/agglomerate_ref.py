"""Independent references for the agglomeration: a voxel-by-voxel watershed (pure Python
loops and a union-find), a one-merge-at-a-time greedy mean-affinity agglomeration (a full
scan per merge), and an in-memory block-by-block driver of znni's own functions."""

from __future__ import annotations

import itertools

import numpy as np

from znni.engine.agglomerate import merge
from znni.engine.agglomerate.fragments import (
    HIGH,
    LOW,
    Neighbourhood,
    edge_validity,
    label_block,
    pointers,
)
from znni.engine.agglomerate.graph import block_graph
from znni.engine.geometry import Box

STEPS = ((-1, 0, 0), (0, -1, 0), (0, 0, -1), (1, 0, 0), (0, 1, 0), (0, 0, 1))


def _edge(affs: np.ndarray, v: tuple[int, int, int], d: int,
          mask: np.ndarray | None) -> float | None:
    """The affinity of v's edge in direction d, None where there is no edge."""
    shape = affs.shape[1:]
    w = tuple(a + s for a, s in zip(v, STEPS[d]))
    if not all(0 <= w[i] < shape[i] for i in range(3)):
        return None
    if mask is not None and not (mask[v] and mask[w]):
        return None
    c = d % 3
    at = v if d < 3 else w  # edge (x, x - e_c) is stored at x
    return float(affs[(c, *at)])


def naive_basins(affs: np.ndarray, mask: np.ndarray | None = None, low: float = LOW,
                 high: float = HIGH) -> np.ndarray:
    """Steepest-ascent basins voxel by voxel: canonical ids (1 + least linear index)."""
    shape = affs.shape[1:]
    parent = list(range(int(np.prod(shape))))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    flat = lambda v: (v[0] * shape[1] + v[1]) * shape[2] + v[2]  # noqa: E731
    background = set()
    for v in itertools.product(*(range(n) for n in shape)):
        values = [_edge(affs, v, d, mask) for d in range(6)]
        known = [x for x in values if x is not None]
        best = max(known) if known else None
        if best is None or best <= low:
            background.add(flat(v))
            continue
        first = values.index(best)
        for d, x in enumerate(values):
            if x is not None and (d == first or x >= high):
                w = tuple(a + s for a, s in zip(v, STEPS[d]))
                ra, rb = find(flat(v)), find(flat(w))
                parent[max(ra, rb)] = min(ra, rb)
    out = np.zeros(shape, dtype=np.uint64)
    for i in range(len(parent)):
        if i not in background:
            out.flat[i] = find(i) + 1
    return out


def naive_agglomerate(labels: np.ndarray, affs: np.ndarray, threshold: float,
                      mask: np.ndarray | None = None) -> np.ndarray:
    """Greedy mean-affinity agglomeration of `labels`' regions, one merge per full scan;
    a merged region named by its least id."""
    shape = labels.shape
    stats: dict[tuple[int, int], list[float]] = {}
    for v in itertools.product(*(range(n) for n in shape)):
        for c in range(3):
            w = tuple(a - (i == c) for i, a in enumerate(v))
            if w[c] < 0 or (mask is not None and not (mask[v] and mask[w])):
                continue
            a, b = int(labels[v]), int(labels[w])
            if a and b and a != b:
                s = stats.setdefault((min(a, b), max(a, b)), [0.0, 0])
                s[0] += float(affs[(c, *v)])
                s[1] += 1
    name = {x: x for x in np.unique(labels).tolist()}
    while stats:
        (a, b), s = min(stats.items(), key=lambda kv: (1 - kv[1][0] / kv[1][1], kv[0]))
        if 1 - s[0] / s[1] >= threshold:
            break
        merged: dict[tuple[int, int], list[float]] = {}
        for (x, y), t in stats.items():
            x, y = (a if x == b else x), (a if y == b else y)
            if x == y:
                continue
            key = (min(x, y), max(x, y))
            m = merged.setdefault(key, [0.0, 0])
            m[0] += t[0]
            m[1] += t[1]
        stats = merged
        for k, v in name.items():
            if v == b:
                name[k] = a
    return np.vectorize(lambda x: name[int(x)], otypes=[np.uint64])(labels)


def _grow(box: Box, lo: int, hi: int, region: Box) -> Box:
    return Box(tuple(max(r, b - lo) for r, b in zip(region.lo, box.lo)),
               tuple(min(r, b + hi) for r, b in zip(region.hi, box.hi)))


def blocks_of(region: Box, block: tuple[int, int, int]) -> list[Box]:
    starts = [range(lo, hi, b) for lo, hi, b in zip(region.lo, region.hi, block)]
    return [Box(lo, tuple(min(h, s + b) for h, s, b in zip(region.hi, lo, block)))
            for lo in itertools.product(*starts)]


def blockwise(affs: np.ndarray, block: tuple[int, int, int], thresholds: list[float],
              mask: np.ndarray | None = None, region: Box | None = None
              ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """znni's fragments, graph and agglomeration run block by block in memory: (fragments,
    basins, segmentation per threshold) over the whole volume (0 outside the region)."""
    shape = affs.shape[1:]
    region = region or Box((0, 0, 0), shape)

    def hood(box: Box) -> Neighbourhood:
        grown = _grow(box, 1, 1, region)
        m = None if mask is None else mask[grown.slices()]
        return Neighbourhood(box, grown, affs[(slice(None), *grown.slices())],
                             edge_validity(grown, region, m))

    fragments = np.zeros(shape, np.uint64)
    for b in blocks_of(region, block):
        fragments[b.slices()] = label_block(pointers(hood(b)), b, shape)
    parts = []
    for b in blocks_of(region, block):
        e = _grow(b, 1, 0, region)
        parts.append(block_graph(b, hood(e), fragments[e.slices()]))
    graph = merge.basin_graph(parts)
    basin_names = graph.ids[graph.basin_of]
    basins = _rename(fragments, graph.fragments, basin_names)
    segmentations = [_rename(fragments, *merge.segment_table(graph, s))
                     for s in merge.agglomerate(graph, thresholds)]
    return fragments, basins, segmentations


def _rename(labels: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    at = np.clip(np.searchsorted(keys, labels), 0, max(len(keys) - 1, 0))
    hit = (keys[at] == labels) & (labels != 0) if len(keys) else np.zeros(labels.shape, bool)
    return np.where(hit, values[at] if len(values) else labels, labels).astype(np.uint64)


def smooth_affinities(shape: tuple[int, int, int], seed: int, sigma: float = 1.5
                      ) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    affs = np.stack([gaussian_filter(rng.random(shape), sigma) for _ in range(3)])
    affs = (affs - affs.min()) / (affs.max() - affs.min())
    return affs.astype(np.float32)
