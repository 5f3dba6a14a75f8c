"""Choosing the block size under a memory budget (the planner chooses the patch).

Block: whole output chunks, at least one patch wide where the region
allows and tiled by patches with the least recomputation, with two input
blocks and two output blocks (read-ahead and write-behind), the input chunk
cache and the patch pass inside the budget.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod
from typing import Any

from znni.engine.compute.tta import flipped_plan
from znni.engine.geometry import Box, Triple
from znni.model.network import FLOAT_BYTES, Network
from znni.planner.blocks import Edges, axis_options, grid_cuts
from znni.planner.jobtime import job_seconds, with_planning
from znni.planner.machine import available_memory_bytes
from znni.planner.plan import DeviceChoice, Plan
from znni.triple import as_triple

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


def cached_input_bytes(network: Network, edges: Edges, in_dtype_bytes: int,
                       budget_bytes: int) -> int:
    """What the input chunk cache can hold in a run over `edges`: its bound, but never
    more than the input the run reads (the region and its field of view; a 200x117x71
    uint8 volume is 2 MB against a 256 MiB bound, which every prediction of a small
    volume's peak had counted whole)."""
    if not budget_bytes:
        return 0
    read = prod(e[-1] - e[0] + f - 1 for e, f in zip(edges, network.fov, strict=True))
    return min(input_cache_bytes(budget_bytes), network.in_channels * read * in_dtype_bytes)


def block_bytes(network: Network, block: Triple, in_dtype_bytes: int) -> int:
    """Input (raw + float32) and output bytes of one block including its halo."""
    read = [b + f - 1 for b, f in zip(block, network.fov, strict=True)]
    read_vox = read[0] * read[1] * read[2]
    out_vox = block[0] * block[1] * block[2]
    return network.in_channels * read_vox * (in_dtype_bytes + FLOAT_BYTES) + (
        2 * network.out_channels * out_vox * FLOAT_BYTES
    )


@dataclass(frozen=True)
class BlockLayout:
    """The blocks a run cuts: the nominal `step` (whole chunks; the ledger records it) and
    per axis the `edges` split_blocks cuts at (planner.blocks)."""

    step: Triple
    edges: Edges

    def to_dict(self) -> dict[str, Any]:
        return {"block_shape": list(self.step), "block_edges": [list(e) for e in self.edges]}


def choose_block_shape(
    network: Network, chunks: Triple, patch: Triple, region: Triple, budget_bytes: int,
    in_dtype_bytes: int, pass_peak_bytes: int, batch: int = 1, origin: Triple = (0, 0, 0),
) -> Triple:
    """The nominal block shape of `choose_block_layout`."""
    return choose_block_layout(network, chunks, patch, region, budget_bytes, in_dtype_bytes,
                               pass_peak_bytes, batch, origin).step


def choose_block_layout(
    network: Network, chunks: Triple, patch: Triple, region: Triple, budget_bytes: int,
    in_dtype_bytes: int, pass_peak_bytes: int, batch: int = 1, origin: Triple = (0, 0, 0),
    step: Triple | None = None,
) -> BlockLayout:
    """Whole chunks, at least one patch wide where the region allows, whose patches cost
    the least (their input volume, planner.blocks.axis_cost: a remainder a few voxels thin
    still costs most of a patch, so it may merge into its neighbour); of layouts within 1%
    of that, the smallest block whose patches fill whole batches of `batch` (the plan's: a
    block batches only its own patches), else the smallest. Two input and two output
    blocks (the widest cut) must fit beside the patch pass's planned peak
    (`pass_peak_bytes`: planner.Plan.peak_bytes) and the input chunk cache; where no block
    a patch wide fits, the smallest is shrunk a chunk at a time. `origin`: the region's
    first voxel; blocks are cut on the grid from voxel 0 (geometry.split_blocks), so a
    region off that grid starts and ends with short ones. A given `step` (--block, or the
    ledger's on resume) is kept: only its remainders may merge, where they fit."""
    spare = budget_bytes - pass_peak_bytes - input_cache_bytes(budget_bytes)
    pool, fov = network.pool_product, network.fov
    bounds = [(lo, lo + r) for lo, r in zip(origin, region, strict=True)]
    per_axis = [_axis_extents(c, p, hi) for c, p, (_, hi) in zip(chunks, patch, bounds,
                                                                  strict=True)]
    if step is not None:
        per_axis = [[-(-s // c) * c] for s, c in zip(step, chunks, strict=True)]
    options = [{e: axis_options(lo, hi, e, p, q, f) for e in extents}
               for extents, (lo, hi), p, q, f in zip(per_axis, bounds, patch, pool, fov,
                                                     strict=True)]
    found = []  # (cost, step, cuts) of every layout that fits
    for cut in itertools.product(*per_axis):
        for pick in itertools.product(*(o[e] for o, e in zip(options, cut, strict=True))):
            widest = (pick[0][1], pick[1][1], pick[2][1])
            # read-ahead and write-behind hold two blocks, a lone block only itself
            held = 1 if all(len(o[2]) == 2 for o in pick) else 2
            if held * block_bytes(network, widest, in_dtype_bytes) <= spare:
                merges = sum(len(o[2]) < len(grid_cuts(lo, hi, e))
                             for o, (lo, hi), e in zip(pick, bounds, cut, strict=True))
                found.append((pick[0][0] * pick[1][0] * pick[2][0], cut,
                              (pick[0][2], pick[1][2], pick[2][2]), prod(widest), merges))
    if found:
        def part_batch(b: tuple[int, ...]) -> bool:  # the last batch of a block is short
            return prod(-(-e // p) for e, p in zip(b, patch, strict=True)) % batch != 0

        least = min(f[0] for f in found)
        near = [f for f in found if f[0] <= 1.01 * least]
        # ties: whole batches, then the smallest blocks cut, then the plain grid
        _, best, edges, _, _ = min(near, key=lambda f: (part_batch(f[1]), f[3], f[4],
                                                        prod(f[1]), f[0]))
        return BlockLayout(as_triple(best), edges)
    block = as_triple([e[0] for e in per_axis])
    if step is not None:  # as asked, even where it does not fit
        return BlockLayout(block, layout_edges(block, bounds))
    shrunk = _shrunk(network, block, chunks, spare, in_dtype_bytes, budget_bytes,
                     pass_peak_bytes)
    return BlockLayout(shrunk, layout_edges(shrunk, bounds))


def _shrunk(network: Network, block: Triple, chunks: Triple, spare: int, in_dtype_bytes: int,
            budget_bytes: int, pass_peak_bytes: int) -> Triple:
    """`block` shrunk a chunk at a time (its longest axis in chunks first) until two fit in
    `spare` bytes; ValueError where even one chunk per block does not."""
    b = list(block)
    while 2 * block_bytes(network, (b[0], b[1], b[2]), in_dtype_bytes) > spare:
        d = max(range(3), key=lambda a: b[a] // chunks[a])
        if b[d] <= chunks[d]:  # one chunk per block: the smallest unit the output allows
            raise ValueError(
                f"no block fits in the memory budget of {budget_bytes:,} bytes: two blocks of "
                f"one output chunk {tuple(chunks)} with the network's halo take "
                f"{2 * block_bytes(network, as_triple(b), in_dtype_bytes):,} bytes beside "
                f"the patch pass's {pass_peak_bytes:,} and the input cache's "
                f"{input_cache_bytes(budget_bytes):,}; raise --memory-limit or use smaller "
                "--chunks")
        b[d] -= chunks[d]
    return as_triple(b)


def with_layout(
    plan: Plan, network: Network, chunks: Triple, region: Box, budget_bytes: int,
    in_dtype_bytes: int, step: Triple | None = None, merge: bool = True,
) -> Plan:
    """`plan` with the block layout a run of it cuts over `region` (choose_block_layout;
    without `merge`, the plain grid of `step`: --block as given); `segment` and
    `znni plan --input` both call this, and the engine cuts the plan's edges."""
    if not merge and step is not None:
        step = as_triple(-(-s // c) * c for s, c in zip(step, chunks, strict=True))
        bounds = [(lo, hi) for lo, hi in zip(region.lo, region.hi, strict=True)]
        return replace(plan, block_shape=step, block_edges=layout_edges(step, bounds))
    layout = choose_block_layout(
        network, chunks, as_triple(int(v) for v in plan.output_size), region.shape,
        budget_bytes, in_dtype_bytes, plan.peak_bytes, max(1, int(plan.batch)), region.lo,
        step)
    return replace(plan, block_shape=layout.step, block_edges=layout.edges)


def with_job_time(plan: Plan, network: Network, in_dtype_bytes: int, out_dtype: str,
                  known_machine: bool = True, budget_bytes: int = 0,
                  skip: Callable[[Edges], frozenset[int]] | None = None,
                  out_channels: int | None = None) -> Plan:
    """`plan` (with its layout, with_layout) with the whole run's predicted seconds and
    peak (the input chunk cache under `budget_bytes` counted). `skip(edges)`: the blocks
    wholly outside the mask (`output/form.OutputForm.outside`), which are not computed.
    `out_dtype`, `out_channels`: the stored output's (labels change them). The planner's
    search time a previous prediction measured (plan_with_layout) is kept."""
    assert plan.block_edges is not None
    edges = plan.block_edges
    job = job_seconds(plan, network, edges, in_bytes=in_dtype_bytes,
                      out_dtype=out_dtype, known_machine=known_machine,
                      cache_bytes=cached_input_bytes(network, edges, in_dtype_bytes,
                                                     budget_bytes),
                      skipped=skip(edges) if skip is not None else frozenset(),
                      out_channels=out_channels,
                      planning_s=float((plan.job_seconds or {}).get("planning_s", 0.0)))
    return replace(plan, job_seconds=job.to_dict())


# pass budgets tried (fractions of the run's budget): a smaller patch pass leaves room for
# blocks that hold the region's remainders, which can beat a faster patch cut into thin
# blocks (issue 39)
PASS_FRACTIONS = (PLAN_FRACTION, 0.6, 0.45, 0.3)


def plan_with_layout(
    network: Network, device: DeviceChoice, chunks: Triple, region: Box, budget_bytes: int,
    in_dtype_bytes: int, out_dtype: str, step: Triple | None = None, merge: bool = True,
    plan_for: Callable[[int], Plan] | None = None, known_machine: bool = True,
    flips: int = 1, skip: Callable[[Edges], frozenset[int]] | None = None,
    out_channels: int | None = None,
) -> Plan:
    """Patch, batch and blocks chosen together: the planner's best plan within each of
    PASS_FRACTIONS of the budget, laid out over the region (with_layout; `step` and
    `merge` as there), and of those the least predicted whole run (with_job_time); ties
    go to the larger pass budget. `plan_for(pass_bytes)`: the planner (default this
    machine's, execution.plan_job; `znni plan --machine` passes its profile's). `flips`:
    passes per patch (test-time flips, compute/tta.flipped_plan), counted in every time.
    `skip`: the blocks of a layout that the mask leaves uncomputed (with_job_time)."""
    from znni.engine.compute.execution import plan_job

    if plan_for is None:
        def plan_for(pass_bytes: int) -> Plan:
            return plan_job(network, device, pass_bytes, region.shape)

    best: Plan | None = None
    tried, refusal, started = set(), None, time.perf_counter()
    for fraction in PASS_FRACTIONS:
        if best is not None and best.peak_bytes <= budget_bytes * fraction:
            break  # the best pass fits the smaller budgets too: they would choose it again
        try:
            plan = flipped_plan(plan_for(int(budget_bytes * fraction)), flips, network)
        except ValueError:
            if best is None and fraction == PLAN_FRACTION:
                raise
            break  # smaller budgets fit nothing either
        key = (plan.output_size, plan.batch, plan.algorithm)
        if key in tried:
            continue
        tried.add(key)
        try:
            blocks = with_layout(plan, network, chunks, region, budget_bytes, in_dtype_bytes,
                                 step, merge)
        except ValueError as e:  # a smaller pass may leave room for blocks
            refusal = e
            continue
        laid = with_job_time(blocks, network, in_dtype_bytes, out_dtype, known_machine,
                             budget_bytes=budget_bytes, skip=skip, out_channels=out_channels)
        assert laid.job_seconds is not None
        if best is None or laid.job_seconds["total_s"] < 0.98 * _total(best):
            best = laid
    if best is None:
        raise refusal or ValueError(f"no plan fits in {budget_bytes:,} bytes")
    assert best.job_seconds is not None
    return replace(best, job_seconds=with_planning(best.job_seconds,
                                                   time.perf_counter() - started))


def _total(plan: Plan) -> float:
    return float((plan.job_seconds or {}).get("total_s", float("inf")))


def layout_edges(step: Triple, bounds: list[tuple[int, int]]) -> Edges:
    """The plain grid of `step` over the region (no remainder merged)."""
    z, y, x = (tuple(grid_cuts(lo, hi, s)) for (lo, hi), s in zip(bounds, step, strict=True))
    return (z, y, x)


def _axis_extents(chunk: int, patch: int, end: int) -> list[int]:
    """A block's candidate extents on one axis: whole chunks, from the fewest that hold a
    patch (or the region) up to the region's `end` (no cut inside it), at most
    MAX_BLOCK_EXTENTS of them."""
    top = -(-max(end, chunk) // chunk)
    first = min(-(-max(patch, chunk) // chunk), top)
    return [k * chunk for k in range(first, min(top, first + MAX_BLOCK_EXTENTS - 1) + 1)]


def windowed_block_shape(chunks: Triple, window: Triple, region: Triple) -> Triple:
    """Whole chunks, about two windows wide per axis (within the region): windows that
    touch two blocks are blended into both (and kept by the worker for the next block), so
    blocks should be several windows wide."""
    out = []
    for c, w, r in zip(chunks, window, region, strict=True):
        want = min(max(2 * w, c), max(r, c))
        out.append(-(-want // c) * c)
    return (out[0], out[1], out[2])
