"""`evaluate`: a segmentation scored against its ground truth, block by block.

Both volumes are read one block at a time (the next block's read overlapping this one's
counting) and only the contingency table of (segmentation, ground truth) label pairs is
kept (`contingency.py`), so volumes far larger than memory are scored; the scores
(`scores.py`) are those of the whole region, whatever the blocks.

Ignored voxels: those whose ground truth is background (0), and with `border` N > 0 those
within N voxels of a different ground-truth label in their xy section (`border_band`), as
CREMI's border mask (which is computed per z section, in xy).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.evaluate.contingency import TableBuilder
from znni.engine.evaluate.scores import score, sizes_by_label
from znni.engine.geometry import Box, Triple, grid_spans
from znni.engine.io.formats import InputVolume
from znni.engine.io.volume import open_input
from znni.engine.location import Location
from znni.engine.units import resolve_roi

Roi = tuple[tuple[int | None, int | None], ...]
DEFAULT_BLOCK: Triple = (128, 128, 128)  # two uint64 blocks: 32 MiB, plus the counting's
# ground-truth chunks kept between blocks when a border band reads a halo around each block
HALO_CACHE_BLOCKS = 4


@dataclass(frozen=True)
class EvaluationReport:
    """The scores of one evaluation (`scores.py` for their definitions; VOI in bits) and
    what was counted: `voxels` scored (ground truth not 0 and outside the border band) of
    `roi_voxels` in the region, the distinct objects and (object, segment) pairs among
    them."""

    segmentation: str
    ground_truth: str
    roi: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    border: int
    voi_split: float
    voi_merge: float
    arand: float
    precision: float
    recall: float
    voxels: int
    roi_voxels: int
    gt_objects: int
    segments: int
    pairs: int
    blocks: int
    elapsed_s: float

    @property
    def voi(self) -> float:
        return self.voi_split + self.voi_merge

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields and `voi`, nan (a Rand ratio of no pairs) as None."""
        out = {k: (None if isinstance(v, float) and math.isnan(v) else v)
               for k, v in asdict(self).items()}
        out["roi"] = [list(r) for r in self.roi]
        out["voi"] = self.voi
        return out


def evaluate(seg: Location, gt: Location, *, roi: Roi | None = None, border: int = 0,
             block: Triple | None = None, ctx: StoreContext) -> EvaluationReport:
    """Score the segmentation at `seg` against the ground truth at `gt` over `roi` (as
    `znni segment --roi`; None: everything), ignoring ground-truth background and, with
    `border` > 0, the band `border_band` marks; read in blocks of `block` (default
    `DEFAULT_BLOCK`) on the grid from voxel 0. ValueError (one sentence) for volumes that
    are not single-channel integer labels of one shape, or no foreground to score."""
    start = time.perf_counter()
    shape = check_block(block or DEFAULT_BLOCK)
    width = check_border(border)
    seg_volume = open_labels(seg, "segmentation", ctx=ctx)
    cache = HALO_CACHE_BLOCKS * int(np.prod(shape)) * 8 if width else 0
    gt_volume = open_labels(gt, "ground truth", cache, ctx=ctx)
    if seg_volume.shape != gt_volume.shape:
        raise ValueError(
            f"segmentation {seg} has shape {seg_volume.shape} (z, y, x) but ground truth {gt} "
            f"has shape {gt_volume.shape}; they must cover the same voxels")
    bounds = resolve_roi(roi, seg_volume.shape)
    region = Box((bounds[0][0], bounds[1][0], bounds[2][0]),
                 (bounds[0][1], bounds[1][1], bounds[2][1]))
    boxes = block_boxes(region, shape)
    builder = TableBuilder()
    for seg_block, gt_block in prefetched(
            boxes, lambda box: read_pair(seg_volume, gt_volume, box, region, width)):
        builder.add_block(seg_block, gt_block)
    table = builder.table()
    if table is None:
        raise ValueError(f"ground truth {gt} has no foreground voxels (label other than 0)"
                         + (f" outside the --border {width} band" if width else "")
                         + f" in the region {region.key()}; there is nothing to score")
    scores = score(table)
    counts = table.counts.astype(np.float64)
    return EvaluationReport(
        segmentation=str(seg), ground_truth=str(gt), roi=bounds, border=width,
        voi_split=scores.voi_split, voi_merge=scores.voi_merge, arand=scores.arand,
        precision=scores.precision, recall=scores.recall, voxels=table.voxels,
        roi_voxels=region.size, gt_objects=sizes_by_label(table.gt, counts)[1].size,
        segments=sizes_by_label(table.seg, counts)[1].size, pairs=len(table),
        blocks=len(boxes), elapsed_s=time.perf_counter() - start,
    )


def check_block(block: Triple) -> Triple:
    if len(block) != 3 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                              for b in block):
        raise ValueError(f"block {block} must be 3 positive integers z,y,x")
    return (block[0], block[1], block[2])


