"""An agglomeration's time and memory, predicted before it runs (`znni agglomerate --plan`,
`znni plan --agglomerate`): the block stages' own functions and the global step run in
memory on one sample block (at most 64^3) of the affinities, timed, and scaled to the
region: the block stages per voxel (and per face voxel), the global step per edge of the
graph, whose edges per voxel the sample gives. Reads and writes are counted by encoding and
decoding the sample as the run's arrays are (in memory: a store's own latency is not)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from znni.engine.agglomerate import merge
from znni.engine.agglomerate.fragments import (
    HIGH,
    LOW,
    Neighbourhood,
    axis_slices,
    edge_validity,
    label_block,
    pointers,
)
from znni.engine.agglomerate.graph import BlockGraph, block_graph
from znni.engine.agglomerate.stages import COMPUTE_THREADS, _grow, relabel
from znni.engine.geometry import Box, Triple
from znni.triple import as_triple

SAMPLE_EDGE = 64  # the sample block's side, at most
BLOCK_BYTES_PER_VOXEL = 40  # a block stage's working set (docs/design.md "Memory")
# the block stages' speed-up per thread: 2 threads measured 1.57x one on 2 cores (stages.py)
THREAD_EFFICIENCY = 0.8


@dataclass(frozen=True)
class AgglomerationPrediction:
    """An agglomeration's predicted seconds per stage, peak memory and graph size."""

    fragments_s: float
    faces_s: float
    agglomerate_s: float
    relabel_s: float
    peak_bytes: int
    edges: int  # predicted edges of the joined blocks' graphs (the global step's input)
    voxels: int
    edges_per_voxel: float
    basis: str  # what the figures rest on

    @property
    def total_s(self) -> float:
        return self.fragments_s + self.faces_s + self.agglomerate_s + self.relabel_s

    @property
    def voxels_per_s(self) -> float:
        return self.voxels / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict[str, float | int | str]:
        return {"fragments_s": self.fragments_s, "faces_s": self.faces_s,
                "agglomerate_s": self.agglomerate_s, "relabel_s": self.relabel_s,
                "total_s": self.total_s, "voxels": self.voxels,
                "voxels_per_s": self.voxels_per_s, "peak_bytes": self.peak_bytes,
                "edges": self.edges, "edges_per_voxel": self.edges_per_voxel,
                "basis": self.basis}

    def line(self) -> str:
        """One line: each stage's seconds, the total, the peak and the basis."""
        return (f"predicted: fragments {_s(self.fragments_s)} s, faces {_s(self.faces_s)} s, "
                f"agglomerate {_s(self.agglomerate_s)} s, relabel {_s(self.relabel_s)} s; "
                f"total {_s(self.total_s)} s ({self.voxels_per_s / 1e6:.1f} M voxels/s), "
                f"peak {self.peak_bytes / 2**30:.2f} GiB ({self.basis})")


def _s(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2f}"


@dataclass(frozen=True)
class _Sample:
    """What the sample block measured: seconds per voxel of each block stage, seconds per
    face voxel, seconds per edge of the global step, edges per voxel and per face voxel."""

    fragments_s: float  # per voxel
    faces_s: float  # per face voxel
    relabel_s: float  # per voxel, one threshold
    global_s: float  # per edge
    inner_edges: float  # per voxel
    face_edges: float  # per face voxel


