"""Greedy mean-affinity agglomeration one merge at a time, compiled by Numba: an indexed
heap of candidate edges (`edge_heap_numba.py`) and each region's edges in a linked list of
slots.

Same rule as the vectorised rounds of `merge.py`: the edge of least score (1 - mean
affinity) first, ties by the regions' ids. A merge walks the edges of the region with fewer
edges and adds each into the other region's edge to the same neighbour (found in an
open-addressing hash of region pairs) or moves it there, as waterz's region graph does;
`merge.py` names each final region by its least member afterwards.

Memory per edge, with int32 indices (fewer than 2**30 edges and 2**31 regions), fixed when
the loop starts: the caller's ends, sums and counts, changed in place (4 + 4 + 8 + 8
bytes), two list slots (2 x 4), two to four hash slots of 12 bytes (an int64 pair and an
int32 edge) and the heap's 16 (a score and an index in the heap, a position); no copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from znni.engine.agglomerate import edge_heap_numba as edge_heap
from znni.engine.agglomerate.fragments import QUANTUM


def index_dtype(edges: int, regions: int) -> type[np.signedinteger]:
    """int32 where the list slots (2 per edge) and the regions fit it, else int64."""
    return np.int32 if max(2 * edges, regions) < 2**31 else np.int64


def greedy(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray, n: int,
           threshold: float, frozen: np.ndarray | None = None) -> np.ndarray:
    """The parent of each region after greedy merging until no edge scores below the
    threshold (a < b per edge, summed; regions 0..n-1); roots are the surviving regions.
    `a`, `b` (of `index_dtype`, or int64), `total` and `count` (int64) are the loop's
    working arrays and are changed: pass arrays of your own.

    `frozen` (a block's pre-merge): regions whose edges are not all in the graph. They do
    not merge, nor does a region whose best edge leads to one (it is frozen in turn): only
    pairs that are each other's best neighbour over all their edges merge, which any greedy
    order of the whole graph merges too (mean affinity is a reducible linkage)."""
    index = np.dtype(index_dtype(len(a), n))
    if a.dtype != b.dtype or a.dtype not in (index, np.dtype(np.int64)):
        raise TypeError(f"edge ends must both be {index} (or int64), not {a.dtype} and "
                        f"{b.dtype}")
    if total.dtype != np.int64 or count.dtype != np.int64:
        raise TypeError(f"sums and counts must be int64, not {total.dtype} and {count.dtype}")
    nxt = np.full(2 * len(a), -1, a.dtype)  # each slot's next in its region's list
    return _greedy(a, b, total, count, n, threshold, frozen, nxt)


@njit(cache=True, nogil=True)
def _score(total: np.int64, count: np.int64) -> float:
    return 1.0 - total / (count * float(QUANTUM))


@njit(cache=True, nogil=True)
def _lists(a: np.ndarray, b: np.ndarray, n: int, nxt: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each region's edges as a linked list of slots (slot 2e: edge e at a[e], 2e + 1: at
    b[e]), linked through `nxt`: (head, tail, live degree)."""
    head = np.full(n, -1, np.int64)
    tail = np.full(n, -1, np.int64)
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
    return head, tail, degree


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
def _table(a: np.ndarray, b: np.ndarray, cnt: np.ndarray, n: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """The hash of the live edges' region pairs (keys) to their edges (values, of the ends'
    dtype), at most half full."""
    live = np.count_nonzero(cnt)
    size = 1
    while size < 2 * live + 2:
        size *= 2
    keys = np.full(size, _EMPTY, np.int64)
    values = np.empty(size, a.dtype)
    for i in range(len(cnt)):
        if cnt[i] > 0:
            key = _pair(a[i], b[i], n)
            at = _slot(keys, key, True)
            keys[at], values[at] = key, i
    return keys, values


@njit(cache=True, nogil=True)
def _pair(x: Any, y: Any, n: int) -> np.int64:
    return np.int64(min(x, y)) * n + max(x, y)


@njit(cache=True, nogil=True)
def _greedy(a: np.ndarray, b: np.ndarray, tot: np.ndarray, cnt: np.ndarray, n: int,
            threshold: float, frozen: np.ndarray | None, nxt: np.ndarray) -> np.ndarray:
    head, tail, degree = _lists(a, b, n, nxt)
    length = degree.copy()  # slots in each region's list, dead ones included
    keys, values = _table(a, b, cnt, n)  # region pair -> edge
    state = np.zeros(2, np.int64)  # hash slots ever filled (pairs, deleted ones); heap size
    state[0] = len(a)
    key, heap, pos = np.empty(len(a)), np.empty(len(a), a.dtype), np.full(len(a), -1, a.dtype)
    for i in range(len(a)):  # the edges below the threshold, then made a heap
        score = _score(tot[i], cnt[i])
        if score < threshold:
            key[state[1]], heap[state[1]] = score, i
            state[1] += 1
    edge_heap.build(key, heap, pos, state, a, b)
    parent = np.arange(n)
    while state[1] > 0:
        e = edge_heap.pop(key, heap, pos, state, a, b)
        x, y = min(a[e], b[e]), max(a[e], b[e])
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
        _move(keep, gone, n, a, b, tot, cnt, head, tail, nxt, degree, keys, values,
              (key, heap, pos, state), threshold)
        parent[gone] = keep
        if 4 * state[0] > 3 * len(keys):  # deleted slots lengthen every probe: rebuild
            keys, values = _table(a, b, cnt, n)
            state[0] = np.count_nonzero(cnt)
    return parent


@njit(cache=True, nogil=True)
def _move(keep: Any, gone: Any, n: int, a: np.ndarray, b: np.ndarray, tot: np.ndarray,
          cnt: np.ndarray, head: np.ndarray, tail: np.ndarray, nxt: np.ndarray,
          degree: np.ndarray, keys: np.ndarray, values: np.ndarray, queue: tuple,
          threshold: float) -> None:
    """`gone`'s edges added into keep's edge to the same region, or moved to keep; each
    changed edge takes its new place in the heap (`queue`: keys, edges, positions, state)."""
    key, heap, pos, state = queue
    s = head[gone]
    while s != -1:
        f = s >> 1
        if cnt[f] > 0:
            at_a = a[f] == gone
            other = b[f] if at_a else a[f]
            keys[_slot(keys, _pair(gone, other, n), False)] = _GONE
            at = _slot(keys, _pair(keep, other, n), True)
            if keys[at] >= 0:  # keep has an edge to `other` already: one edge of the two
                g = values[at]
                tot[g] += tot[f]
                cnt[g] += cnt[f]
                cnt[f] = 0
                edge_heap.remove(key, heap, pos, state, f, a, b)
                degree[other] -= 1
                changed = np.int64(g)
            else:  # the edge now joins keep and `other`
                if at_a:
                    a[f] = keep
                else:
                    b[f] = keep
                if keys[at] == _EMPTY:
                    state[0] += 1
                keys[at], values[at] = _pair(keep, other, n), f
                degree[keep] += 1
                changed = np.int64(f)
            edge_heap.place(key, heap, pos, state, changed, _score(tot[changed], cnt[changed]),
                            a, b, threshold)
        s = nxt[s]
    if head[gone] != -1:  # gone's slots join keep's list (dead ones are skipped)
        if head[keep] == -1:
            head[keep] = head[gone]
        else:
            nxt[tail[keep]] = head[gone]
        tail[keep] = tail[gone]
    head[gone] = -1
    degree[gone] = 0