def check_border(border: int) -> int:
    if isinstance(border, bool) or not isinstance(border, int):
        raise TypeError(f"border {border!r} must be a whole number of voxels")
    if border < 0:
        raise ValueError(f"border {border} must be 0 (no band) or a positive number of voxels")
    return border


def open_labels(loc: Location, what: str, cache_bytes: int = 0, *,
                ctx: StoreContext) -> InputVolume:
    """A label volume opened for reading: (z, y, x) or (1, z, y, x), integer dtype; the
    engine's input checks, their sentences naming `what`."""
    try:
        volume = open_input(loc, 1, cache_bytes, ctx=ctx)
    except ValueError as e:  # the readers name what they read "input", for a network
        text = str(e)
        if text.startswith("input "):
            text = what + text[len("input"):]
        raise ValueError(text.replace("but the network expects 1",
                                      "but a label volume has 1")) from None
    if volume.dtype.kind not in "iu":
        raise ValueError(f"{what} {loc} has dtype {volume.dtype}; labels must be integers "
                         "(an unsigned or signed integer type)")
    return volume


def block_boxes(region: Box, block: Triple) -> list[Box]:
    """`region` cut on the grid of `block` from voxel 0 (blocks at its faces clipped)."""
    spans = [grid_spans(lo, hi, b) for lo, hi, b in zip(region.lo, region.hi, block,
                                                        strict=True)]
    return [Box((z[0], y[0], x[0]), (z[1], y[1], x[1]))
            for z, y, x in itertools.product(*spans)]


def read_pair(seg: InputVolume, gt: InputVolume, box: Box, region: Box,
              border: int) -> tuple[np.ndarray, np.ndarray]:
    """The (z, y, x) segmentation and ground truth of `box`, the ground truth 0 in the
    border band; the band is found on the ground truth grown by `border` in y and x,
    within `region` (at its faces, as if the region were the whole volume)."""
    seg_values = seg.read(box)[0]
    if border == 0:
        return seg_values, gt.read(box)[0]
    grown = box.grow((0, border, border), (0, border, border)).intersect(region) or box
    values = gt.read(grown)[0]
    inner = box.slices(grown.lo)
    band = border_band(values, border)[inner]
    return seg_values, np.where(band, values.dtype.type(0), values[inner])


def border_band(labels: np.ndarray, width: int) -> np.ndarray:
    """The voxels within `width` voxels of a voxel of another label in their xy section
    (z, y, x bool): with width 1 those with a 4-neighbour in xy of another label (both
    sides of a border), with width N those within Euclidean xy distance N - 1 of one, as
    CREMI's create_border_mask_2d(section, max_dist=N - 1); the array's faces are no
    border. All False for width 0."""
    if width <= 0:
        return np.zeros(labels.shape, bool)
    p = np.pad(labels, ((0, 0), (1, 1), (1, 1)), mode="edge")
    c = p[:, 1:-1, 1:-1]
    edge = ((c != p[:, :-2, 1:-1]) | (c != p[:, 2:, 1:-1])
            | (c != p[:, 1:-1, :-2]) | (c != p[:, 1:-1, 2:]))
    return dilate_disk(edge, width - 1)


def dilate_disk(mask: np.ndarray, radius: int) -> np.ndarray:
    """`mask` (z, y, x) dilated in each xy section by the disk dy^2 + dx^2 <= radius^2: per
    row offset dy, a run of x half-width isqrt(radius^2 - dy^2) from prefix sums, so the
    cost grows with the radius, not its square."""
    if radius == 0:
        return mask
    _, ny, nx = mask.shape
    csum = np.zeros((*mask.shape[:2], nx + 1), np.int32)
    np.cumsum(mask, axis=2, out=csum[..., 1:])
    x = np.arange(nx)
    runs: dict[int, np.ndarray] = {}
    out = np.zeros_like(mask)
    for dy in range(-radius, radius + 1):
        if abs(dy) >= ny:
            continue
        w = math.isqrt(radius * radius - dy * dy)
        if w not in runs:
            lo, hi = np.clip(x - w, 0, nx), np.clip(x + w + 1, 0, nx)
            runs[w] = (csum[..., hi] - csum[..., lo]) > 0
        if dy >= 0:
            out[:, :ny - dy] |= runs[w][:, dy:]
        else:
            out[:, -dy:] |= runs[w][:, :ny + dy]
    return out


def prefetched(boxes: list[Box], read: Callable[[Box], tuple[np.ndarray, np.ndarray]]
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`read(box)` of each box in order, the next one read (in a thread) while the caller
    counts this one."""
    if not boxes:
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="znni-evaluate") as pool:
        pending: Future[tuple[np.ndarray, np.ndarray]] = pool.submit(read, boxes[0])
        for nxt in [*boxes[1:], None]:
            values = pending.result()
            if nxt is not None:
                pending = pool.submit(read, nxt)
            yield values