def predict(shape: Triple, block: Triple, sample: np.ndarray | None = None,
            thresholds: Sequence[float] = (0.5,), threads: int = COMPUTE_THREADS,
            sample_name: str = "the affinities", low: float = LOW, high: float = HIGH
            ) -> AgglomerationPrediction:
    """The agglomeration of a `shape` region in `block`s (module docstring). `sample`:
    (3, z, y, x) affinities of the volume (its centre, cropped to the block and 64^3, is
    measured); None: synthetic cells (`synthetic.synthetic_cells`, 64^3, seed 0)."""
    shape, block = _positive(shape, "shape"), _positive(block, "block")
    if not thresholds:
        raise ValueError("give at least one threshold to predict an agglomeration for")
    block = as_triple(min(b, n) for b, n in zip(block, shape, strict=True))
    if sample is None:
        from znni.engine.agglomerate.synthetic import synthetic_cells

        side = as_triple(min(SAMPLE_EDGE, b) for b in block)
        sample = synthetic_cells(side, seed=0)[1]
        where = "assuming synthetic cells' fragment density, the real one depends on the " \
                "affinities"
    else:
        if sample.ndim != 4 or sample.shape[0] != 3 or min(sample.shape[1:]) < 2:
            raise ValueError(f"the sample must be (3, z, y, x) affinities of at least 2 "
                             f"voxels per axis, not shape {tuple(sample.shape)}")
        sample = _centre(sample, as_triple(min(SAMPLE_EDGE, b) for b in block))
        where = f"from a {_size(as_triple(sample.shape[1:]))} sample of {sample_name}"
    m = _measure(np.ascontiguousarray(sample, dtype=np.float32), min(thresholds), thresholds,
                 low, high)
    io = _codec_seconds(np.ascontiguousarray(sample, dtype=np.float32))
    voxels = int(np.prod(shape))
    faces = _face_voxels(shape, block)
    # the block stages run `threads` blocks at once; their compute releases the GIL most of
    # the time: 2 threads measured 1.57x one on 2 cores, so `threads` x 0.8
    speedup = max(1.0, threads * THREAD_EFFICIENCY)
    edges = int(round(m.inner_edges * voxels + m.face_edges * faces))
    working_set = BLOCK_BYTES_PER_VOXEL * int(np.prod(block)) * max(1, threads)
    per_voxel = edges / voxels
    # the greedy loop's cost per edge grows with the graph (its heap and tables leave the
    # caches), so the global step's time is a lower bound for very large graphs
    basis = (f"{where}: {per_voxel:.2f} edges per voxel; chunks encoded and decoded as the "
             f"run's, a store's latency not counted; the agglomerate step is a lower bound "
             f"for very large graphs")
    read_affs, write_ids, read_ids = io
    return AgglomerationPrediction(
        fragments_s=(m.fragments_s + read_affs + write_ids) * voxels / speedup,
        faces_s=m.faces_s * faces / speedup + (read_affs + read_ids) * voxels / speedup,
        agglomerate_s=m.global_s * edges,
        relabel_s=(m.relabel_s + read_ids + write_ids) * voxels * len(thresholds) / speedup,
        peak_bytes=max(working_set, edges * merge.MEMORY_PER_EDGE_BYTES), edges=edges,
        voxels=voxels, edges_per_voxel=per_voxel, basis=basis)


def _positive(t: Sequence[int], name: str) -> Triple:
    if len(t) != 3 or any(int(v) < 1 for v in t):
        raise ValueError(f"the {name} {tuple(t)} must be three positive sizes z,y,x")
    return as_triple(int(v) for v in t)


def _size(t: Triple) -> str:
    return f"{t[0]}³" if t[0] == t[1] == t[2] else "x".join(map(str, t))


