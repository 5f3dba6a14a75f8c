"""The agglomeration's pieces against independent references: the block-by-block watershed
against a voxel-by-voxel one, the agglomeration against a one-merge-per-scan greedy one and
against whole-volume waterz; and the result the same for any blocking (odd, anisotropic
blocks, a region, a mask)."""

from __future__ import annotations

import numpy as np
import pytest
from support.agglomerate_ref import (
    blockwise,
    naive_agglomerate,
    naive_basins,
    smooth_affinities,
)

from znni.engine.agglomerate import merge
from znni.engine.agglomerate.fragments import QUANTUM
from znni.engine.geometry import Box

SHAPE = (9, 11, 13)


def test_canonical_ids_name_each_fragment_by_its_first_voxel() -> None:
    affs = smooth_affinities(SHAPE, 0)
    fragments, _, _ = blockwise(affs, (4, 5, 6), [0.5])
    for name in np.unique(fragments)[1:3]:
        first = np.flatnonzero(fragments.ravel() == name)[0]
        assert name == first + 1


@pytest.mark.parametrize("block", [(9, 11, 13), (4, 5, 6), (3, 11, 2), (1, 4, 13)])
def test_basins_equal_a_voxel_by_voxel_watershed(block: tuple[int, int, int]) -> None:
    affs = smooth_affinities(SHAPE, 1)
    _, basins, _ = blockwise(affs, block, [0.5])
    assert np.array_equal(basins, naive_basins(affs))


def test_basins_with_ties_high_edges_and_background_equal_the_reference() -> None:
    """uint8-like affinities (many equal values), saturated edges (>= high) and dead voxels
    (every edge <= low) follow the same rules block by block as voxel by voxel."""
    rng = np.random.default_rng(2)
    affs = (rng.integers(0, 6, (3, *SHAPE)) / 5).astype(np.float32)  # 0, 0.2, ..., 1
    affs[:, 2:4, 3:6, 4:8] = 0.0  # a dead region: background
    _, basins, _ = blockwise(affs, (4, 3, 5), [0.5])
    expected = naive_basins(affs)
    assert np.array_equal(basins, expected)
    assert (expected == 0).any() and len(np.unique(expected)) > 3


def test_basins_within_a_mask_equal_the_reference() -> None:
    affs = smooth_affinities(SHAPE, 3)
    mask = np.ones(SHAPE, bool)
    mask[:, 5, :] = False  # a wall: nothing crosses it
    mask[0:3, :, 0:4] = False
    _, basins, _ = blockwise(affs, (4, 4, 4), [0.5], mask=mask)
    expected = naive_basins(affs, mask)
    assert np.array_equal(basins, expected)
    assert not basins[~mask].any()


@pytest.mark.parametrize("threshold", [0.2, 0.45, 0.6])
def test_agglomeration_equals_greedy_one_merge_at_a_time(threshold: float) -> None:
    affs = smooth_affinities((6, 7, 8), 4, sigma=1.0)
    _, basins, (segmentation,) = blockwise(affs, (3, 4, 5), [threshold])
    expected = naive_agglomerate(basins, affs, threshold)
    assert np.array_equal(segmentation, expected)
    assert 1 < len(np.unique(segmentation)) < len(np.unique(basins)) or threshold == 0.2


@pytest.mark.parametrize("block", [(32, 32, 32), (7, 9, 11), (16, 5, 30)])
def test_the_partition_does_not_depend_on_the_blocks(block: tuple[int, int, int]) -> None:
    affs = smooth_affinities((24, 28, 30), 6)
    _, _, whole = blockwise(affs, (24, 28, 30), [0.3, 0.5])
    _, _, blocked = blockwise(affs, block, [0.3, 0.5])
    for a, b in zip(whole, blocked, strict=True):
        assert np.array_equal(a, b)


def test_a_region_is_agglomerated_as_if_it_were_the_volume() -> None:
    affs = smooth_affinities((20, 22, 24), 7)
    region = Box((3, 2, 5), (17, 21, 20))
    _, _, (inside,) = blockwise(affs, (6, 6, 6), [0.5], region=region)
    crop = np.ascontiguousarray(affs[(slice(None), *region.slices())])
    _, _, (alone,) = blockwise(crop, (20, 20, 20), [0.5])
    part = inside[region.slices()]
    assert not inside[:3].any()
    # the same partition (ids differ: they name voxels of the whole volume)
    pairs = np.unique(np.stack([part.ravel(), alone.ravel()]), axis=1)
    assert pairs.shape[1] == len(np.unique(part)) == len(np.unique(alone))


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.65])
def test_equals_whole_volume_waterz(threshold: float) -> None:
    """waterz's own watershed and agglomeration on the whole volume in memory: the same
    segmentation (float affinities: no ties), up to the names."""
    waterz = pytest.importorskip("waterz")
    affs = smooth_affinities((20, 24, 28), 8)
    _, _, (ours,) = blockwise(affs, (8, 9, 10), [threshold])
    theirs = next(waterz.agglomerate(affs, [threshold]))
    pairs = np.unique(np.stack([ours.ravel(), theirs.ravel()]), axis=1)
    assert pairs.shape[1] == len(np.unique(ours)) == len(np.unique(theirs))


def test_scores_are_one_minus_the_mean_affinity() -> None:
    total = np.array([QUANTUM * 3 // 2, 0], dtype=np.int64)
    count = np.array([2, 5], dtype=np.int64)
    assert np.allclose(merge.scores(total, count), [0.25, 1.0])
