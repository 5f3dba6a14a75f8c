"""The global step's memory-lean parts: the compiled greedy loop on a random region graph
against a naive merge-one-pair-per-scan reference (int32 and int64 edge ends), its refusal
of other index types, the join from a generator of block graphs read one row at a time, and
the region-graph file's missing-row sentence."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from znni.engine.agglomerate import merge
from znni.engine.agglomerate.fragments import QUANTUM
from znni.engine.agglomerate.graph import BlockGraph
from znni.engine.agglomerate.greedy_numba import greedy
from znni.engine.agglomerate.store import INNER, GraphStore, pack


def _random_graph(n: int, edges: int, seed: int) -> tuple[np.ndarray, ...]:
    """Distinct pairs a < b over regions 0..n-1 with random quantised sums and counts."""
    rng = np.random.default_rng(seed)
    pairs = {tuple(sorted(rng.choice(n, 2, replace=False))) for _ in range(edges)}
    a, b = (np.array(side, np.int64) for side in zip(*sorted(pairs), strict=True))
    count = rng.integers(1, 6, len(a)).astype(np.int64)
    total = (rng.random(len(a)) * count * QUANTUM).astype(np.int64)
    return a, b, total, count


def _naive(a: np.ndarray, b: np.ndarray, total: np.ndarray, count: np.ndarray, n: int,
           threshold: float) -> list[frozenset[int]]:
    """Merge the least-scoring pair (ties by the pair), re-sum, scan again; the groups."""
    group = {i: frozenset([i]) for i in range(n)}
    edges = {(int(x), int(y)): [int(t), int(c)] for x, y, t, c in zip(a, b, total, count,
                                                                      strict=True)}
    while edges:
        scored = {pair: 1.0 - t / (c * float(QUANTUM)) for pair, (t, c) in edges.items()}
        best = min(scored, key=lambda pair: (scored[pair], pair))
        if scored[best] >= threshold:
            break
        keep, gone = best
        group[keep] = group[keep] | group.pop(gone)
        merged: dict[tuple[int, int], list[int]] = {}
        for (x, y), (t, c) in edges.items():
            x, y = (keep if x == gone else x), (keep if y == gone else y)
            if x != y:
                key = (min(x, y), max(x, y))
                s = merged.setdefault(key, [0, 0])
                s[0] += t
                s[1] += c
        edges = merged
    return sorted(group.values(), key=min)


def _groups(parent: np.ndarray) -> list[frozenset[int]]:
    roots = merge._roots(parent)
    return sorted((frozenset(np.flatnonzero(roots == r).tolist()) for r in np.unique(roots)),
                  key=min)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_greedy_merges_as_the_naive_reference(dtype: type, threshold: float) -> None:
    n = 60
    a, b, total, count = _random_graph(n, 150, seed=int(threshold * 10))
    expected = _naive(a, b, total, count, n, threshold)
    parent = greedy(a.astype(dtype), b.astype(dtype), total.copy(), count.copy(), n, threshold)
    assert _groups(parent) == expected
    assert 1 < len(expected) < n  # some merged, not all


def test_greedy_refuses_other_index_types() -> None:
    a, b, total, count = _random_graph(10, 12, seed=1)
    with pytest.raises(TypeError, match="int32"):
        greedy(a.astype(np.int16), b.astype(np.int16), total, count, 10, 0.5)
    with pytest.raises(TypeError, match="int32"):
        greedy(a.astype(np.int32), b, total, count, 10, 0.5)
    with pytest.raises(TypeError, match="int64"):
        greedy(a.astype(np.int32), b.astype(np.int32), total.astype(np.int32), count, 10, 0.5)


def _part(seed: int) -> BlockGraph:
    rng = np.random.default_rng(seed)
    u = rng.integers(1, 40, 30).astype(np.uint64)
    v = u + rng.integers(1, 10, 30).astype(np.uint64)
    joined = rng.integers(1, 45, 4).astype(np.uint64)
    return BlockGraph(u, v, rng.integers(0, QUANTUM, 30).astype(np.int64),
                      np.ones(30, np.int64), joined, joined + np.uint64(1))


def test_the_join_reads_the_file_row_by_row_and_equals_the_join_of_a_list(
        tmp_path: Path) -> None:
    parts = [_part(seed) for seed in range(5)]
    store = GraphStore(tmp_path / "graph.sqlite")
    keys = [f"{INNER}{i}" for i in range(len(parts))]
    for key, part in zip(keys, parts, strict=True):
        store.put_block(key, pack(part))
    rows = store.blocks(keys)
    assert not isinstance(rows, list)  # read as the join asks, not all at once
    streamed, listed = merge.basin_graph(rows), merge.basin_graph(parts)
    for name in ("ids", "fragments", "basin_of", "a", "b", "total", "count"):
        assert np.array_equal(getattr(streamed, name), getattr(listed, name)), name
    assert (streamed.a < streamed.b).all()  # self-loops (pairs inside one basin) dropped
    assert streamed.count.sum() < sum(int(p.count.sum()) for p in parts)
    store.close()


def test_a_missing_row_is_named_before_any_is_read(tmp_path: Path) -> None:
    store = GraphStore(tmp_path / "graph.sqlite")
    store.put_block(f"{INNER}0", pack(_part(0)))
    with pytest.raises(ValueError, match=f"lacks 1 blocks .*{INNER}1.*--overwrite"):
        store.blocks([f"{INNER}0", f"{INNER}1"])
    store.close()


def test_compiling_the_kernels_ahead_covers_the_types_a_run_uses() -> None:
    """`make demo`/`make test` compile the kernels after installing: the local id types a
    block can have (uint8, uint16, uint32) and the greedy loop with and without frozen
    regions (pre-merge, global step) must all be among what it compiled (asked of a fresh
    process, which has only what `compile_kernels` called)."""
    script = (
        "from znni.engine.agglomerate.compile_kernels import compile_kernels\n"
        "from znni.engine.agglomerate import graph_numba, greedy_numba\n"
        "compile_kernels()\n"
        "print(sorted({str(s[0]) for s in graph_numba.edge_keys.signatures}))\n"
        "print(sorted({str(s[6]) for s in greedy_numba._greedy.signatures}))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    local, frozen = ast.literal_eval(out[-2]), ast.literal_eval(out[-1])
    assert {f"array({t}, 3d, C)" for t in ("uint8", "uint16", "uint32")} <= set(local)
    assert {"none", "array(bool, 1d, C)"} <= set(frozen)
