"""Block geometry and border index mapping, checked against brute force and np.pad."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from znni.engine.geometry import Box, Halo, make_block, patch_starts, patch_tiling, split_blocks
from znni.engine.io.borders import read_with_border, reflect_indices


def test_box_basics() -> None:
    b = Box((1, 2, 3), (4, 6, 8))
    assert b.shape == (3, 4, 5) and b.size == 60
    assert b.key() == "1:4,2:6,3:8"
    assert b.grow((1, 1, 1), (2, 0, 0)) == Box((0, 1, 2), (6, 6, 8))
    assert b.intersect(Box((3, 0, 0), (10, 3, 4))) == Box((3, 2, 3), (4, 3, 4))
    assert b.intersect(Box((4, 0, 0), (5, 9, 9))) is None
    assert b.slices((1, 1, 1)) == (slice(0, 3), slice(1, 5), slice(2, 7))
    with pytest.raises(ValueError, match="exceeds"):
        Box((2, 0, 0), (1, 1, 1))


@pytest.mark.parametrize("fov", [(1, 1, 1), (6, 4, 7), (85, 85, 85)])
def test_halo_matches_dense_window_start(fov: tuple[int, int, int]) -> None:
    halo = Halo.for_fov(fov)
    for d in range(3):
        assert halo.lo[d] == (fov[d] - 1) // 2  # window of voxel i starts at i - (fov-1)//2
        assert halo.lo[d] + halo.hi[d] + 1 == fov[d]


@pytest.mark.parametrize(
    "region,block,chunks",
    [
        (Box((0, 0, 0), (40, 50, 60)), (16, 16, 16), (8, 16, 16)),
        (Box((3, 7, 0), (40, 33, 59)), (10, 7, 20), (5, 7, 10)),
        (Box((0, 0, 0), (5, 5, 5)), (64, 64, 64), (64, 64, 64)),
    ],
)
def test_split_blocks_tile_the_region_on_the_chunk_grid(region: Box, block, chunks) -> None:
    halo, pool = Halo((2, 1, 3), (3, 2, 2)), (2, 1, 2)
    blocks = split_blocks(region, block, chunks, halo, pool)
    covered = np.zeros(region.hi, dtype=int)
    for i, b in enumerate(blocks):
        assert b.index == i
        covered[b.write.slices()] += 1
        assert region.contains(b.write)
        # every face is on the chunk grid or on the region's face: no chunk shared by two blocks
        for d in range(3):
            assert b.write.lo[d] % chunks[d] == 0 or b.write.lo[d] == region.lo[d]
            assert b.write.hi[d] % chunks[d] == 0 or b.write.hi[d] == region.hi[d]
            assert b.compute.shape[d] % pool[d] == 0
            assert b.compute.shape[d] - b.write.shape[d] < pool[d]
        assert b.read == b.compute.grow(halo.lo, halo.hi)
    inside = covered[region.slices()]
    assert inside.min() == 1 and inside.max() == 1 and covered.sum() == region.size
    assert len({b.key for b in blocks}) == len(blocks)


def test_make_block_halo_is_explicit() -> None:
    b = make_block(0, Box((10, 10, 10), (17, 20, 20)), Halo((2, 1, 0), (3, 1, 0)), (2, 1, 1))
    assert b.compute == Box((10, 10, 10), (18, 20, 20))
    assert b.read == Box((8, 9, 10), (21, 21, 20))


@pytest.mark.parametrize("extent,patch", [(10, 4), (12, 4), (4, 4), (7, 2), (1, 1)])
def test_patch_starts_cover_exactly(extent: int, patch: int) -> None:
    starts = patch_starts(extent, patch)
    hit = np.zeros(extent, dtype=bool)
    for s in starts:
        assert 0 <= s and s + patch <= extent
        hit[s : s + patch] = True
    assert hit.all()
    with pytest.raises(ValueError):
        patch_starts(3, 4)


def test_patch_tiling_covers_block() -> None:
    hit = np.zeros((9, 6, 10), dtype=int)
    for box in patch_tiling((9, 6, 10), (4, 6, 3)):
        assert box.shape == (4, 6, 3)
        hit[box.slices()] += 1
    assert hit.min() >= 1


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_reflect_indices_match_np_pad(n: int) -> None:
    a = np.arange(n)
    for pad in [0, 1, n, 3 * n + 2]:
        ref = np.pad(a, (pad, pad + 1), mode="reflect")
        got = a[reflect_indices(-pad, n + pad + 1, n)]
        assert np.array_equal(got, ref), (n, pad)


@pytest.mark.parametrize("mode", ["reflect", "zero"])
def test_read_with_border_equals_pad_of_whole_volume(mode: str) -> None:
    rng = np.random.default_rng(1)
    vol = rng.integers(0, 255, size=(2, 5, 7, 3)).astype(np.uint8)  # (C, Z, Y, X)
    shape = (5, 7, 3)
    pad = 9  # wider than the volume on some axes
    np_mode = "reflect" if mode == "reflect" else "constant"
    padded = np.pad(vol, [(0, 0)] + [(pad, pad)] * 3, mode=np_mode)
    reads: list[Box] = []

    def read(box: Box) -> np.ndarray:
        assert Box.from_shape(shape).contains(box)  # never reads outside the volume
        reads.append(box)
        return vol[(slice(None), *box.slices())]

    boxes = [Box((-9, -9, -9), (14, 16, 12)), Box((1, 2, 0), (4, 6, 3)), Box((3, -2, 1), (7, 3, 5))]
    lo = (-9, -9, -9)
    for lz, ly, lx in itertools.product([-9, -1, 2], [-4, 0, 5], [-9, 1]):
        boxes.append(Box((lz, ly, lx), (lz + 6, ly + 11, lx + 4)))
    for box in boxes:
        got = read_with_border(read, box, shape, mode)
        assert got.dtype == vol.dtype
        ref = padded[(slice(None), *box.slices(lo))]
        assert np.array_equal(got, ref), box
