"""The evaluation scores (engine/evaluate): equal to scikit-image's on small volumes (random
and structured, with background, with uint64 labels of 2**32 and more), the same whatever
the blocks, from a table whose size stays bounded; the border band as CREMI's; and the
volume-level `evaluate` on real Zarr arrays, its refusals one sentence each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import fastremap
import numpy as np
import pytest
import zarr
from scipy import ndimage
from skimage.metrics import adapted_rand_error, variation_of_information

from znni.engine.context import StoreContext
from znni.engine.evaluate import (
    ContingencyTable,
    TableBuilder,
    block_table,
    border_band,
    evaluate,
    score,
)
from znni.engine.evaluate.contingency import aggregate
from znni.engine.evaluate.run import block_boxes
from znni.engine.geometry import Box
from znni.engine.location import Location

CTX = StoreContext()
SHAPE = (9, 14, 17)


def skimage_scores(seg: np.ndarray, gt: np.ndarray) -> tuple[float, ...]:
    """(split, merge, arand, precision, recall) by scikit-image, gt the true image; labels
    renumbered first (skimage indexes a sparse matrix by label; 0 kept as 0 in gt), and its
    precision and recall swapped back (scikit-image issue #6485, scores.py)."""
    g, _ = fastremap.renumber(gt.astype(np.uint64), preserve_zero=True)
    s, _ = fastremap.renumber(seg.astype(np.uint64) if seg.dtype.kind == "u" else seg,
                              preserve_zero=False)
    g, s = g.astype(np.int64), s.astype(np.int64)
    split, merge = variation_of_information(g, s, ignore_labels=(0,))
    are, prec, rec = adapted_rand_error(g, s)
    return float(split), float(merge), float(are), float(rec), float(prec)


def ours(seg: np.ndarray, gt: np.ndarray) -> tuple[float, ...]:
    s = score(block_table(seg, gt))
    return s.voi_split, s.voi_merge, s.arand, s.precision, s.recall


def boxes_volume(shape: tuple[int, int, int], step: tuple[int, int, int],
                 offset: int = 0) -> np.ndarray:
    """Objects as a grid of boxes of `step`, numbered from 1 + offset."""
    z, y, x = np.indices(shape)
    ny, nx = -(-shape[1] // step[1]), -(-shape[2] // step[2])
    return ((z // step[0]) * ny * nx + (y // step[1]) * nx + x // step[2] + 1
            + offset).astype(np.uint64)


def random_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 6, SHAPE), rng.integers(0, 5, SHAPE)


def structured_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    gt = boxes_volume(SHAPE, (3, 5, 6))
    gt[:, :2] = 0  # background
    split = gt.copy()
    split[:, :, :3] += np.uint64(1000)  # every object cut in two
    merged = gt // np.uint64(2)  # pairs of objects joined (and 1 into background 0)
    shifted = np.roll(gt, 1, axis=2)  # every border one voxel off
    big = gt.copy()
    big[gt != 0] += np.uint64(2**40)
    return {"perfect": (gt.copy(), gt), "split": (split, gt), "merged": (merged, gt),
            "shifted": (shifted, gt), "one segment": (np.ones_like(gt), gt),
            "uint64 >= 2**32": (shifted.astype(np.uint64) * np.uint64(2**33) + np.uint64(7),
                                big)}


@pytest.mark.parametrize("seed", range(5))
def test_random_volumes_score_as_skimage(seed: int) -> None:
    seg, gt = random_case(seed)
    np.testing.assert_allclose(ours(seg, gt), skimage_scores(seg, gt), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(structured_cases()))
def test_structured_volumes_score_as_skimage(name: str) -> None:
    seg, gt = structured_cases()[name]
    np.testing.assert_allclose(ours(seg, gt), skimage_scores(seg, gt), rtol=1e-10, atol=1e-12)


def test_a_perfect_segmentation_scores_zero_and_background_is_ignored() -> None:
    seg, gt = structured_cases()["perfect"]
    seg = seg.copy()
    seg[gt == 0] = 5  # whatever the segmentation says in the background
    s = score(block_table(seg, gt))
    assert (s.voi_split, s.voi_merge, s.arand, s.precision, s.recall) == (0, 0, 0, 1, 1)


def test_split_and_merge_are_told_apart() -> None:
    cases = structured_cases()
    split = score(block_table(*cases["split"]))
    merged = score(block_table(*cases["merged"]))
    assert split.voi_split > 0 and split.voi_merge == 0 and split.precision == 1
    assert merged.voi_merge > 0 and merged.voi_split == 0 and merged.recall == 1


def test_signed_labels_with_negatives_score_as_their_renumbering() -> None:
    seg, gt = random_case(7)
    signed = seg.astype(np.int32) - 3  # -3..2: a label -3, and 0 is an ordinary segment
    np.testing.assert_allclose(ours(signed, gt), ours(seg, gt), rtol=1e-12)


def test_no_foreground_is_refused() -> None:
    with pytest.raises(ValueError, match="no foreground voxels"):
        score(ContingencyTable.empty(np.dtype(np.uint64), np.dtype(np.uint64)))


def sorted_rows(t: ContingencyTable) -> list[tuple[int, int, int]]:
    return sorted(zip(t.seg.tolist(), t.gt.tolist(), t.counts.tolist(), strict=True))


def test_blocks_summed_equal_the_whole_table() -> None:
    seg, gt = random_case(11)
    seg = seg.astype(np.uint64) * np.uint64(2**35)
    whole = block_table(seg, gt)
    builder = TableBuilder(min_rows=8)
    for box in block_boxes(Box.from_shape(SHAPE), (4, 5, 3)):
        builder.add_block(seg[box.slices()], gt[box.slices()])
    table = builder.table()
    assert table is not None and sorted_rows(table) == sorted_rows(whole)
    assert table.seg.dtype == np.uint64 and table.voxels == int((gt != 0).sum())
    assert score(table) == score(whole)


def test_the_running_table_stays_bounded() -> None:
    """Many blocks over few distinct pairs: the rows held never exceed about twice the
    distinct pairs (or min_rows) plus one block's, however many blocks are added."""
    gt = boxes_volume((40, 40, 40), (10, 10, 10))
    seg = boxes_volume((40, 40, 40), (10, 20, 5), offset=100)
    boxes = block_boxes(Box.from_shape((40, 40, 40)), (5, 5, 5))
    builder = TableBuilder(min_rows=16)
    biggest = added = 0
    for box in boxes:
        block = block_table(seg[box.slices()], gt[box.slices()])
        biggest, added = max(biggest, len(block)), added + len(block)
        builder.add(block)
    table = builder.table()
    assert table is not None and len(boxes) == 512
    distinct = len(table)
    assert builder.peak_rows <= 2 * max(distinct, 16) + biggest
    assert builder.peak_rows < added / 2  # far fewer rows than the blocks brought
    assert sorted_rows(table) == sorted_rows(block_table(seg, gt))


def test_aggregate_sums_repeated_pairs_exactly() -> None:
    big = np.uint64(2**64 - 1)
    t = ContingencyTable(np.array([big, big, 3], np.uint64), np.array([1, 1, 1], np.int64),
                         np.array([2**40, 5, 1], np.int64))
    assert sorted_rows(aggregate([t, t])) == [(3, 1, 2), (2**64 - 1, 1, 2 * (2**40 + 5))]


def cremi_border_mask(gt: np.ndarray, max_dist: float) -> np.ndarray:
    """CREMI's create_border_mask_2d per z section (cremi_python, evaluation/border_mask)."""
    out = np.zeros(gt.shape, bool)
    for z in range(gt.shape[0]):
        image = gt[z]
        p = np.pad(image, 1, mode="edge")
        interior = ((image == p[:-2, 1:-1]) & (image == p[2:, 1:-1])
                    & (image == p[1:-1, :-2]) & (image == p[1:-1, 2:]))
        out[z] = ndimage.distance_transform_edt(interior) <= max_dist
    return out


@pytest.mark.parametrize("width", [1, 2, 3, 5])
def test_border_band_is_cremis_border_mask(width: int) -> None:
    gt = boxes_volume((4, 30, 33), (2, 9, 7))
    gt[:, 20:] = 0
    np.testing.assert_array_equal(border_band(gt, width), cremi_border_mask(gt, width - 1))


def test_border_band_of_width_one_is_the_voxels_next_to_another_label() -> None:
    gt = np.zeros((1, 5, 6), np.uint64)
    gt[0, :, 3:] = 2
    band = border_band(gt, 1)
    assert band[0, :, 2:4].all() and band.sum() == 10
    assert not border_band(gt, 0).any()


def write(path: Path, values: np.ndarray, chunks: tuple[int, ...] | None = None) -> Location:
    arr = zarr.create_array(str(path), shape=values.shape, dtype=values.dtype,
                            chunks=chunks or tuple(min(8, n) for n in values.shape))
    arr[...] = values
    return Location.parse(str(path))


@pytest.fixture()
def volumes(tmp_path: Path) -> tuple[Location, Location, np.ndarray, np.ndarray]:
    gt = boxes_volume((12, 30, 28), (4, 7, 9), offset=2**32)
    gt[:, :, :4] = 0
    rng = np.random.default_rng(3)
    seg = np.roll(gt, 1, axis=1) // np.uint64(2) + rng.integers(0, 2, gt.shape).astype(np.uint64)
    return write(tmp_path / "seg.zarr", seg), write(tmp_path / "gt.zarr", gt), seg, gt


@pytest.mark.parametrize("block", [(5, 7, 6), (128, 128, 128)])
def test_evaluate_reads_blocks_and_scores_as_skimage(volumes: tuple, block: tuple) -> None:
    seg_loc, gt_loc, seg, gt = volumes
    r = evaluate(seg_loc, gt_loc, block=block, ctx=CTX)
    got = (r.voi_split, r.voi_merge, r.arand, r.precision, r.recall)
    np.testing.assert_allclose(got, skimage_scores(seg, gt), rtol=1e-10, atol=1e-12)
    assert r.voxels == int((gt != 0).sum()) and r.roi_voxels == gt.size
    assert r.gt_objects == len(np.unique(gt[gt != 0])) and r.blocks >= 1


@pytest.mark.parametrize("border", [1, 2])
def test_evaluate_with_a_border_and_roi_scores_the_cropped_volumes_cremi_masked(
        volumes: tuple, border: int) -> None:
    seg_loc, gt_loc, seg, gt = volumes
    crop = (slice(2, 11), slice(3, 29), slice(1, 25))
    masked = gt[crop].copy()
    masked[cremi_border_mask(masked, border - 1)] = 0
    for block in [(4, 5, 6), (64, 64, 64)]:
        r = evaluate(seg_loc, gt_loc, roi=((2, 11), (3, 29), (1, 25)), border=border,
                     block=block, ctx=CTX)
        got = (r.voi_split, r.voi_merge, r.arand, r.precision, r.recall)
        np.testing.assert_allclose(got, skimage_scores(seg[crop], masked), rtol=1e-10,
                                   atol=1e-12)
        assert r.voxels == int((masked != 0).sum()) and r.roi == ((2, 11), (3, 29), (1, 25))


Refusal = Callable[[Path], tuple[Location, Location]]
REFUSALS: dict[str, tuple[Refusal, str]] = {
    "shape": (lambda d: (write(d / "a.zarr", np.ones((4, 5, 6), np.uint32)),
                         write(d / "b.zarr", np.ones((4, 5, 7), np.uint32))),
              r"shape \(4, 5, 6\) .* shape \(4, 5, 7\)"),
    "float": (lambda d: (write(d / "a.zarr", np.ones((4, 5, 6), np.float32)),
                         write(d / "b.zarr", np.ones((4, 5, 6), np.uint32))),
              "segmentation .* has dtype float32; labels must be integers"),
    "channels": (lambda d: (write(d / "a.zarr", np.ones((4, 5, 6), np.uint8)),
                            write(d / "b.zarr", np.ones((2, 4, 5, 6), np.uint8))),
                 "ground truth .* has 2 channels .* a label volume has 1"),
    "missing": (lambda d: (write(d / "a.zarr", np.ones((4, 5, 6), np.uint8)),
                           Location.parse(str(d / "nothing.zarr"))),
                "ground truth .*nothing.zarr does not exist"),
    "background": (lambda d: (write(d / "a.zarr", np.ones((4, 5, 6), np.uint8)),
                              write(d / "b.zarr", np.zeros((4, 5, 6), np.uint8))),
                   "no foreground voxels"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_evaluate_refuses_in_one_sentence(tmp_path: Path, name: str) -> None:
    make, message = REFUSALS[name]
    seg, gt = make(tmp_path)
    with pytest.raises(ValueError, match=message) as e:
        evaluate(seg, gt, ctx=CTX)
    assert "\n" not in str(e.value)


def test_evaluate_refuses_a_negative_border_and_a_bad_block(volumes: tuple) -> None:
    seg_loc, gt_loc, _, _ = volumes
    with pytest.raises(ValueError, match="border -1"):
        evaluate(seg_loc, gt_loc, border=-1, ctx=CTX)
    with pytest.raises(ValueError, match=r"block \(0, 4, 4\)"):
        evaluate(seg_loc, gt_loc, block=(0, 4, 4), ctx=CTX)
