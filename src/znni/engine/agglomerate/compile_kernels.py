"""The agglomeration's Numba kernels compiled into Numba's cache ahead of the first run.

    python -m znni.engine.agglomerate.compile_kernels

Numba compiles a kernel the first time it is called with new argument types and caches the
result beside the module (or in NUMBA_CACHE_DIR). `make demo` and `make test` run this
after installing, so a user's first `znni agglomerate` does not spend its first seconds
compiling. It runs the block stages' own functions and the global step on small synthetic
cells (`predict.predict`), once with few fragments per block (uint16 local ids) and once
with many (uint32), with and without a mask, as a run's blocks do.
"""

from __future__ import annotations

import time

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
from znni.engine.agglomerate.graph import block_graph, renumbered
from znni.engine.agglomerate.predict import predict
from znni.engine.geometry import Box


def compile_kernels() -> float:
    """Every kernel a run calls, compiled (or loaded from the cache); the seconds taken."""
    start = time.perf_counter()
    predict((48, 48, 48), (48, 48, 48))  # fragments, faces, pre-merge, global step
    rng = np.random.default_rng(0)
    for side, masked in ((8, True), (64, False), (64, True)):
        # noise: a fragment per ~4 voxels, so 64^3 has more than 2^16 (uint32 local ids)
        affs = rng.random((3, side, side, side), dtype=np.float32)
        box = Box((0, 0, 0), (side, side, side))
        mask = np.ones(box.shape, bool) if masked else None
        hood = Neighbourhood(box, box, affs, edge_validity(box, box, mask))
        links = pointers(hood, LOW, HIGH)
        fragments = label_block(links, box, box.shape)
        renumbered(fragments)
        graph = block_graph(box, hood, fragments, links)
        merge.premerge(graph, np.zeros(0, np.uint64), 0.5)
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"znni: agglomeration kernels compiled in {compile_kernels():.1f} s")
