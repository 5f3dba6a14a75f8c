"""A job's block grid and which blocks are finished, from its output's ledger.

The engine cuts the region on the output's chunk grid (`geometry.split_blocks`) with the
block shape its ledger records, rounded up to whole chunks; the ledger lists the finished
blocks by key ('z0:z1,y0:y1,x0:x1'). Rebuilding the grid from the same three facts
(region, block shape, chunks) puts each finished key on its cell.
"""

from __future__ import annotations

import itertools
from typing import Any

from znni.engine.context import StoreContext
from znni.engine.geometry import grid_spans
from znni.engine.io.arrays import open_output_level0
from znni.engine.io.ledger import read_ledger
from znni.engine.location import Location

MAX_BLOCKS = 262_144  # above this the map gives counts only (a 256 kB state string)


class NoBlockMapError(ValueError):
    """The output has no ledger yet (the job has not started writing)."""


def block_map(output_path: Location, *, ctx: StoreContext,
              edges: list[list[int]] | None = None) -> dict[str, Any]:
    """The BlockMapRead fields but `job`; NoBlockMapError before the ledger exists,
    ValueError when the output or its ledger cannot be read as the engine wrote them.
    `edges`: the job's planned layout (Plan.block_edges), which the engine cut exactly
    (a thin remainder merged into its neighbour); without it, the plain grid."""
    header, done_keys = read_ledger(output_path, ctx=ctx)
    if header is None:
        raise NoBlockMapError(f"output {output_path} has no block ledger yet")
    try:
        parts = header["parts"]  # a segment output's "roi", an agglomeration's "region"
        region = _region(str(parts["roi"] if "roi" in parts else parts["region"]))
        block = [int(b) for b in header["block_shape"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the ledger of {output_path} has no readable region ({e!r})") from e
    array = open_output_level0(output_path, ctx=ctx)  # precomputed too
    chunks = [int(c) for c in array.chunks[-3:]]
    step = [-(-b // c) * c for b, c in zip(block, chunks, strict=True)]
    spans = [grid_spans(lo, hi, s) for (lo, hi), s in zip(region, step, strict=True)]
    if edges is not None and _covers(edges, region):
        spans = [list(itertools.pairwise(int(c) for c in e)) for e in edges]
    else:
        edges = None
    grid = [len(s) for s in spans]
    total = grid[0] * grid[1] * grid[2]
    cells = _cells(spans, done_keys)
    state = None
    if total <= MAX_BLOCKS:
        marks = bytearray(b"0" * total)
        for i in cells:
            marks[i] = ord("1")
        state = marks.decode()
    return {
        "region": region, "step": step, "grid": grid, "total": total, "edges": edges,
        "done": len(cells), "max_blocks": MAX_BLOCKS, "state": state,
    }


def _covers(edges: list[list[int]], region: list[tuple[int, int]]) -> bool:
    """Whether `edges` run from the region's start to its end on every axis, increasing."""
    return len(edges) == 3 and all(
        len(e) >= 2 and e[0] == lo and e[-1] == hi and all(a < b for a, b in itertools.pairwise(e))
        for e, (lo, hi) in zip(edges, region, strict=True))


def _region(key: str) -> list[tuple[int, int]]:
    """'z0:z1,y0:y1,x0:x1' (a Box key) as three (lo, hi) pairs."""
    pairs = [tuple(int(v) for v in part.split(":")) for part in key.split(",")]
    if len(pairs) != 3 or any(len(p) != 2 or p[0] >= p[1] for p in pairs):
        raise ValueError(f"not a region: {key!r}")
    return [(p[0], p[1]) for p in pairs]


def _cells(spans: list[list[tuple[int, int]]], keys: set[str]) -> set[int]:
    """Flat z, y, x indices of the finished blocks whose keys lie on the grid."""
    where = [{span: i for i, span in enumerate(axis)} for axis in spans]
    ny, nx = len(spans[1]), len(spans[2])
    found = set()
    for key in keys:
        try:
            z, y, x = (w[p] for w, p in zip(where, _region(key), strict=True))
        except (KeyError, ValueError):
            continue  # not a block of this grid (another run's key): left out
        found.add((z * ny + y) * nx + x)
    return found
