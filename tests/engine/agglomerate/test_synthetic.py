"""Synthetic ground truth and affinities (engine/agglomerate/synthetic.py): deterministic,
waterz's affinity convention, tubes across the volume, leak/noise/blur as documented, and
data that whole-volume waterz segments neither perfectly nor hopelessly."""

from __future__ import annotations

import math

import cc3d
import numpy as np
import pytest
from scipy import ndimage
from skimage.metrics import adapted_rand_error, variation_of_information

from znni.engine.agglomerate.synthetic import (
    SHOULDER,
    affinities_from_labels,
    synthetic_cells,
)

SMALL = (32, 48, 48)


def first_planes_off(shape: tuple[int, int, int]) -> np.ndarray:
    """(3, z, y, x) True where the edge exists (not the first plane along its channel)."""
    exists = np.ones((3, *shape), dtype=bool)
    exists[0, 0], exists[1, :, 0], exists[2, :, :, 0] = False, False, False
    return exists


def waterz_scores(gt: np.ndarray, affs: np.ndarray, threshold: float = 0.5) -> tuple[float, float, float]:
    """(VOI split, VOI merge, adapted Rand error) of whole-volume waterz against gt."""
    import waterz

    seg = next(iter(waterz.agglomerate(affs, [threshold]))).copy()
    split, merge = variation_of_information(gt, seg, ignore_labels=(0,))
    arand = adapted_rand_error(gt, seg, ignore_labels=(0,))[0]
    return float(split), float(merge), float(arand)


def test_same_seed_same_arrays_other_seed_other_arrays():
    gt1, affs1 = synthetic_cells(SMALL, seed=3)
    gt2, affs2 = synthetic_cells(SMALL, seed=3)
    gt3, affs3 = synthetic_cells(SMALL, seed=4)
    np.testing.assert_array_equal(gt1, gt2)
    np.testing.assert_array_equal(affs1, affs2)
    assert not np.array_equal(gt1, gt3)
    assert not np.array_equal(affs1, affs3)


def test_shapes_dtypes_and_ranges():
    gt, affs = synthetic_cells(SMALL, seed=1)
    assert gt.shape == SMALL and gt.dtype == np.uint64
    assert affs.shape == (3, *SMALL) and affs.dtype == np.float32
    assert affs.flags.c_contiguous  # waterz would copy otherwise
    assert affs.min() >= 0 and affs.max() <= 1
    assert not affs[~first_planes_off(SMALL)].any()
    ids = np.unique(gt)
    np.testing.assert_array_equal(ids, np.arange(len(ids)))  # 0 (gaps) and 1..n, no holes
    assert 0 < np.count_nonzero(gt == 0) < 0.05 * gt.size  # a thin background, not none
    assert len(ids) > 10


def test_objects_are_connected_pieces():
    """Each object is one 6-connected piece (what its affinities connect), none a speck."""
    gt, _ = synthetic_cells((48, 64, 64), seed=2)
    pieces = cc3d.connected_components(gt, connectivity=6)
    assert int(pieces.max()) == int(gt.max())
    assert np.bincount(gt.ravel())[1:].min() >= 8


def test_anisotropic_cells_follow_cell_size():
    """Cells about cell_size voxels: half as many along z as along y, x for the default."""
    gt, _ = synthetic_cells((48, 96, 96), seed=0, tubes=0)
    extents = np.array([[s.stop - s.start for s in sl] for sl in ndimage.find_objects(gt) if sl])
    median = np.median(extents, axis=0)
    assert 0.35 < median[0] / median[1] < 0.7
    assert 0.8 < median[1] / median[2] < 1.25


def test_affinity_convention_on_hand_made_labels():
    labels = np.array(
        [
            [[1, 1, 2], [1, 0, 2]],
            [[1, 3, 2], [1, 1, 2]],
        ],
        dtype=np.int32,
    )
    expected = np.zeros((3, 2, 2, 3), dtype=np.float32)
    # channel 0 (z): voxel (1, y, x) to (0, y, x); plane z = 0 has no edge
    expected[0, 1] = [[1, 0, 1], [1, 0, 1]]
    # channel 1 (y): voxel (z, 1, x) to (z, 0, x): 0 into the background voxel and 1 -> 3
    expected[1, 0, 1] = [1, 0, 1]
    expected[1, 1, 1] = [1, 0, 1]
    # channel 2 (x): voxel (z, y, x) to (z, y, x - 1)
    expected[2, 0, 0] = [0, 1, 0]
    expected[2, 0, 1] = [0, 0, 0]
    expected[2, 1, 0] = [0, 0, 0]
    expected[2, 1, 1] = [0, 1, 0]
    affs = affinities_from_labels(labels)
    assert affs.dtype == np.float32
    np.testing.assert_array_equal(affs, expected)
    np.testing.assert_array_equal(affinities_from_labels(labels.astype(np.uint64)), expected)


def test_affinities_from_labels_needs_3d():
    with pytest.raises(ValueError, match="3D"):
        affinities_from_labels(np.ones((4, 4), dtype=np.uint64))


