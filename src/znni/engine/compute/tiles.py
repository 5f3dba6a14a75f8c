"""Tile arithmetic of exact graph jobs (valid U-Nets): pure integers, no arrays.

A valid network with total downsampling F is translation-equivariant for shifts that
are multiples of F, so its output is tiled on the F grid aligned to the volume origin
(docs/design.md, "Dense output modes"). The exact-graph worker, the graph choice and
`znni plan` all place tiles with these three functions.
"""

from __future__ import annotations

from itertools import pairwise
from math import prod
from typing import TYPE_CHECKING

from znni.engine.geometry import Box, Triple
from znni.planner.blocks import grid_cuts

if TYPE_CHECKING:
    from znni.model.onnx_model import OnnxModel


def tile_output(model: OnnxModel, tile: Triple) -> Triple:
    """The output voxels of one tile of input size `tile`."""
    out = [t - c for t, c in zip(tile, model.context, strict=True)]
    return (out[0], out[1], out[2])


def context_lo(model: OnnxModel) -> Triple:
    """Input voxels a tile reads before its first output voxel (half the context)."""
    c = model.context
    return (c[0] // 2, c[1] // 2, c[2] // 2)


def tile_starts(lo: int, hi: int, factor: int, out: int) -> list[int]:
    """Output starts on the factor grid covering [lo, hi) with tiles of `out` voxels."""
    step = out // factor * factor
    if step < 1:
        raise ValueError(f"a tile output of {out} voxels is less than the grid step {factor}")
    starts = [lo // factor * factor]
    while starts[-1] + out < hi:
        starts.append(starts[-1] + step)
    return starts


# a block's extent per axis for exact tiles: at least two tile outputs (or the region), as
# layout.windowed_block_shape, and at most this many, on whole chunks
MAX_BLOCK_TILES = 4


def axis_tiles(cuts: list[int], factor: int, out: int) -> int:
    """Tiles the exact worker runs along one axis over blocks cut at `cuts` (each block
    places its own tiles, tile_starts: a block's last tile runs whole however little of
    it the block keeps)."""
    return sum(len(tile_starts(lo, hi, factor, out)) for lo, hi in pairwise(cuts))


def exact_block_extent(chunk: int, factor: int, out: int, lo: int, hi: int) -> int:
    """The block extent on one axis with the fewest tiles over [lo, hi) (ties: the
    smaller block): whole chunks from about two tile outputs up to MAX_BLOCK_TILES of them
    (or the region). A 192-voxel block of 88-voxel tiles runs 3 tiles for 2.2 tiles' worth
    of output; 176 runs 2 for 2 (issue 39: no block computes much more than its share)."""
    region = hi - lo
    smallest = -(-min(max(2 * out, chunk), max(region, chunk)) // chunk) * chunk
    largest = max(smallest, min(MAX_BLOCK_TILES * out, -(-region // chunk) * chunk))
    best: tuple[int, int] | None = None
    for extent in range(smallest, largest + 1, chunk):
        tiles = axis_tiles(grid_cuts(lo, hi, extent), factor, out)
        if best is None or tiles < best[0]:
            best = (tiles, extent)
    assert best is not None  # smallest <= largest: one extent at least
    return best[1]


def exact_block_shape(model: OnnxModel, tile: Triple, chunks: Triple, region: Box) -> Triple:
    """Per axis exact_block_extent for the tile's output (`segment`'s default block for an
    exact graph job; `znni plan` predicts the same)."""
    out = tile_output(model, tile)
    f = model.size_factor
    z, y, x = (exact_block_extent(chunks[a], f[a], out[a], region.lo[a], region.hi[a])
               for a in range(3))
    return (z, y, x)


def block_tiles(model: OnnxModel, tile: Triple, block: Triple, region: Box) -> int:
    """Tiles the run computes over `region` cut into blocks of `block` (whole chunks)."""
    out = tile_output(model, tile)
    f = model.size_factor
    return prod(axis_tiles(grid_cuts(region.lo[a], region.hi[a], block[a]), f[a], out[a])
                for a in range(3))
