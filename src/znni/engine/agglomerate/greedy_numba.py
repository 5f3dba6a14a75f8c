"""Greedy mean-affinity agglomeration one merge at a time, compiled by Numba: a heap of
candidate edges and each region's edges in a linked list of slots.

Same rule as the vectorised rounds of `merge.py`: the edge of least score (1 - mean
affinity) first, ties by the regions' ids. A merge walks the edges of the region with fewer
edges and adds each into the other region's edge to the same neighbour (found in an
open-addressing hash of region pairs) or moves it there, as waterz's region graph does;
`merge.py` names each final region by its least member afterwards. Memory: about 100 bytes
per edge (the edges' arrays, two list slots, two to four hash slots) and 40 per heap entry.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
from numba import njit

from znni.engine.agglomerate.fragments import QUANTUM


@njit(cache=True, nogil=True)
def _score(total: np.int64, count: np.int64) -> float:
    return 1.0 - total / (count * float(QUANTUM))


@njit(cache=True, nogil=True)
def _lists(a: np.ndarray, b: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                            np.ndarray]:
    """Each region's edges as a linked list of slots (slot 2e: edge e at a[e], 2e + 1: at
    b[e]): (head, tail, next, live degree)."""
    head = np.full(n, -1, np.int64)
    tail = np.full(n, -1, np.int64)
    nxt = np.full(2 * len(a), -1, np.int64)
    degree = np.zeros(n, np.int64)
    for e in range(len(a)):
        for side in range(2):
            x = a[e] if side == 0 else b[e]
            s = 2 * e + side
            if head[x] == -1:
                head[x] = s
            else:
                nxt[tail[x]] = s
            tail[x] = s
            degree[x] += 1
    return head, tail, nxt, degree


_EMPTY, _GONE = -1, -2  # a hash slot never used; one whose pair was deleted


@njit(cache=True, nogil=True)
def _slot(keys: np.ndarray, key: np.int64, inserting: bool) -> np.int64:
    """The slot of `key` in the open-addressing table (linear probing), or where it goes
    (`inserting`: the first free slot on its path), or -1 when it is not there."""
    mask = len(keys) - 1
    i = (key * np.int64(-7046029254386353131)) >> np.int64(17) & mask  # Fibonacci hashing
    free = np.int64(-1)
    while True:
        k = keys[i]
        if k == key:
            return i
        if k == _EMPTY:
            return (free if free >= 0 else i) if inserting else np.int64(-1)
        if k == _GONE and free < 0:
            free = i
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _table(ends: np.ndarray, cnt: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The hash of the live edges' region pairs, at most half full."""
    live = np.count_nonzero(cnt)
    size = 1
    while size < 2 * live + 2:
        size *= 2
    keys = np.full(size, _EMPTY, np.int64)
    values = np.empty(size, np.int64)
    for i in range(len(cnt)):
        if cnt[i] > 0:
            key = _pair(ends[0, i], ends[1, i], n)
            at = _slot(keys, key, True)
            keys[at], values[at] = key, i
    return keys, values


@njit(cache=True, nogil=True)
def _pair(x: Any, y: Any, n: int) -> np.int64:
    return np.int64(min(x, y)) * n + max(x, y)


