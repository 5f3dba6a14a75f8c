"""Blocks of exact graph jobs (issue 39): each block runs its own tiles, so the default
block extent is the one whose blocks run the fewest tiles; hand-computed cases."""

from __future__ import annotations

import pytest

from znni.engine.compute.tiles import (
    MAX_BLOCK_TILES,
    axis_tiles,
    exact_block_extent,
    tile_starts,
)
from znni.planner.blocks import grid_cuts


def test_tiles_per_block_by_hand() -> None:
    """Tiles of 88 output voxels on a grid of 16 step by 80 (88 // 16 * 16). A 192-voxel
    block [0, 192) runs tiles at 0, 80 and 160 (160 + 88 > 192: the third is mostly cut
    off); [384, 400) runs one for 16 voxels."""
    assert tile_starts(0, 192, 16, 88) == [0, 80, 160]
    assert tile_starts(384, 400, 16, 88) == [384]
    assert axis_tiles(grid_cuts(0, 400, 192), 16, 88) == 3 + 3 + 1
    assert axis_tiles(grid_cuts(0, 400, 256), 16, 88) == 4 + 2
    assert axis_tiles(grid_cuts(0, 400, 320), 16, 88) == 4 + 1
    assert axis_tiles([0, 400], 16, 88) == 5  # one block: the ideal


def test_block_extent_runs_the_fewest_tiles() -> None:
    """Chunks of 64: candidates from 192 (two tiles, on whole chunks) to 352 (four tiles'
    output); 320 runs the ideal 5 tiles where the old two-tile block (192) ran 7."""
    assert exact_block_extent(64, 16, 88, 0, 400) == 320
    # a region no wider than two tiles: one block over it
    assert exact_block_extent(64, 16, 88, 0, 150) == 192
    # ties go to the smaller block: tiles of 64 on chunks of 64 run one tile per chunk
    assert exact_block_extent(64, 16, 64, 0, 1000) == 128


@pytest.mark.parametrize("chunk, factor, out, lo, hi", [
    (8, 2, 13, 0, 29), (5, 1, 7, 3, 40), (64, 16, 88, 17, 1000), (32, 4, 40, 0, 77),
])
def test_block_extent_never_runs_more_tiles_than_two_tile_blocks(chunk, factor, out, lo,
                                                                  hi) -> None:
    """Whole chunks, within MAX_BLOCK_TILES tile outputs (or the region), and never more
    tiles than the former default (about two tile outputs per block)."""
    extent = exact_block_extent(chunk, factor, out, lo, hi)
    assert extent % chunk == 0
    assert extent <= max(MAX_BLOCK_TILES * out, -(-(hi - lo) // chunk) * chunk,
                         -(-min(max(2 * out, chunk), max(hi - lo, chunk)) // chunk) * chunk)
    two = -(-min(max(2 * out, chunk), max(hi - lo, chunk)) // chunk) * chunk
    assert (axis_tiles(grid_cuts(lo, hi, extent), factor, out)
            <= axis_tiles(grid_cuts(lo, hi, two), factor, out))