def _centre(affs: np.ndarray, side: Triple) -> np.ndarray:
    """The central `side` (clipped to the array) of (3, z, y, x) affinities."""
    at = [slice((n - min(s, n)) // 2, (n - min(s, n)) // 2 + min(s, n))
          for n, s in zip(affs.shape[1:], side, strict=True)]
    return affs[(slice(None), *at)]


def _face_voxels(shape: Triple, block: Triple) -> int:
    """Voxels on the blocks' lower faces inside the region (the face stage's planes)."""
    total = 0
    for c in range(3):
        inner = -(-shape[c] // block[c]) - 1  # block boundaries crossing axis c
        total += inner * int(np.prod(shape)) // shape[c]
    return total


def _measure(affs: np.ndarray, least: float, thresholds: Sequence[float], low: float,
             high: float) -> _Sample:
    """The sample as one block inside a larger region (all its faces shared, as a block's
    in the middle of a volume): fragments and pre-merged inner graph, then its three middle
    planes as block faces, then the global step and the relabelling on what they give."""
    _warm_up()
    box = Box((0, 0, 0), as_triple(affs.shape[1:]))
    start = time.perf_counter()
    hood = _hood(affs, box, box)
    links = pointers(hood, low, high)
    fragments = label_block(links, box, box.shape)
    inner = block_graph(box, hood, fragments, links)
    names, regions, inner = merge.premerge(inner, _open(fragments), least)
    fragments = relabel(fragments, names, regions)
    fragments_s = time.perf_counter() - start
    start = time.perf_counter()
    faces, face_voxels = _faces(affs, box, fragments, low, high)
    faces_s = time.perf_counter() - start
    parts = [inner, *faces]
    start = time.perf_counter()
    graph = merge.basin_graph(parts)
    segments = list(merge.agglomerate(graph, thresholds))
    global_s = time.perf_counter() - start
    edges = sum(len(p.u) for p in parts)
    start = time.perf_counter()
    relabel(fragments, *merge.segment_table(graph, segments[-1]))
    relabel_s = time.perf_counter() - start
    return _Sample(fragments_s / box.size, faces_s / max(face_voxels, 1),
                   relabel_s / box.size, global_s / max(edges, 1),
                   len(inner.u) / box.size,
                   sum(len(p.u) for p in faces) / max(face_voxels, 1))


def _codec_seconds(affs: np.ndarray) -> tuple[float, float, float]:
    """Seconds per voxel to decode the affinities, encode ids and decode ids: the sample
    through in-memory Zarr arrays with the codecs the run's arrays use."""
    import zarr
    from zarr.storage import MemoryStore

    from znni.engine.io.zarr_arrays import output_compressors

    shape = affs.shape[1:]
    stored = zarr.create_array(MemoryStore(), shape=affs.shape, chunks=affs.shape,
                               dtype="float32")
    stored[...] = affs
    start = time.perf_counter()
    stored[...]
    read_affs = time.perf_counter() - start
    ids = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape) // 97  # runs of ids
    out = zarr.create_array(MemoryStore(), shape=shape, chunks=shape, dtype="uint64",
                            compressors=output_compressors("uint64"))
    start = time.perf_counter()
    out[...] = ids
    write_ids = time.perf_counter() - start
    start = time.perf_counter()
    out[...]
    read_ids = time.perf_counter() - start
    voxels = float(np.prod(shape))
    return read_affs / voxels, write_ids / voxels, read_ids / voxels


def _hood(affs: np.ndarray, box: Box, region: Box) -> Neighbourhood:
    grown = _grow(box, 1, 1, region)
    return Neighbourhood(box, grown, affs[(slice(None), *grown.slices())],
                         edge_validity(grown, region, None))


def _open(fragments: np.ndarray) -> np.ndarray:
    """The fragments on the block's six faces (all shared with neighbours)."""
    planes = [fragments[axis_slices(c, s, e)].ravel() for c in range(3)
              for s, e in ((0, 1), (-1, None))]
    return np.unique(np.concatenate(planes))


def _faces(affs: np.ndarray, box: Box, fragments: np.ndarray, low: float, high: float
           ) -> tuple[list[BlockGraph], int]:
    """The face stage on the sample's middle plane of each axis, as if a block boundary
    ran there: the fragments below it renamed apart (fragments are block-local)."""
    parts, voxels = [], 0
    offset = np.uint64(int(fragments.max()) + 1 if fragments.size else 1)
    for c in range(3):
        mid = box.shape[c] // 2
        if mid < 1:
            continue
        lo, hi = list(box.lo), list(box.hi)
        lo[c], hi[c] = mid, mid + 1
        plane = Box(as_triple(lo), as_triple(hi))
        lo[c] = mid - 1
        both = Box(as_triple(lo), as_triple(hi))
        labels = fragments[both.slices()].copy()
        below = labels[axis_slices(c, 0, 1)]
        below[below != 0] += offset
        parts.append(block_graph(plane, _hood(affs, both, box), labels, axes=(c,),
                                 low=low, high=high))
        voxels += plane.size
    return parts, voxels


_warm = False


def _warm_up() -> None:
    """The compiled greedy loop loaded (or compiled, once: Numba caches it) before timing."""
    global _warm
    if _warm:
        return
    one = np.zeros(1, np.int64)
    graph = merge.BasinGraph(np.array([1, 2], np.uint64), np.array([1, 2], np.uint64),
                             np.array([0, 1], np.int32), np.array([0], np.int32),
                             np.array([1], np.int32), one + 2**23, one + 1)
    list(merge.agglomerate(graph, (0.9,)))
    merge.premerge(BlockGraph(np.array([1], np.uint64), np.array([2], np.uint64), one + 2**23,
                              one + 1, np.zeros(0, np.uint64), np.zeros(0, np.uint64)),
                   np.zeros(0, np.uint64), 0.9)
    _warm = True