@njit(cache=True, nogil=True)
def greedy(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray, n: int,
           threshold: float, frozen: np.ndarray | None = None) -> np.ndarray:
    """The parent of each region after greedy merging until no edge scores below the
    threshold (a < b per edge, summed; regions 0..n-1); roots are the surviving regions.

    `frozen` (a block's pre-merge): regions whose edges are not all in the graph. They do
    not merge, nor does a region whose best edge leads to one (it is frozen in turn): only
    pairs that are each other's best neighbour over all their edges merge, which any greedy
    order of the whole graph merges too (mean affinity is a reducible linkage)."""
    ends = np.empty((2, len(a)), np.int64)  # the regions each edge joins, as it changes
    ends[0], ends[1] = a, b
    tot, cnt = total.copy(), count.copy()
    version = np.zeros(len(a), np.int64)
    head, tail, nxt, degree = _lists(ends[0], ends[1], n)
    length = degree.copy()  # slots in each region's list, dead ones included
    keys, values = _table(ends, cnt, n)  # region pair -> edge
    used = np.zeros(1, np.int64)  # slots ever filled (pairs and deleted ones)
    used[0] = len(a)
    heap = [(0.0, np.int64(0), np.int64(0), np.int64(0), np.int64(0))]
    heap.pop()
    for i in range(len(a)):
        first = _score(tot[i], cnt[i])
        if first < threshold:
            heap.append((first, ends[0, i], ends[1, i], np.int64(i), np.int64(0)))
    heapq.heapify(heap)
    parent = np.arange(n)
    while len(heap) > 0:
        s, x, y, e, ver = heapq.heappop(heap)
        if cnt[e] == 0 or version[e] != ver:
            continue  # merged away, or changed since (its new entry is in the heap)
        if frozen is not None and (frozen[x] or frozen[y]):
            frozen[x] = frozen[y] = True  # e is the best edge of both
            continue
        # the shorter list is walked and appended to the longer (small into large: each
        # slot is walked O(log E) times in all)
        keep, gone = (x, y) if length[x] >= length[y] else (y, x)
        length[keep] += length[gone]
        length[gone] = 0
        cnt[e] = 0
        keys[_slot(keys, _pair(x, y, n), False)] = _GONE
        degree[keep] -= 1
        _move(keep, gone, n, ends, tot, cnt, version, head, tail, nxt, degree, keys, values,
              heap, threshold, used)
        parent[gone] = keep
        if 4 * used[0] > 3 * len(keys):  # deleted slots lengthen every probe: rebuild
            keys, values = _table(ends, cnt, n)
            used[0] = np.count_nonzero(cnt)
    return parent


@njit(cache=True, nogil=True)
def _move(keep: Any, gone: Any, n: int, ends: np.ndarray, tot: np.ndarray, cnt: np.ndarray,
          version: np.ndarray, head: np.ndarray, tail: np.ndarray, nxt: np.ndarray,
          degree: np.ndarray, keys: np.ndarray, values: np.ndarray, heap: list,
          threshold: float, used: np.ndarray) -> None:
    """`gone`'s edges added into keep's edge to the same region, or moved to keep."""
    s = head[gone]
    while s != -1:
        f = s >> 1
        if cnt[f] > 0:
            side = 0 if ends[0, f] == gone else 1
            other = ends[1 - side, f]
            keys[_slot(keys, _pair(gone, other, n), False)] = _GONE
            at = _slot(keys, _pair(keep, other, n), True)
            if keys[at] >= 0:  # keep has an edge to `other` already: one edge of the two
                g = values[at]
                tot[g] += tot[f]
                cnt[g] += cnt[f]
                cnt[f] = 0
                degree[other] -= 1
                changed = g
            else:  # the edge now joins keep and `other`
                ends[side, f] = keep
                if keys[at] == _EMPTY:
                    used[0] += 1
                keys[at], values[at] = _pair(keep, other, n), f
                degree[keep] += 1
                changed = f
            version[changed] += 1
            score = _score(tot[changed], cnt[changed])
            if score < threshold:
                lo = min(ends[0, changed], ends[1, changed])
                hi = max(ends[0, changed], ends[1, changed])
                heapq.heappush(heap, (score, lo, hi, changed, version[changed]))
        s = nxt[s]
    if head[gone] != -1:  # gone's slots join keep's list (dead ones are skipped)
        if head[keep] == -1:
            head[keep] = head[gone]
        else:
            nxt[tail[keep]] = head[gone]
        tail[keep] = tail[gone]
    head[gone] = -1
    degree[gone] = 0
