"""The agglomeration's three block stages on the engine's sweep (`engine/sweep/stage.py`):
fragments (a watershed per block), graph (each block's edges into the SQLite file) and
relabel (fragments to segment ids, into an output). Each is a picklable value; each process
opens what it needs in `make_worker`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from znni.engine.agglomerate.fragments import (
    Neighbourhood,
    axis_slices,
    edge_validity,
    label_block,
    pointers,
)
from znni.engine.agglomerate.graph import block_graph, concatenate, renumbered
from znni.engine.agglomerate.merge import premerge
from znni.engine.agglomerate.store import FACES, INNER, GraphStore, pack
from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Box, Triple
from znni.engine.io.volume import open_input, write_block
from znni.engine.location import Location
from znni.primitives.cpu.heap import SEQUENTIAL_MMAP_THRESHOLD_BYTES, keep_freed_memory
from znni.triple import as_triple

READ_CACHE_BYTES = 512 * 2**20  # decoded chunks kept for the neighbours' halos
# blocks computing at once in a local sweep: the computes are NumPy and connected-components-3d
# calls that release the GIL most of the time (2 threads: 1.57x one on 2 cores)
COMPUTE_THREADS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class AffinitySource:
    """Where the affinities are and how they read: 3 channels (nearest-neighbour affinities)
    or 1 (a boundary map, 1 = boundary); float in [0, 1] or uint8 (0..255)."""

    location: Location
    channels: int
    scale: float  # stored value / scale = affinity (255 for uint8)
    shape: Triple  # the whole volume's
    region: Box  # the voxels agglomerated; its faces end the graph
    mask: Location | None
    ctx: StoreContext
    low: float
    high: float


class _Reader:
    """One process's open affinities (and mask)."""

    def __init__(self, source: AffinitySource) -> None:
        self.source = source
        self.volume = open_input(source.location, source.channels, READ_CACHE_BYTES,
                                 ctx=source.ctx)
        self.mask = (open_input(source.mask, 1, READ_CACHE_BYTES, ctx=source.ctx)
                     if source.mask is not None else None)

    def neighbourhood(self, box: Box, below: int = 1) -> Neighbourhood:
        """`box`'s voxels with every edge they have: the affinities over `box` grown by one
        voxel above and `below` voxels below (within the region). A voxel's edges towards
        -c are stored at the voxel itself: `below` = 0 reads fewer chunks, for a stage that
        needs no pointer of the voxels below its box (a mask and a boundary map need the
        voxels below for the edges at the box's first plane: `below` is then 1)."""
        region = self.source.region
        if self.mask is not None or self.source.channels == 1:
            below = 1
        grown = _grow(box, below, 1, region)
        raw = self.volume.read(grown)  # (C, Z, Y, X)
        affs = to_affinities(raw, self.source.scale)
        mask = self.mask.read(grown)[0] if self.mask is not None else None
        return Neighbourhood(box, grown, affs, edge_validity(grown, region, mask))


def to_affinities(raw: np.ndarray, scale: float) -> np.ndarray:
    """(3, Z, Y, X) float32 affinities from stored values: divided by `scale`; one channel
    is a boundary map b, whose edge (v, v - e_c) gets 1 - max(b(v), b(v - e_c))."""
    values = raw.astype(np.float32) / np.float32(scale) if scale != 1 else \
        raw.astype(np.float32, copy=False)
    if values.shape[0] == 3:
        return values
    boundary = values[0]
    affs = np.zeros((3, *boundary.shape), dtype=np.float32)  # (3, Z, Y, X)
    for c in range(3):
        here, below = axis_slices(c, 1, None), axis_slices(c, 0, -1)
        affs[c][here] = 1.0 - np.maximum(boundary[here], boundary[below])
    return affs


def _grow(box: Box, lo: int, hi: int, region: Box) -> Box:
    """`box` grown by `lo` voxels below and `hi` above on every axis, within `region`."""
    return Box(as_triple(max(r, b - lo) for r, b in zip(region.lo, box.lo, strict=True)),
               as_triple(min(r, b + hi) for r, b in zip(region.hi, box.hi, strict=True)))


@dataclass(frozen=True)
class FragmentStage:
    """Each block's watershed basins, named canonically, into the fragments array, and the
    block's inner edges into the job's SQLite file."""

    source: AffinitySource
    fragments: Location  # (1, z, y, x) uint64, chunks = blocks
    graph: str  # the SQLite file
    premerge: float | None = None  # the job's least threshold: merge inside blocks below it

    def make_worker(self) -> FragmentWork:
        return FragmentWork(self)


