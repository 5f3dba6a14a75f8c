"""An indexed binary min-heap of edges for the greedy loop, compiled by Numba: each edge is
in it at most once, at `pos[e]` (-1: not in it), so a changed edge moves in place instead
of being pushed again. Memory is fixed at the start: the heap (one index per edge), the
positions (one per edge) and a float64 score per edge, 16 bytes per edge with int32
indices; nothing grows while the loop runs (a heap of pushed entries grows with every
changed edge and keeps the stale ones).

Order: the least score first, ties by the pair of regions the edge joins (the smaller
region's index, then the larger's), read from the loop's edge ends `a`, `b` when compared.
Live edges join distinct pairs, so the order is total and the result does not depend on
the heap's layout. `state[1]` holds the heap's size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _before(i: Any, j: Any, score: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether edge i comes out of the heap before edge j."""
    if score[i] != score[j]:
        return score[i] < score[j]
    lo_i, lo_j = min(a[i], b[i]), min(a[j], b[j])
    if lo_i != lo_j:
        return lo_i < lo_j
    return max(a[i], b[i]) < max(a[j], b[j])


@njit(cache=True, nogil=True)
def _up(heap: np.ndarray, pos: np.ndarray, k: Any, score: np.ndarray, a: np.ndarray,
        b: np.ndarray) -> None:
    e = heap[k]
    while k > 0:
        parent = (k - 1) >> 1
        q = heap[parent]
        if not _before(e, q, score, a, b):
            break
        heap[k] = q
        pos[q] = k
        k = parent
    heap[k] = e
    pos[e] = k


@njit(cache=True, nogil=True)
def _down(heap: np.ndarray, pos: np.ndarray, k: Any, size: Any, score: np.ndarray,
          a: np.ndarray, b: np.ndarray) -> None:
    e = heap[k]
    while True:
        child = 2 * k + 1
        if child >= size:
            break
        if child + 1 < size and _before(heap[child + 1], heap[child], score, a, b):
            child += 1
        if not _before(heap[child], e, score, a, b):
            break
        heap[k] = heap[child]
        pos[heap[k]] = k
        k = child
    heap[k] = e
    pos[e] = k


@njit(cache=True, nogil=True)
def build(heap: np.ndarray, pos: np.ndarray, state: np.ndarray, score: np.ndarray,
          a: np.ndarray, b: np.ndarray, threshold: float) -> None:
    """The heap of every edge scoring below `threshold` (`score` filled by the caller)."""
    size = 0
    for e in range(len(score)):
        if score[e] < threshold:
            heap[size] = e
            pos[e] = size
            size += 1
    state[1] = size
    for k in range(size // 2 - 1, -1, -1):
        _down(heap, pos, k, size, score, a, b)


@njit(cache=True, nogil=True)
def pop(heap: np.ndarray, pos: np.ndarray, state: np.ndarray, score: np.ndarray,
        a: np.ndarray, b: np.ndarray) -> np.int64:
    """The first edge, taken out (the heap must not be empty)."""
    e = np.int64(heap[0])
    remove(heap, pos, state, e, score, a, b)
    return e


@njit(cache=True, nogil=True)
def remove(heap: np.ndarray, pos: np.ndarray, state: np.ndarray, e: Any, score: np.ndarray,
           a: np.ndarray, b: np.ndarray) -> None:
    """Edge e out of the heap, if it is in it."""
    k = pos[e]
    if k < 0:
        return
    pos[e] = -1
    state[1] -= 1
    last = heap[state[1]]
    if k != state[1]:  # the last leaf fills the hole and finds its place
        heap[k] = last
        pos[last] = k
        _up(heap, pos, k, score, a, b)
        _down(heap, pos, pos[last], state[1], score, a, b)


@njit(cache=True, nogil=True)
def place(heap: np.ndarray, pos: np.ndarray, state: np.ndarray, e: Any, value: float,
          score: np.ndarray, a: np.ndarray, b: np.ndarray, threshold: float) -> None:
    """Edge e with a new score or new ends: in the heap at its place while it scores below
    `threshold`, out of it otherwise."""
    if value >= threshold:
        remove(heap, pos, state, e, score, a, b)
        score[e] = value
        return
    score[e] = value
    k = pos[e]
    if k < 0:
        k = state[1]
        heap[k] = e
        pos[e] = k
        state[1] += 1
    _up(heap, pos, k, score, a, b)
    _down(heap, pos, pos[e], state[1], score, a, b)
