"""Block layouts: where a region is cut into blocks, and what the patches over them cost.

Pure arithmetic shared by the engine (engine.geometry.split_blocks cuts exactly these
edges, engine.compute.layout chooses them) and the job-time prediction, so the layout
planned and the blocks run cannot drift. Blocks are cut on the output chunk grid of
`step` from voxel 0; a remainder at a region face (a span shorter than `step`) may be
merged into its neighbour, so a block can be up to one remainder larger than `step`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from math import prod

from znni.triple import Triple

Edges = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def grid_cuts(lo: int, hi: int, step: int) -> list[int]:
    """[lo, hi) cut on the grid of `step` from voxel 0: a short first and last span where
    lo or hi is off the grid."""
    if step < 1 or hi <= lo:
        raise ValueError(f"cannot cut [{lo}, {hi}) on a grid of step {step}")
    return [lo, *range((lo // step + 1) * step, hi, step), hi]


def merged_cuts(cuts: Sequence[int], merge_lo: bool, merge_hi: bool) -> list[int]:
    """`cuts` with the first (merge_lo) and/or last (merge_hi) span joined to its neighbour;
    a single span stays as it is."""
    out = list(cuts)
    if merge_hi and len(out) > 2:
        del out[-2]
    if merge_lo and len(out) > 2:
        del out[1]
    return out


def spans(cuts: Sequence[int]) -> list[tuple[int, int]]:
    return list(itertools.pairwise(cuts))


def axis_patches(extent: int, patch: int, pool: int) -> tuple[int, int]:
    """(patches, patch output) along one axis of a block `extent` wide: the block computes
    up to a multiple of the pool product (engine.geometry.make_block), a patch is clipped
    to that, and ceil(computed / patch) of them cover it, the last shifted back
    (engine.geometry.patch_tiling; workers/mpf.BlockWorker.compute)."""
    computed = -(-extent // pool) * pool
    p = min(patch, computed)
    return -(-computed // p), p


def axis_cost(cuts: Sequence[int], patch: int, pool: int, fov: int) -> int:
    """Input voxels along one axis that the patches of every span read: a patch costs
    about its input volume, so a span 8 outputs thin with a 163-voxel field of view still
    costs (8 + 162) / (56 + 162) = 0.78 of a 56-output patch (issue 39 measured 0.80: 300 s
    for 16 such patches against 23.4 s each for whole ones). The cost of a layout is the
    product of its axes' costs, since blocks are the product of the axes' spans."""
    total = 0
    for a, b in spans(cuts):
        n, p = axis_patches(b - a, patch, pool)
        total += n * (p + fov - 1)
    return total


def axis_options(
    lo: int, hi: int, step: int, patch: int, pool: int, fov: int
) -> list[tuple[int, int, tuple[int, ...]]]:
    """(cost, widest span, cuts) of each way to treat one axis's face remainders (kept,
    or merged into their neighbour), cheapest first, none both costlier and wider than
    another."""
    base = grid_cuts(lo, hi, step)
    short_lo, short_hi = base[1] - base[0] < step, base[-1] - base[-2] < step
    found = {}
    for m_lo, m_hi in itertools.product((False, True), repeat=2):
        if (m_lo and not short_lo) or (m_hi and not short_hi):
            continue  # only a remainder merges: a block grows by at most one
        cuts = tuple(merged_cuts(base, m_lo, m_hi))
        widest = max(b - a for a, b in spans(cuts))
        found[cuts] = (axis_cost(cuts, patch, pool, fov), widest, cuts)
    ordered = sorted(found.values())
    kept: list[tuple[int, int, tuple[int, ...]]] = []
    for option in ordered:
        if all(option[1] < k[1] for k in kept):
            kept.append(option)
    return kept


def edges_blocks(edges: Edges) -> list[tuple[Triple, Triple]]:
    """(lo, hi) of every block of a layout, z slowest (as split_blocks orders them)."""
    out = []
    for (z0, z1), (y0, y1), (x0, x1) in itertools.product(*(spans(e) for e in edges)):
        out.append(((z0, y0, x0), (z1, y1, x1)))
    return out


def check_edges(edges: Edges, lo: Triple, hi: Triple, chunks: Triple) -> None:
    """ValueError unless `edges` cut [lo, hi) per axis with every inner cut on the chunk
    grid (blocks write whole chunks, so no two share one)."""
    for axis, (cuts, a, b, c) in enumerate(zip(edges, lo, hi, chunks, strict=True)):
        inner = cuts[1:-1]
        if (len(cuts) < 2 or cuts[0] != a or cuts[-1] != b or list(cuts) != sorted(set(cuts))
                or any(v % c for v in inner)):
            raise ValueError(f"block edges {list(cuts)} on axis {axis} do not cut [{a}, {b}) "
                             f"on the chunk grid of {c}")


def layout_patches(edges: Edges, patch: Triple, pool: Triple) -> list[tuple[int, Triple]]:
    """(patches, patch output) of every block of a layout, in block order."""
    out = []
    for blo, bhi in edges_blocks(edges):
        per = [axis_patches(h - lo_, p, q)
               for lo_, h, p, q in zip(blo, bhi, patch, pool, strict=True)]
        count = per[0][0] * per[1][0] * per[2][0]
        out.append((count, (per[0][1], per[1][1], per[2][1])))
    return out


def layout_patch_seconds(
    edges: Edges, patch: Triple, pool: Triple, fov: Triple, batch: int, patch_s: float
) -> float:
    """Predicted seconds of every block's patches: a block runs its own patches in batches
    of `batch` (the last one short but timed whole, as planner.search counts them), each
    batch `patch_s` (the plan's) scaled by the clipped patch's input volume over the whole
    patch's (axis_cost's model)."""
    full = prod(p + f - 1 for p, f in zip(patch, fov, strict=True))
    total_s = 0.0
    for count, clipped in layout_patches(edges, patch, pool):
        scale = prod(c + f - 1 for c, f in zip(clipped, fov, strict=True)) / full
        total_s += -(-count // batch) * patch_s * scale
    return total_s
