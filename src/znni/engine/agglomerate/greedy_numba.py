"""Greedy mean-affinity agglomeration one merge at a time, compiled by Numba: a heap of
candidate edges, each region's edges in a linked list, one hash of region pairs.

It finishes a threshold where the vectorised rounds of reciprocal best pairs (`merge.py`)
would take many rounds of few merges each (long chains). Same rule: the edge of least score
(1 - mean affinity) first, ties by the regions' ids; the merged region keeps the id of the
one with more edges (its edges need no move: small into large), and `merge.py` names each
final region by its least member afterwards. Memory: about 100 bytes per edge (the edges'
arrays, two list slots, the pair hash, heap entries for candidates).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
from numba import njit, types
from numba.typed import Dict

from znni.engine.agglomerate.fragments import QUANTUM


@njit(cache=True)
def _score(total: np.int64, count: np.int64) -> float:
    return 1.0 - total / (count * float(QUANTUM))


@njit(cache=True)
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


@njit(cache=True)
def greedy(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray, n: int,
           threshold: float) -> np.ndarray:
    """The parent of each region after greedy merging until no edge scores below the
    threshold (a < b per edge, summed; regions 0..n-1); roots are the surviving regions."""
    u_of, v_of = a.astype(np.int64), b.astype(np.int64)
    tot, cnt = total.copy(), count.copy()
    version = np.zeros(len(a), np.int64)
    head, tail, nxt, degree = _lists(u_of, v_of, n)
    pairs = Dict.empty(key_type=types.int64, value_type=types.int64)
    for i in range(len(a)):
        pairs[u_of[i] * n + v_of[i]] = i
    heap = [(0.0, np.int64(0), np.int64(0), np.int64(0), np.int64(0))]
    heap.pop()
    for i in range(len(a)):
        first = _score(tot[i], cnt[i])
        if first < threshold:
            heap.append((first, u_of[i], v_of[i], np.int64(i), np.int64(0)))
    heapq.heapify(heap)
    parent = np.arange(n)
    while len(heap) > 0:
        s, x, y, e, ver = heapq.heappop(heap)
        if cnt[e] == 0 or version[e] != ver:
            continue  # merged away, or changed since (its new entry is in the heap)
        keep, gone = (x, y) if degree[x] >= degree[y] else (y, x)
        _merge(keep, gone, e, n, u_of, v_of, tot, cnt, version, head, tail, nxt, degree,
               pairs, heap, threshold)
        parent[gone] = keep
    return parent


@njit(cache=True)
def _merge(keep: Any, gone: Any, joining: Any, n: int, u_of: np.ndarray,
           v_of: np.ndarray, tot: np.ndarray, cnt: np.ndarray, version: np.ndarray,
           head: np.ndarray, tail: np.ndarray, nxt: np.ndarray, degree: np.ndarray,
           pairs: Dict, heap: list, threshold: float) -> None:
    """`gone`'s edges moved to `keep` or added into keep's edge to the same region."""
    cnt[joining] = 0
    del pairs[min(keep, gone) * n + max(keep, gone)]
    degree[keep] -= 1
    s = head[gone]
    while s != -1:
        f = s >> 1
        if cnt[f] > 0:
            other = v_of[f] if u_of[f] == gone else u_of[f]
            del pairs[min(gone, other) * n + max(gone, other)]
            key = min(keep, other) * n + max(keep, other)
            if key in pairs:  # keep has an edge to `other` already: one edge of the two
                g = pairs[key]
                tot[g] += tot[f]
                cnt[g] += cnt[f]
                cnt[f] = 0
                degree[other] -= 1
                changed = g
            else:  # the edge now joins keep and `other`
                if u_of[f] == gone:
                    u_of[f] = keep
                else:
                    v_of[f] = keep
                pairs[key] = f
                degree[keep] += 1
                changed = f
            version[changed] += 1
            score = _score(tot[changed], cnt[changed])
            if score < threshold:
                lo = min(u_of[changed], v_of[changed])
                hi = max(u_of[changed], v_of[changed])
                heapq.heappush(heap, (score, lo, hi, changed, version[changed]))
        s = nxt[s]
    if head[gone] != -1:  # gone's slots join keep's list (their dead ones are skipped)
        if head[keep] == -1:
            head[keep] = head[gone]
        else:
            nxt[tail[keep]] = head[gone]
        tail[keep] = tail[gone]
    head[gone] = -1
    degree[gone] = 0
