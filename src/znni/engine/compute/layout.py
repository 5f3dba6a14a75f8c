"""Choosing the block size under a memory budget (the planner chooses the patch).

Block: whole output chunks, at least one patch wide where the region
allows and tiled by patches with the least recomputation, with two input
blocks and two output blocks (read-ahead and write-behind), the input chunk
cache and the patch pass inside the budget.
"""

from __future__ import annotations

import itertools
from math import prod

from znni.engine.geometry import Triple, grid_spans
from znni.model.network import FLOAT_BYTES, Network
from znni.planner.machine import available_memory_bytes

MAX_BLOCK_EXTENTS = 16  # candidate block extents per axis (choose_block_shape)
DEFAULT_BUDGET_FRACTION = 0.5  # of available RAM when no --memory-limit is given
PLAN_FRACTION = 0.75  # of the budget for the patch / window pass; the rest holds blocks
# decoded input chunks a worker keeps between blocks (`io/chunk_cache.py`): enough for the
# halos of a few rows of blocks, at most a sixteenth of the budget
INPUT_CACHE_BYTES = 256 * 2**20
INPUT_CACHE_FRACTION = 16


def memory_budget_bytes(limit_bytes: int | None, machine_memory_bytes: int | None = None) -> int:
    """A run's budget: the limit, else DEFAULT_BUDGET_FRACTION of this machine's available
    memory (or of `machine_memory_bytes`, another computer's profile)."""
    if limit_bytes is not None:
        return limit_bytes
    memory = available_memory_bytes() if machine_memory_bytes is None else machine_memory_bytes
    return int(memory * DEFAULT_BUDGET_FRACTION)


def pass_budget_bytes(limit_bytes: int | None, machine_memory_bytes: int | None = None) -> int:
    """What `segment` plans its patch or window pass within: PLAN_FRACTION of the run's
    budget (the rest holds the blocks in flight). `znni plan` and POST /v1/plan use it too,
    so that they plan what a run would."""
    return int(memory_budget_bytes(limit_bytes, machine_memory_bytes) * PLAN_FRACTION)


def region_seconds(region: Triple, voxels_per_second: float) -> float:
    """How long the region's output voxels take at a predicted rate (compute only)."""
    return region[0] * region[1] * region[2] / max(voxels_per_second, 1e-9)


def input_cache_bytes(budget_bytes: int) -> int:
    """The input chunk cache's bound under a memory budget."""
    return min(INPUT_CACHE_BYTES, budget_bytes // INPUT_CACHE_FRACTION)


def block_bytes(network: Network, block: Triple, in_dtype_bytes: int) -> int:
    """Input (raw + float32) and output bytes of one block including its halo."""
    read = [b + f - 1 for b, f in zip(block, network.fov, strict=True)]
    read_vox = read[0] * read[1] * read[2]
    out_vox = block[0] * block[1] * block[2]
    return network.in_channels * read_vox * (in_dtype_bytes + FLOAT_BYTES) + (
        2 * network.out_channels * out_vox * FLOAT_BYTES
    )


def choose_block_shape(
    network: Network, chunks: Triple, patch: Triple, region: Triple, budget_bytes: int,
    in_dtype_bytes: int, pass_peak_bytes: int, batch: int = 1, origin: Triple = (0, 0, 0),
) -> Triple:
    """Whole chunks, at least one patch wide where the region allows, that the patches
    tile with the least recomputation; of extents within 1% of that, the smallest block
    whose patches fill whole batches of `batch` (the plan's: a block batches only its own
    patches), else the smallest. Two input and two output blocks must fit beside the
    patch pass's planned peak (`pass_peak_bytes`: planner.Plan.peak_bytes) and the input
    chunk cache; where no block a patch wide fits, the smallest is shrunk a chunk at a
    time. `origin`: the region's first voxel; blocks are cut on the grid from voxel 0
    (geometry.split_blocks), so a region off that grid starts and ends with short ones."""
    spare = budget_bytes - pass_peak_bytes - input_cache_bytes(budget_bytes)
    per_axis = [_axis_extents(c, p, lo + r)
                for c, p, lo, r in zip(chunks, patch, origin, region, strict=True)]
    # output voxels the patches compute along each axis, per candidate extent
    tiled = [{e: _tiled(e, p, lo, lo + r) for e in extents}
             for extents, p, lo, r in zip(per_axis, patch, origin, region, strict=True)]
    fits = [b for b in itertools.product(*per_axis)  # a block is clipped to the region
            if 2 * block_bytes(network, _clipped(b, region), in_dtype_bytes) <= spare]
    if fits:
        def computed(b: tuple[int, ...]) -> int:  # output voxels the block's patches compute
            return prod(t[e] for t, e in zip(tiled, b, strict=True))

        def part_batch(b: tuple[int, ...]) -> bool:  # the last batch of a block is short
            return prod(-(-e // p) for e, p in zip(b, patch, strict=True)) % batch != 0

        least = min(computed(b) for b in fits)
        near = [b for b in fits if computed(b) <= 1.01 * least]
        z, y, x = min(near, key=lambda b: (part_batch(b), prod(b)))
        return (z, y, x)
    block = [e[0] for e in per_axis]
    while 2 * block_bytes(network, (block[0], block[1], block[2]), in_dtype_bytes) > spare:
        d = max(range(3), key=lambda a: block[a] // chunks[a])
        if block[d] <= chunks[d]:
            break  # one chunk per block: the smallest unit the output allows
        block[d] -= chunks[d]
    return (block[0], block[1], block[2])


def _clipped(block: tuple[int, ...], region: Triple) -> Triple:
    z, y, x = (min(b, r) for b, r in zip(block, region, strict=True))
    return (z, y, x)


def _axis_extents(chunk: int, patch: int, end: int) -> list[int]:
    """A block's candidate extents on one axis: whole chunks, from the fewest that hold a
    patch (or the region) up to the region's `end` (no cut inside it), at most
    MAX_BLOCK_EXTENTS of them."""
    top = -(-max(end, chunk) // chunk)
    first = min(-(-max(patch, chunk) // chunk), top)
    return [k * chunk for k in range(first, min(top, first + MAX_BLOCK_EXTENTS - 1) + 1)]


def _tiled(extent: int, patch: int, lo: int, hi: int) -> int:
    """Output voxels along one axis that patches compute over [lo, hi) cut into blocks on
    the grid of `extent` from voxel 0 (geometry.split_blocks): a block of length n takes
    ceil(n / patch) patches of min(patch, n) (engine.geometry.patch_tiling; a patch is
    clipped to its block)."""
    return sum(-(-(b - a) // patch) * min(patch, b - a) for a, b in grid_spans(lo, hi, extent))


def windowed_block_shape(chunks: Triple, window: Triple, region: Triple) -> Triple:
    """Whole chunks, about two windows wide per axis (within the region): windows that
    touch two blocks are blended into both (and kept by the worker for the next block), so
    blocks should be several windows wide."""
    out = []
    for c, w, r in zip(chunks, window, region, strict=True):
        want = min(max(2 * w, c), max(r, c))
        out.append(-(-want // c) * c)
    return (out[0], out[1], out[2])