class FragmentWork:
    threads = COMPUTE_THREADS

    def __init__(self, spec: FragmentStage) -> None:
        keep_freed_memory(SEQUENTIAL_MMAP_THRESHOLD_BYTES)  # a block's arrays reuse pages
        self.spec = spec
        self.reader = _Reader(spec.source)
        self.store = GraphStore(spec.graph)
        self.out: Any = None

    def read(self, block: Block) -> Neighbourhood:
        return self.reader.neighbourhood(block.write, below=0)  # a block's own pointers

    def compute(self, block: Block, raw: Neighbourhood) -> tuple[np.ndarray, bytes]:
        source = self.spec.source
        links = pointers(raw, source.low, source.high)
        fragments = label_block(links, block.write, source.shape)
        inner = block_graph(block.write, raw, fragments, links)
        if self.spec.premerge is not None:  # regions merged within the block, as fragments
            names, regions, inner = premerge(inner, _open(fragments, block.write,
                                                          source.region), self.spec.premerge)
            fragments = relabel(fragments, names, regions)
        return fragments[None], pack(inner)  # (1, z, y, x)

    def write(self, block: Block, values: tuple[np.ndarray, bytes]) -> None:
        self.store.put_block(INNER + block.key, values[1])  # before the fragments: a block
        self.out = write_block(self.out, self.spec.fragments, block.write, values[0],
                               ctx=self.spec.source.ctx)  # is done once both are there


@dataclass(frozen=True)
class FaceStage:
    """Each block's edges across its lower faces (to the blocks before it on each axis)
    and the watershed links there, into the job's SQLite file."""

    source: AffinitySource
    fragments: Location
    graph: str  # the SQLite file

    def make_worker(self) -> FaceWork:
        return FaceWork(self)


class FaceWork:
    threads = COMPUTE_THREADS

    def __init__(self, spec: FaceStage) -> None:
        keep_freed_memory(SEQUENTIAL_MMAP_THRESHOLD_BYTES)
        self.spec = spec
        self.reader = _Reader(spec.source)
        self.fragments = open_input(spec.fragments, 1, READ_CACHE_BYTES, ctx=spec.source.ctx)
        self.store = GraphStore(spec.graph)

    def read(self, block: Block) -> list[tuple[int, Box, Neighbourhood, np.ndarray]]:
        """Per lower face inside the region: (axis, the face's plane of the block, the two
        planes either side with their edges, their fragments)."""
        region, box = self.spec.source.region, block.write
        faces = []
        for c in range(3):
            if box.lo[c] <= region.lo[c]:
                continue
            plane = Box(box.lo, _with(box.hi, c, box.lo[c] + 1))
            both = Box(_with(box.lo, c, box.lo[c] - 1), plane.hi)
            faces.append((c, plane, self.reader.neighbourhood(both),
                          self.fragments.read(both)[0]))
        return faces

    def compute(self, block: Block, raw: list[tuple[int, Box, Neighbourhood, np.ndarray]]
                ) -> bytes:
        source = self.spec.source
        parts = [block_graph(plane, hood, fragments, axes=(c,), low=source.low,
                             high=source.high) for c, plane, hood, fragments in raw]
        return pack(concatenate(parts))

    def write(self, block: Block, values: bytes) -> None:
        self.store.put_block(FACES + block.key, values)


def _open(fragments: np.ndarray, box: Box, region: Box) -> np.ndarray:
    """The fragments on the block's faces that another block shares."""
    faces = []
    for c in range(3):
        if box.lo[c] > region.lo[c]:
            faces.append(fragments[axis_slices(c, 0, 1)].ravel())
        if box.hi[c] < region.hi[c]:
            faces.append(fragments[axis_slices(c, -1, None)].ravel())
    return np.unique(np.concatenate(faces)) if faces else np.zeros(0, np.uint64)


def _with(t: Triple, c: int, value: int) -> Triple:
    out = list(t)
    out[c] = value
    return as_triple(out)


@dataclass(frozen=True)
class RelabelStage:
    """Each block's fragments renamed by a threshold's segment table, into its output."""

    fragments: Location
    graph: str
    threshold: float
    fingerprint: str
    output: Location  # the output's level-0 array
    ctx: StoreContext

    def make_worker(self) -> RelabelWork:
        return RelabelWork(self)


class RelabelWork:
    threads = COMPUTE_THREADS

    def __init__(self, spec: RelabelStage) -> None:
        keep_freed_memory(SEQUENTIAL_MMAP_THRESHOLD_BYTES)
        self.spec = spec
        self.fragments = open_input(spec.fragments, 1, ctx=spec.ctx)
        table = GraphStore(spec.graph).segments(spec.threshold, spec.fingerprint)
        if table is None:
            raise ValueError(f"no segment table for threshold {spec.threshold} in {spec.graph}")
        self.table = table
        self.out: Any = None

    def read(self, block: Block) -> np.ndarray:
        return self.fragments.read(block.write)[0]

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        return relabel(raw, *self.table)[None]  # (1, z, y, x)

    def write(self, block: Block, values: np.ndarray) -> None:
        self.out = write_block(self.out, self.spec.output, block.write, values,
                               ctx=self.spec.ctx)


def relabel(fragments: np.ndarray, table_fragments: np.ndarray, table_segments: np.ndarray
            ) -> np.ndarray:
    """Fragments renamed by the table (ascending fragments); those not in it keep their
    name, 0 stays 0. Through the block's dense renumbering (`graph.renumbered`) and a
    lookup: 2.3x a sorting `unique`'s inverse on a 128^3 block."""
    local, ids = renumbered(fragments)  # ids[local] = fragment
    names = ids.copy()
    if len(table_fragments):
        at = np.minimum(np.searchsorted(table_fragments, ids), len(table_fragments) - 1)
        known = table_fragments[at] == ids
        names[known] = table_segments[at][known]
    names[ids == 0] = 0
    return names[local].reshape(fragments.shape)
