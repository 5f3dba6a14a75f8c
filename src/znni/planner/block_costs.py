"""Every block's predicted seconds and bytes, for the cluster model (planner/cluster.py).

A block's figures depend only on its span lengths along each axis (its patches, their
clipped shapes, its read box with the halo, its write box), so the blocks of a layout fall
into a few classes (interior blocks and the face remainders): a petascale layout of 10^8
blocks is a handful of classes, each priced once with the same arithmetic as
jobtime.job_seconds (patches in whole batches scaled by the clipped input volume; reads and
writes at the local zarr rates). `order` lists each block's class in the engine's order
(z slowest, edges_blocks), built only where a scheduler simulation will walk it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import prod
from typing import Any

from znni.model.network import Network
from znni.planner.blocks import Edges, axis_patches, spans
from znni.planner.jobtime import READ_BYTES_PER_S, WRITE_VALUES_PER_S
from znni.planner.plan import Plan

# the largest layout whose block order is listed for the scheduler simulation (about 1 s
# of heap operations in cluster.makespan_s); beyond it the makespan is Graham's bound
ORDER_MAX_BLOCKS = 500_000
OUT_BYTES = {"float32": 4, "uint8": 1, "uint16": 2}


@dataclass(frozen=True)
class BlockClass:
    """Blocks of one shape: how many, and each one's seconds and bytes on one machine."""

    count: int
    compute_s: float  # the block's patches (or windows) on the whole machine
    read_s: float  # its input read and decoded at the local zarr rate
    write_s: float  # its output encoded and written at the local zarr rate
    read_bytes: int  # input bytes it reads (halo included), as stored, uncompressed
    write_bytes: int  # output bytes it stores, uncompressed

    @property
    def seconds(self) -> float:
        """A Dask worker's time for the block: read, compute and write one after another
        (engine/sweep/dask.run_block_task)."""
        return self.compute_s + self.read_s + self.write_s


@dataclass(frozen=True)
class BlockCosts:
    """A layout's block classes; `order`: each block's class index in run order, or None
    where the layout has over ORDER_MAX_BLOCKS blocks."""

    classes: tuple[BlockClass, ...]
    order: tuple[int, ...] | None
    # the whole region's input with its halo, once (a worker whose chunk cache holds it
    # reads each input chunk once: planner/cluster.store_read_bytes); 0: unknown
    region_read_bytes: int = 0

    @property
    def blocks(self) -> int:
        return sum(c.count for c in self.classes)

    def total(self, field: str) -> float:
        return float(sum(c.count * getattr(c, field) for c in self.classes))

    def longest_s(self) -> float:
        return max((c.seconds for c in self.classes if c.count), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"blocks": self.blocks,
                "classes": [vars(c) | {"seconds": c.seconds} for c in self.classes]}


def block_costs(
    plan: Plan, network: Network, edges: Edges, *, in_bytes: int, out_dtype: str,
    skipped: frozenset[int] = frozenset(), out_channels: int | None = None,
) -> BlockCosts:
    """The classes of a sequential network's layout over `edges` (module docstring).
    `skipped`: block indices (edges_blocks order) wholly outside the mask, which cost only
    their write of the fill value (as jobtime.job_seconds counts them)."""
    patch, pool, fov = plan.output_size, network.pool_product, network.fov
    batch = max(1, int(plan.batch))
    full_in = prod(p + f - 1 for p, f in zip(patch, fov, strict=True))
    stored = out_channels or network.out_channels
    write_rate = WRITE_VALUES_PER_S.get(out_dtype, 39e6)

    def priced(lengths: tuple[int, int, int], skip: bool) -> BlockClass:
        per = [axis_patches(n, p, q) for n, p, q in zip(lengths, patch, pool, strict=True)]
        count = 0 if skip else prod(c for c, _ in per)
        size_in = [c + f - 1 for (_, c), f in zip(per, fov, strict=True)]
        compute = -(-count // batch) * plan.predicted_patch_s * prod(size_in) / full_in
        write = prod(lengths)
        read = prod(n + f - 1 for n, f in zip(lengths, fov, strict=True)) * network.in_channels
        read_bytes = read * in_bytes if count else 0
        return BlockClass(1, compute, read_bytes / READ_BYTES_PER_S, write * stored / write_rate,
                          read_bytes, write * stored * OUT_BYTES.get(out_dtype, 4))

    costs = _classes(edges, skipped, priced)
    region = [e[-1] - e[0] for e in edges]
    whole = prod(r + f - 1 for r, f in zip(region, fov, strict=True)) * network.in_channels
    return replace(costs, region_read_bytes=whole * in_bytes)


def _classes(edges: Edges, skipped: frozenset[int], priced: Any) -> BlockCosts:
    """Group the blocks of `edges` by (span lengths, skipped) and price each group once."""
    lengths = [[b - a for a, b in spans(e)] for e in edges]
    n = prod(len(axis) for axis in lengths)
    counts: dict[tuple[tuple[int, ...], bool], int] = {}
    for key in itertools.product(*(sorted(set(axis)) for axis in lengths)):
        per_axis = [axis.count(v) for axis, v in zip(lengths, key, strict=True)]
        counts[(key, False)] = prod(per_axis)
    for i in skipped:
        key = _lengths_at(lengths, i)
        counts[(key, False)] -= 1
        counts[(key, True)] = counts.get((key, True), 0) + 1
    keys = [k for k, c in counts.items() if c]
    index = {k: j for j, k in enumerate(keys)}
    classes = tuple(_with_count(priced(k[0], k[1]), counts[k]) for k in keys)
    order = None
    if n <= ORDER_MAX_BLOCKS:
        order = tuple(index[(key, i in skipped)]
                      for i, key in enumerate(itertools.product(*lengths)))
    return BlockCosts(classes, order)


def _lengths_at(lengths: Sequence[Sequence[int]], i: int) -> tuple[int, ...]:
    """The span lengths of block `i` (z slowest)."""
    ny, nx = len(lengths[1]), len(lengths[2])
    z, rest = divmod(i, ny * nx)
    y, x = divmod(rest, nx)
    return (lengths[0][z], lengths[1][y], lengths[2][x])


def _with_count(c: BlockClass, count: int) -> BlockClass:
    return BlockClass(count, c.compute_s, c.read_s, c.write_s, c.read_bytes, c.write_bytes)


def uniform_costs(blocks: int, compute_s: float, read_s: float, write_s: float,
                  read_bytes: int, write_bytes: int, region_read_bytes: int = 0) -> BlockCosts:
    """`blocks` alike (a graph model's run, as jobtime.graph_job_seconds prices it)."""
    one = BlockClass(blocks, compute_s, read_s, write_s, read_bytes, write_bytes)
    return BlockCosts((one,), (0,) * blocks if blocks <= ORDER_MAX_BLOCKS else None,
                      region_read_bytes)
