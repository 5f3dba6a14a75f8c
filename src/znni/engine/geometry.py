"""Pure block geometry: boxes, blocks with explicit halos, and patch tilings.

Coordinates are voxel indices of the input volume (z, y, x); the output
array has the same spatial grid. A `Block` writes `write` and reads `read`,
which is `write` grown by the field-of-view halo (and, when the block is
not a multiple of the pool product, by the extra dense outputs that one
MPF pass must compute and that are cropped away).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from znni.planner.blocks import Edges, check_edges, grid_cuts
from znni.triple import Triple as Triple  # re-exported: engine code imports it from here
from znni.triple import as_triple


@dataclass(frozen=True, order=True)
class Box:
    """A half-open axis-aligned box [lo, hi) in (z, y, x); may reach outside the volume."""

    lo: Triple
    hi: Triple

    def __post_init__(self) -> None:
        if any(h < lo for lo, h in zip(self.lo, self.hi, strict=True)):
            raise ValueError(f"box lo {self.lo} exceeds hi {self.hi}")

    @property
    def shape(self) -> Triple:
        return as_triple(h - lo for lo, h in zip(self.lo, self.hi, strict=True))

    @property
    def size(self) -> int:
        z, y, x = self.shape
        return z * y * x

    def slices(self, origin: Triple = (0, 0, 0)) -> tuple[slice, slice, slice]:
        """Slices of this box in an array whose index 0 sits at `origin`."""
        z, y, x = (slice(lo - o, h - o) for lo, h, o in zip(self.lo, self.hi, origin, strict=True))
        return (z, y, x)

    def grow(self, lo: Triple, hi: Triple) -> Box:
        return Box(
            as_triple(a - d for a, d in zip(self.lo, lo, strict=True)),
            as_triple(a + d for a, d in zip(self.hi, hi, strict=True)),
        )

    def intersect(self, other: Box) -> Box | None:
        lo = as_triple(max(a, b) for a, b in zip(self.lo, other.lo, strict=True))
        hi = as_triple(min(a, b) for a, b in zip(self.hi, other.hi, strict=True))
        if any(h <= lo_ for lo_, h in zip(lo, hi, strict=True)):
            return None
        return Box(lo, hi)

    def contains(self, other: Box) -> bool:
        return all(a <= b for a, b in zip(self.lo, other.lo, strict=True)) and all(
            a >= b for a, b in zip(self.hi, other.hi, strict=True)
        )

    def key(self) -> str:
        """Stable text id, e.g. '0:16,16:32,0:20' (used by the ledger)."""
        return ",".join(f"{lo}:{h}" for lo, h in zip(self.lo, self.hi, strict=True))

    @staticmethod
    def from_shape(shape: Triple) -> Box:
        return Box((0, 0, 0), shape)


@dataclass(frozen=True)
class Halo:
    """Input voxels needed below and above an output box for a network of field of view fov."""

    lo: Triple
    hi: Triple

    @staticmethod
    def for_fov(fov: Triple) -> Halo:
        """Output voxel i reads the window starting at i - (fov-1)//2 (docs/design.md)."""
        lo = as_triple((f - 1) // 2 for f in fov)
        return Halo(lo, as_triple(f - 1 - a for f, a in zip(fov, lo, strict=True)))


@dataclass(frozen=True)
class Block:
    """One unit of work: compute `compute` densely, keep `write`, read `read` (with halo)."""

    index: int
    write: Box  # the output region this block owns (aligned to output chunks)
    compute: Box  # write grown at the high end to a multiple of the pool product
    read: Box  # compute grown by the halo: the input this block needs

    @property
    def key(self) -> str:
        return self.write.key()


def make_block(index: int, write: Box, halo: Halo, pool: Triple) -> Block:
    """A block for `write`; compute size rounded up to a multiple of `pool` per axis."""
    extra = as_triple(-s % p for s, p in zip(write.shape, pool, strict=True))
    compute = write.grow((0, 0, 0), extra)
    return Block(index, write, compute, compute.grow(halo.lo, halo.hi))


def split_blocks(
    region: Box, block_shape: Triple, chunks: Triple, halo: Halo, pool: Triple,
    edges: Edges | None = None,
) -> list[Block]:
    """Cut `region` into blocks on the output chunk grid (origin 0) so no two share a chunk.

    `block_shape` is rounded up to whole chunks; blocks at the region's faces
    are clipped to it. `edges` (the planned layout, planner.blocks: per axis the cuts from
    the region's start to its end, inner ones on the chunk grid) replace that grid, so the
    engine cuts exactly the blocks the plan priced (a face remainder merged into its
    neighbour).
    """
    if edges is None:
        step = as_triple(-(-b // c) * c for b, c in zip(block_shape, chunks, strict=True))
        ez, ey, ex = (tuple(grid_cuts(lo, hi, s))
                      for lo, hi, s in zip(region.lo, region.hi, step, strict=True))
        edges = (ez, ey, ex)
    assert edges is not None
    check_edges(edges, region.lo, region.hi, chunks)
    axes = [list(itertools.pairwise(e)) for e in edges]
    blocks = []
    for i, (rz, ry, rx) in enumerate(itertools.product(*axes)):
        write = Box((rz[0], ry[0], rx[0]), (rz[1], ry[1], rx[1]))
        blocks.append(make_block(i, write, halo, pool))
    return blocks


def grid_spans(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """[lo, hi) cut on the grid of `step` from voxel 0: a short first and last span where
    lo or hi is off the grid (how split_blocks cuts each axis without planned edges)."""
    return list(itertools.pairwise(grid_cuts(lo, hi, step)))


def patch_starts(extent: int, patch: int) -> list[int]:
    """Starts of patches of size `patch` covering [0, extent); the last one is shifted back.

    Needs patch <= extent; overlapping outputs are identical so overlap is harmless.
    """
    if patch > extent:
        raise ValueError(f"patch output {patch} is larger than the block extent {extent}")
    starts = list(range(0, extent - patch + 1, patch))
    if starts[-1] + patch < extent:
        starts.append(extent - patch)
    return starts


def patch_tiling(extent: Triple, patch: Triple) -> Iterator[Box]:
    """Output boxes (relative to the block's compute box) of the patches covering it."""
    per_axis = [patch_starts(e, p) for e, p in zip(extent, patch, strict=True)]
    for z, y, x in itertools.product(*per_axis):
        yield Box((z, y, x), (z + patch[0], y + patch[1], x + patch[2]))
