"""Variation of information and adapted Rand error from a contingency table.

The table (`contingency.py`) holds n_ij, the voxels of ground-truth label i and segmentation
label j, over the voxels whose ground truth is not background (0). With N = sum_ij n_ij,
g_i = sum_j n_ij (ground-truth object sizes) and s_j = sum_i n_ij (segment sizes):

VOI (Meila 2007, "Comparing clusterings - an information based distance", J. Multivariate
Anal. 98(5); in bits, log base 2, as skimage.metrics.variation_of_information(gt, seg,
ignore_labels=(0,)), which returns (split, merge) in this order):

    split = H(seg | gt) = -sum_ij (n_ij / N) log2(n_ij / g_i)   (over-segmentation)
    merge = H(gt | seg) = -sum_ij (n_ij / N) log2(n_ij / s_j)   (under-segmentation)

Adapted Rand (SNEMI3D: Arganda-Carreras et al. 2015, Front. Neuroanat. 9:142, eq. for
V^Rand with alpha = 1/2; counted over ordered pairs of distinct voxels, as
skimage.metrics.adapted_rand_error(gt, seg) counts them: sum x^2 - x):

    P = sum_ij n_ij^2 - N   pairs together in both
    T = sum_i  g_i^2  - N   pairs together in the ground truth
    S = sum_j  s_j^2  - N   pairs together in the segmentation
    precision = P / S  (the Rand merge score),  recall = P / T  (the Rand split score)
    arand = 1 - P / (S / 2 + T / 2)  = 1 - the harmonic mean of precision and recall

skimage (0.26) returns the last two the other way round (it divides by T for its
"precision", against its own docstring; scikit-image issue #6485); arand is the same
either way. A ratio of 0 pairs to 0 pairs (every object one voxel) is nan, as in skimage.
"""

from __future__ import annotations

from dataclasses import dataclass

import fastremap
import numpy as np

from znni.engine.evaluate.contingency import ContingencyTable


@dataclass(frozen=True)
class Scores:
    """The scores of one table; VOI in bits, the Rand scores in [0, 1]."""

    voi_split: float
    voi_merge: float
    arand: float
    precision: float
    recall: float

    @property
    def voi(self) -> float:
        """The variation of information, split + merge."""
        return self.voi_split + self.voi_merge


def score(table: ContingencyTable) -> Scores:
    """VOI split and merge and the adapted Rand error, precision and recall of `table`;
    ValueError for a table of no voxels (nothing in the ground truth to score against)."""
    if table.voxels == 0:
        raise ValueError("the ground truth has no foreground voxels (label other than 0) to "
                         "score against")
    split, merge = voi(table)
    arand, precision, recall = adapted_rand(table)
    return Scores(split, merge, arand, precision, recall)


def voi(table: ContingencyTable) -> tuple[float, float]:
    """(split, merge) = (H(seg | gt), H(gt | seg)) in bits (the module's formulas)."""
    n = table.counts.astype(np.float64)
    total = n.sum()
    g_of_row, _ = sizes_by_label(table.gt, n)
    s_of_row, _ = sizes_by_label(table.seg, n)
    p = n / total
    split = -float(np.sum(p * np.log2(n / g_of_row)))
    merge = -float(np.sum(p * np.log2(n / s_of_row)))
    return split + 0.0, merge + 0.0  # -0.0 as 0.0


def adapted_rand(table: ContingencyTable) -> tuple[float, float, float]:
    """(arand, precision, recall) of `table` (the module's formulas)."""
    n = table.counts.astype(np.float64)
    total = n.sum()
    _, g = sizes_by_label(table.gt, n)
    _, s = sizes_by_label(table.seg, n)
    both = float(n @ n - total)
    in_gt = float(g @ g - total)
    in_seg = float(s @ s - total)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = float(np.float64(both) / np.float64(in_seg))
        recall = float(np.float64(both) / np.float64(in_gt))
        fscore = float(np.float64(both) / np.float64(0.5 * in_seg + 0.5 * in_gt))
    return 1.0 - fscore, precision, recall


def sizes_by_label(labels: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's label's total count, the totals of the distinct labels) for table rows
    `labels` with `counts` (float64: exact to 2**53 voxels)."""
    renumbered, _ = fastremap.renumber(labels, preserve_zero=False, in_place=False)
    idx = renumbered.astype(np.intp)
    totals = np.bincount(idx, weights=counts)  # index 0 unused: fastremap numbers from 1
    return totals[idx], totals[1:]