@pytest.mark.parametrize(
    "kwargs",
    [{"leak": 1.5}, {"leak": -0.1}, {"noise": -1.0}, {"blur": -1.0}, {"tubes": -1},
     {"tube_radius": 0.0}, {"cell_size": (0.0, 24.0, 24.0)}],
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        synthetic_cells(SMALL, **kwargs)


def test_without_blur_leak_noise_the_affinities_are_the_labels():
    gt, affs = synthetic_cells(SMALL, seed=5, blur=0, leak=0, noise=0)
    np.testing.assert_array_equal(affs, affinities_from_labels(gt))


def test_tubes_cross_at_least_half_the_volume():
    """Each tube is an object spanning at least half the volume along some axis (most run
    face to face; one cut by a crossing tube painted earlier still spans half); cells
    never do, so without tubes there are none."""
    shape = (64, 128, 128)

    def long_objects(gt: np.ndarray) -> int:
        spans = [
            max((sl[a].stop - sl[a].start) / shape[a] for a in range(3))
            for sl in ndimage.find_objects(gt)
            if sl
        ]
        return sum(span >= 0.5 for span in spans)

    for seed in (0, 1, 2):
        assert long_objects(synthetic_cells(shape, seed=seed, tubes=4)[0]) == 4
        assert long_objects(synthetic_cells(shape, seed=seed, tubes=0)[0]) == 0


def test_tube_radius_sets_their_thickness():
    shape = (64, 128, 128)
    thin, _ = synthetic_cells(shape, seed=0, tubes=3, tube_radius=2.0)
    thick, _ = synthetic_cells(shape, seed=0, tubes=3, tube_radius=4.0)

    def tube_voxels(gt: np.ndarray) -> int:
        sizes = np.bincount(gt.ravel())
        spans = [max((sl[a].stop - sl[a].start) / shape[a] for a in range(3))
                 for sl in ndimage.find_objects(gt) if sl]
        return int(sum(sizes[i + 1] for i, span in enumerate(spans) if span >= 0.5))

    # cross-sections pi r^2 (a bit more voxels for a discrete ball's sweep)
    assert 2.5 < tube_voxels(thick) / tube_voxels(thin) < 5.5


def test_leak_raises_that_fraction_of_boundary_edges():
    """Without blur and noise, about a fraction `leak` of the zero edges of the labels are
    raised to [0.75, 1] (patches overlap a little: slightly fewer), the others untouched."""
    for leak in (0.02, 0.1):
        gt, affs = synthetic_cells((48, 64, 64), seed=0, blur=0, noise=0, leak=leak)
        clean = affinities_from_labels(gt)
        boundary = (clean == 0) & first_planes_off(gt.shape)
        raised = affs[boundary] > 0
        assert 0.8 * leak < raised.mean() <= leak * 1.05
        assert affs[boundary][raised].min() >= 0.75
        np.testing.assert_array_equal(affs[clean == 1], 1)


def test_noise_is_additive_gaussian_clipped():
    """Without blur and leak: on the edges that are 1 the noise can only lower them (the
    clip), so their mean is 1 - noise / sqrt(2 pi); on the (existing) zero edges it is
    + noise / sqrt(2 pi)."""
    noise = 0.1
    gt, affs = synthetic_cells((48, 64, 64), seed=0, blur=0, leak=0, noise=noise)
    clean = affinities_from_labels(gt)
    exists = first_planes_off(gt.shape)
    half_normal = noise / math.sqrt(2 * math.pi)
    assert abs(affs[clean == 1].mean() - (1 - half_normal)) < 0.003
    assert abs(affs[(clean == 0) & exists].mean() - half_normal) < 0.003
    assert not affs[~exists].any()


def test_blur_lowers_edges_near_boundaries_only():
    """Smearing keeps crossing edges at 0 and lowers the edges near a boundary by at most
    SHOULDER (exactly SHOULDER next to a flat one); far from boundaries hardly anything
    changes, and a wider blur lowers more edges."""
    gt, affs = synthetic_cells((48, 64, 64), seed=0, leak=0, noise=0, blur=1.0)
    _, wide = synthetic_cells((48, 64, 64), seed=0, leak=0, noise=0, blur=2.0)
    clean = affinities_from_labels(gt)
    assert not affs[clean == 0].any()
    inside = affs[clean == 1]
    assert inside.min() >= 1 - SHOULDER - 1e-6
    assert np.isclose(inside, 1 - SHOULDER, atol=1e-3).any()
    assert 0.2 < (inside > 0.99).mean() < 0.95  # the gaussian's tail: > 0.99, not 1
    assert (wide[clean == 1] < 0.99).mean() > (inside < 0.99).mean()


def test_waterz_is_neither_perfect_nor_hopeless():
    """Whole-volume waterz at 0.5 on the defaults: leaks merge some neighbours and noise
    splits some objects (measured on this volume: split 0.29, merge 0.38, ARAND 0.15),
    while without leaks and noise it is perfect (measured: 0, 0, 0)."""
    gt, affs = synthetic_cells((64, 96, 96), seed=0)
    split, merge, arand = waterz_scores(gt, affs)
    assert 0.05 < split < 0.8
    assert 0.1 < merge < 1.2
    assert 0.03 < arand < 0.4
    gt, affs = synthetic_cells((64, 96, 96), seed=0, leak=0, noise=0)
    split, merge, arand = waterz_scores(gt, affs)
    assert split + merge < 0.02 and arand < 0.01
