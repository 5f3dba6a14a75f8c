"""The greedy agglomeration one merge at a time (a heap of candidate edges), for the tail of
a threshold where rounds of mutual best pairs (`merge.py`) merge only a few pairs each.

Same rule as the rounds: the edge of least score (1 - mean affinity) first, ties by the
regions' canonical order, a merged region named by the lesser of the two. Regions' edges are
read from CSR arrays when a region is first touched and kept in dicts from then on.
"""

from __future__ import annotations

import heapq

import numpy as np

from znni.engine.agglomerate.fragments import QUANTUM

Stats = list[int]  # [summed quantised affinity, count]


class _Graph:
    """Regions' neighbours as dicts {neighbour: [total, count]}, made from CSR on demand."""

    def __init__(self, a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray,
                 n: int) -> None:
        ends = np.concatenate([a, b])  # (2E,) each edge from both of its regions
        others = np.concatenate([b, a])
        order = np.argsort(ends, kind="stable")
        self.starts = np.searchsorted(ends[order], np.arange(n + 1))
        self.others = others[order]
        self.total = np.concatenate([total, total])[order]
        self.count = np.concatenate([count, count])[order]
        self.parent = list(range(n))
        self.adjacent: dict[int, dict[int, Stats]] = {}
        self.changed: list[int] = []  # the last merge's neighbours whose edge changed

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def neighbours(self, x: int) -> dict[int, Stats]:
        """Region x's edges, by the current name of each neighbour (x is a current name)."""
        found = self.adjacent.get(x)
        if found is None:
            found = {}
            lo, hi = int(self.starts[x]), int(self.starts[x + 1])
            for other, total, count in zip(self.others[lo:hi].tolist(),
                                            self.total[lo:hi].tolist(),
                                            self.count[lo:hi].tolist(), strict=True):
                key = self.find(other)
                if key == x:
                    continue
                stats = found.setdefault(key, [0, 0])
                stats[0] += total
                stats[1] += count
            self.adjacent[x] = found
        return found


def _score(stats: Stats) -> float:
    return 1.0 - stats[0] / (stats[1] * QUANTUM)


def merge_sequentially(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray,
                       n: int, threshold: float) -> np.ndarray:
    """Greedy agglomeration of the graph (a < b per edge, summed) until no edge scores below
    the threshold: each region's new name, the least region merged with it (int64, (n,))."""
    graph = _Graph(a, b, total, count, n)
    score = 1.0 - total / (count.astype(np.float64) * QUANTUM)
    below = np.flatnonzero(score < threshold)
    heap = list(zip(score[below].tolist(), a[below].tolist(), b[below].tolist(), strict=True))
    heapq.heapify(heap)
    while heap:
        s, x, y = heapq.heappop(heap)
        if graph.parent[x] != x or graph.parent[y] != y:
            continue  # one of them was merged since
        stats = graph.neighbours(x).get(y)
        if stats is None or _score(stats) != s:
            continue  # the edge changed since; its new score has its own entry
        kept = _merge(graph, x, y)
        for other in graph.changed:
            t = _score(graph.adjacent[kept][other])
            if t < threshold:
                heapq.heappush(heap, (t, min(kept, other), max(kept, other)))
    return _least_names(np.asarray(graph.parent, dtype=np.int64))


def _merge(graph: _Graph, x: int, y: int) -> int:
    """Regions x and y made one, kept under the name of the one with more neighbours (the
    other's edges are added into its dict: small into large); returns the kept name and
    leaves the neighbours whose edge changed in `graph.changed`."""
    if len(graph.neighbours(x)) < len(graph.neighbours(y)):
        x, y = y, x
    large, small = graph.adjacent[x], graph.adjacent.pop(y)
    small.pop(x, None)
    large.pop(y, None)
    for other in small:  # their dicts made before y's name goes
        graph.neighbours(other)
    graph.parent[y] = x
    for other, stats in small.items():
        kept = large.setdefault(other, [0, 0])
        kept[0] += stats[0]
        kept[1] += stats[1]
        theirs = graph.adjacent[other]
        theirs.pop(y, None)
        theirs[x] = [kept[0], kept[1]]
    graph.changed = list(small)
    return x


def _least_names(parent: np.ndarray) -> np.ndarray:
    """Each region's final name: the least region of its tree (vectorised path halving)."""
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            break
        parent = grand
    least = np.arange(len(parent), dtype=np.int64)
    np.minimum.at(least, parent, np.arange(len(parent), dtype=np.int64))
    return least[parent]
