"""Peak memory of the agglomeration's global step on a graph of a chosen number of edges.

    .venv/bin/python benchmarks/agglomerate_memory.py [--edges 100000000] [--seed 0]

A synthetic region graph (no volume): fragments on a cubic grid, each joined to five of its
neighbours (+x, +y, +z and two diagonals), random quantised mean affinities, 1% of the
edges also marked as basin links across block faces. The graph comes as block graphs of
10^6 edges from a generator (as `GraphStore.blocks` reads the SQLite rows one at a time)
into `merge.basin_graph`, then `merge.agglomerate` at threshold 0.5, as `znni agglomerate`'s
global step runs. Peak RSS is sampled every 50 ms (and the kernel's high-water mark read at
the end); bytes per basin edge are given with and without the process's memory before the
step. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_common import cpu_name  # noqa: E402

from znni.engine.agglomerate import merge  # noqa: E402
from znni.engine.agglomerate.fragments import QUANTUM  # noqa: E402
from znni.engine.agglomerate.graph import BlockGraph  # noqa: E402

OFFSETS = ((0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 1, 1), (1, 1, 0))  # (z, y, x) neighbours
PART_EDGES = 10**6


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def parts(side: int, edges: int, seed: int) -> Iterator[BlockGraph]:
    """Block graphs of about PART_EDGES edges each over a side^3 grid of fragments (ids
    1..side^3), `edges` in all."""
    rng = np.random.default_rng(seed)
    made = 0
    cells = side**3
    step = PART_EDGES // len(OFFSETS)
    for start in range(0, cells, step):
        cell = np.arange(start, min(cells, start + step), dtype=np.int64)
        z, y, x = cell // side**2, cell // side % side, cell % side
        us, vs = [], []
        for dz, dy, dx in OFFSETS:
            ok = (z + dz < side) & (y + dy < side) & (x + dx < side)
            us.append(cell[ok])
            vs.append(cell[ok] + dz * side**2 + dy * side + dx)
        u = np.concatenate(us)[: edges - made]
        v = np.concatenate(vs)[: len(u)]
        made += len(u)
        count = rng.integers(1, 60, len(u)).astype(np.int64)
        total = (rng.beta(4, 2, len(u)) * count * QUANTUM).astype(np.int64)
        link = rng.random(len(u)) < 0.01
        yield BlockGraph((u + 1).astype(np.uint64), (v + 1).astype(np.uint64), total, count,
                         (u[link] + 1).astype(np.uint64), (v[link] + 1).astype(np.uint64))
        if made >= edges:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10**8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    side = int(np.ceil((args.edges / len(OFFSETS)) ** (1 / 3))) + 1
    peaks = {"join": 0, "agglomerate": 0}
    phase = ["join"]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks[phase[0]] = max(peaks[phase[0]], rss_bytes())
            time.sleep(0.05)

    base = rss_bytes()
    threading.Thread(target=sample, daemon=True).start()
    start = time.perf_counter()
    graph = merge.basin_graph(parts(side, args.edges, args.seed))
    joined = time.perf_counter()
    phase[0] = "agglomerate"
    segment = next(merge.agglomerate(graph, [0.5]))
    end = time.perf_counter()
    done.set()
    high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    edges = len(graph.a)
    print(f"CPU: {cpu_name()}; grid {side}^3, {args.edges:,} part edges, seed {args.seed}")
    print(f"basins {len(graph.ids):,}, basin edges {edges:,}, segments at 0.5 "
          f"{int(np.count_nonzero(segment == np.arange(len(segment)))):,}")
    print(f"process before the step: {base / 1e9:.2f} GB")
    for name, seconds in (("join", joined - start), ("agglomerate", end - joined)):
        peak = peaks[name]
        print(f"{name}: {seconds:.1f} s, peak RSS {peak / 1e9:.2f} GB "
              f"({peak / 2**30:.2f} GiB), {(peak - base) / edges:.0f} bytes per basin edge "
              f"above the start, {peak / edges:.0f} with it")
    print(f"high-water mark (getrusage): {high_water / 1e9:.2f} GB ({high_water / 2**30:.2f} "
          "GiB)")


if __name__ == "__main__":
    main()
