"""The contingency table of a segmentation against its ground truth, built block by block.

Every score `scores.py` computes (VOI, adapted Rand) is a function of the voxel counts n_ij
of the (segmentation label j, ground-truth label i) pairs that occur together, so two
volumes larger than memory are scored by counting each block's pairs and summing the
counts: the table holds one row per distinct pair, never a voxel.

Memory: a row is its two labels (their volumes' dtypes, at most 8 bytes each) and an int64
count, at most 24 bytes per distinct pair held. `TableBuilder` sums block tables into one
table when what it holds since the last sum outgrows that table (and `min_rows`), so it
holds at most about twice the distinct pairs (or `min_rows` rows) plus the summing's
temporaries (about 40 bytes a row).

Pairs are counted with fastremap (hash-based relabelling and counting, an order of
magnitude faster than np.unique's sorts on a 128^3 block); labels keep their dtype, so
uint64 labels of 2**32 and more, and negative ones of signed types, count like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import fastremap
import numpy as np

# the table rows TableBuilder may hold unsummed whatever the table's size (2**22 rows:
# 96 MiB); below it, a block's table is only appended
MIN_ROWS = 1 << 22


@dataclass(frozen=True)
class ContingencyTable:
    """Distinct (segmentation, ground truth) label pairs and their voxel counts (int64);
    pairs are distinct once `aggregate`d (a block's table is)."""

    seg: np.ndarray
    gt: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return int(self.counts.size)

    @property
    def voxels(self) -> int:
        return int(self.counts.sum())

    @staticmethod
    def empty(seg_dtype: np.dtype, gt_dtype: np.dtype) -> ContingencyTable:
        return ContingencyTable(np.zeros(0, seg_dtype), np.zeros(0, gt_dtype),
                                np.zeros(0, np.int64))


def block_table(seg: np.ndarray, gt: np.ndarray) -> ContingencyTable:
    """The table of one block: the pairs of its voxels whose ground truth is not 0 (the
    background, ignored as in skimage's `ignore_labels=(0,)` for the true image; a border
    band is ignored by setting its ground truth to 0 first)."""
    if seg.shape != gt.shape:
        raise ValueError(f"a block's segmentation {seg.shape} and ground truth {gt.shape} "
                         "differ in shape")
    keep = gt.ravel() != 0
    s, g = seg.ravel()[keep], gt.ravel()[keep]
    if s.size == 0:
        return ContingencyTable.empty(seg.dtype, gt.dtype)
    (s_idx, s_labels), (g_idx, g_labels) = _renumber(s), _renumber(g)
    key = s_idx * np.uint64(g_labels.size) + g_idx
    pairs, counts = fastremap.unique(key, return_counts=True)
    return _decode(pairs, counts.astype(np.int64), s_labels, g_labels)


def aggregate(tables: list[ContingencyTable]) -> ContingencyTable:
    """The tables' rows summed into one row per distinct pair (integer sums: exact)."""
    if len(tables) == 1 and len(tables[0]) == 0:
        return tables[0]
    s = np.concatenate([t.seg for t in tables])
    g = np.concatenate([t.gt for t in tables])
    c = np.concatenate([t.counts for t in tables])
    if c.size == 0:
        return ContingencyTable(s, g, c)
    (s_idx, s_labels), (g_idx, g_labels) = _renumber(s), _renumber(g)
    key = s_idx * np.uint64(g_labels.size) + g_idx
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    counts = np.add.reduceat(c[order], starts)
    return _decode(key[starts], counts, s_labels, g_labels)


def _renumber(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each label's index 0..k-1 as uint64, the k distinct labels by index)."""
    idx, mapping = fastremap.renumber(labels, preserve_zero=False, in_place=False)
    distinct = np.empty(len(mapping), labels.dtype)
    distinct[np.fromiter(mapping.values(), np.int64, len(mapping)) - 1] = np.fromiter(
        mapping.keys(), labels.dtype, len(mapping))
    return idx.astype(np.uint64) - np.uint64(1), distinct


def _decode(pairs: np.ndarray, counts: np.ndarray, s_labels: np.ndarray,
            g_labels: np.ndarray) -> ContingencyTable:
    """Pair keys (segmentation index * ground-truth labels + ground-truth index) back to
    labels."""
    n_gt = np.uint64(g_labels.size)
    return ContingencyTable(s_labels[pairs // n_gt], g_labels[pairs % n_gt], counts)


class TableBuilder:
    """A running contingency table: block tables appended, summed into one table whenever
    the rows held since the last sum exceed both that table's rows and `min_rows`, so the
    rows held stay below about twice the distinct pairs (or `min_rows`) whatever the number
    of blocks, and each row is summed O(log(blocks)) times at most."""

    def __init__(self, min_rows: int = MIN_ROWS) -> None:
        if min_rows < 1:
            raise ValueError(f"min_rows {min_rows} must be at least 1")
        self.min_rows = min_rows
        self._summed: ContingencyTable | None = None
        self._pending: list[ContingencyTable] = []
        self._pending_rows = 0
        self.peak_rows = 0  # the most rows held at once (what the bound is about)

    @property
    def rows(self) -> int:
        """Rows held now (summed and pending)."""
        return self._pending_rows + (len(self._summed) if self._summed is not None else 0)

    def add_block(self, seg: np.ndarray, gt: np.ndarray) -> None:
        """Count one block's pairs (`block_table`)."""
        self.add(block_table(seg, gt))

    def add(self, table: ContingencyTable) -> None:
        if len(table) == 0:
            return
        self._pending.append(table)
        self._pending_rows += len(table)
        self.peak_rows = max(self.peak_rows, self.rows)
        summed = len(self._summed) if self._summed is not None else 0
        if self._pending_rows > max(self.min_rows, summed):
            self._sum()

    def table(self) -> ContingencyTable | None:
        """All pairs counted so far, one row each; None when nothing was counted."""
        self._sum()
        return self._summed

    def _sum(self) -> None:
        if not self._pending:
            return
        parts = ([self._summed] if self._summed is not None else []) + self._pending
        self._summed = aggregate(parts)
        self._pending, self._pending_rows = [], 0
