"""How the pyramid reaches the store, on real Zarr arrays on disk: the coarse-chunk writer
(`engine/io/level_writer.py`) against the same updates applied to a numpy array, and the
pyramid builder (`engine/io/pyramid.py`) against an independent loop-by-loop mean, for
blocks aligned and not aligned with the deepest factor, levels made from values in
memory or read back, ROI runs over an older volume, chunks written at once, after a
delay or only when complete, a tight memory bound; every block is recorded once, and
only when its levels are in the store. A store that counts its writes shows each coarse
chunk is written once per run when writes may wait, and read at most once."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from znni.engine.geometry import Block, Box, Halo, split_blocks
from znni.engine.io.level_writer import LevelWriter
from znni.engine.io.pyramid import PyramidBuilder, cumulative, level_shapes


class CountingStore(zarr.storage.WrapperStore):
    """A real store that counts `get` and `set` calls per chunk key."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.gets: Counter[str] = Counter()
        self.sets: Counter[str] = Counter()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if not key.endswith(".json"):
            self.gets[key] += 1
        return await self._store.get(key, prototype, byte_range)

    async def set(self, key: str, value: Any) -> None:
        if not key.endswith(".json"):
            self.sets[key] += 1
        await self._store.set(key, value)


def mean_level(a: np.ndarray, step: tuple[int, int, int], dtype: str) -> np.ndarray:
    """Independent reference: each voxel the mean of its window (partial at far faces)."""
    c, z, y, x = a.shape
    shape = [-(-n // s) for n, s in zip((z, y, x), step)]
    out = np.zeros((c, *shape), np.float64)
    for i, j, k in itertools.product(*(range(n) for n in shape)):
        w = a[:, i * step[0]:(i + 1) * step[0], j * step[1]:(j + 1) * step[1],
              k * step[2]:(k + 1) * step[2]]
        out[:, i, j, k] = w.reshape(c, -1).astype(np.float64).mean(axis=1)
    return np.rint(out).astype(np.uint8) if dtype == "uint8" else out.astype(np.float32)


def reference_levels(level0: np.ndarray, steps: list, dtype: str) -> list[np.ndarray]:
    out = [level0]
    for step in steps:
        out.append(mean_level(out[-1], step, dtype))
    return out


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape).astype(np.uint8)
    return rng.random(shape, dtype=np.float32)


@pytest.mark.parametrize("kept_chunks", [1, 3, 1000])
def test_level_writer_equals_the_same_updates_on_numpy(tmp_path: Path, kept_chunks: int) -> None:
    rng = np.random.default_rng(kept_chunks)
    shape, chunks = (2, 11, 17, 13), (2, 4, 5, 6)  # edge chunks on every axis
    old = rng.random(shape, dtype=np.float32)  # what an earlier run left
    array = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=shape, chunks=chunks,
                              dtype="float32", fill_value=0)
    array[...] = old
    mirror = old.copy()
    writer = LevelWriter([array], kept_bytes=kept_chunks * int(np.prod(chunks)) * 4)
    for step in range(60):
        if step % 7 == 3:  # a chunk-aligned update covering whole chunks
            lo = tuple(int(rng.integers(0, -(-n // c))) * c for n, c in zip(shape[1:], chunks[1:]))
            hi = tuple(min(n, a + c * int(rng.integers(1, 3)))
                       for a, c, n in zip(lo, chunks[1:], shape[1:]))
        else:
            lo = tuple(int(rng.integers(0, n)) for n in shape[1:])
            hi = tuple(int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape[1:]))
        values = rng.random((2, *(b - a for a, b in zip(lo, hi))), dtype=np.float32)
        keys = writer.update(0, lo, hi, values)
        mirror[(slice(None), *(slice(a, b) for a, b in zip(lo, hi)))] = values
        assert set(keys) <= set(writer.dirty)
        if step % 5 == 4:  # write some of the dirty chunks
            writer.write([k for i, k in enumerate(list(writer.dirty)) if i % 2 == 0])
        if writer.over():
            writer.write(list(writer.dirty))
            assert not writer.over()
        assert writer.bytes == sum(p.nbytes for p in writer.kept.values())
    writer.write(list(writer.dirty))
    assert not writer.dirty
    np.testing.assert_array_equal(np.asarray(array[...]), mirror)


def _pyramid(store: Any, shape: tuple, chunks: tuple, steps: list,
             dtype: str, old: np.ndarray) -> list[Any]:
    """Level arrays 0..K as the OME output makes them (level 0's chunks, clipped), holding
    `old` (level 0 of an earlier run) and its consistent pyramid."""
    group = zarr.create_group(store=store, zarr_format=3)
    arrays = []
    for k, (level, ref) in enumerate(zip(level_shapes(shape[1:], steps),
                                         reference_levels(old, steps, dtype))):
        arr = group.create_array(str(k), shape=(shape[0], *level), dtype=dtype, fill_value=0,
                                 chunks=(shape[0], *(min(c, n) for c, n in zip(chunks, level))))
        arr[...] = ref
        arrays.append(arr)
    return arrays


CASES = {  # shape (c, z, y, x), chunks = block, steps, ROI
    "aligned": ((2, 16, 24, 20), (4, 8, 8), [(2, 2, 2), (2, 2, 2)], None),
    "not aligned": ((1, 13, 22, 18), (3, 5, 5), [(2, 2, 2), (2, 2, 2)], None),
    "roi, y and x only": ((2, 9, 30, 26), (3, 8, 8), [(1, 2, 2), (1, 2, 2), (2, 2, 2)],
                          ((0, 9), (3, 21), (5, 26))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("flush_s,kept_bytes", [(0.0, 2**26), (0.02, 2**26), (1e9, 2**26),
                                                (1e9, 3000)])
def test_builder_levels_equal_the_mean_of_level_0(tmp_path: Path, case: str, dtype: str,
                                                  flush_s: float, kept_bytes: int) -> None:
    shape, chunks, steps, roi = CASES[case]
    rng = np.random.default_rng(len(case))
    old = random_values(rng, shape, dtype)
    store = CountingStore(zarr.storage.LocalStore(str(tmp_path / "out.zarr")))
    arrays = _pyramid(store, shape, chunks, steps, dtype, old)
    region = Box.from_shape(shape[1:]) if roi is None else Box(
        tuple(a for a, _ in roi), tuple(b for _, b in roi))
    none = (0, 0, 0)
    blocks = split_blocks(region, chunks, chunks, Halo(none, none), (1, 1, 1))
    new = old.copy()
    new[(slice(None), *region.slices())] = random_values(rng, (shape[0], *region.shape), dtype)
    want = reference_levels(new, steps, dtype)
    factors, recorded = cumulative(steps), []
    stored = [zarr.open_array(str(tmp_path / "out.zarr" / str(k)), mode="r")
              for k in range(len(arrays))]  # read past the counting store

    def record(block: Block) -> None:  # the block's levels must be in the store by now
        for k in range(1, len(steps) + 1):
            f = factors[k]
            box = tuple(slice(a // fi, -(-b // fi))
                        for a, b, fi in zip(block.write.lo, block.write.hi, f))
            got = np.asarray(stored[k][(slice(None), *box)])
            np.testing.assert_allclose(got, want[k][(slice(None), *box)], atol=1e-6)
        recorded.append(block.key)

    builder = PyramidBuilder(arrays[0], arrays[1:], steps, shape[1:], dtype, blocks,
                             frozenset(), record, flush_s=flush_s, kept_bytes=kept_bytes)
    store.gets.clear()
    store.sets.clear()
    for i, block in enumerate(blocks):
        values = new[(slice(None), *block.write.slices())]
        arrays[0][(slice(None), *block.write.slices())] = values
        builder.land(block, values if i % 3 else None)  # every third as from a Dask worker
    builder.close()
    builder.check()
    sets = Counter({k: n for k, n in store.sets.items() if not k.startswith("0/")})
    gets = Counter({k: n for k, n in store.gets.items() if not k.startswith("0/")})
    assert sorted(recorded) == sorted(b.key for b in blocks)
    for got, ref in zip((np.asarray(a[...]) for a in arrays), want):
        np.testing.assert_allclose(got, ref, atol=1e-6)
    if flush_s == 1e9 and kept_bytes > 3000:  # each chunk written once: when complete
        assert sets and max(sets.values()) == 1 and max(gets.values()) <= 1


def test_builder_leaves_finished_blocks_alone_and_writes_each_chunk_once(tmp_path: Path) -> None:
    """A resumed run: blocks already done are neither updated nor waited for."""
    shape, chunks, steps = (1, 16, 16, 16), (4, 4, 4), [(2, 2, 2), (2, 2, 2)]
    rng = np.random.default_rng(9)
    old = random_values(rng, shape, "float32")
    store = CountingStore(zarr.storage.LocalStore(str(tmp_path / "out.zarr")))
    arrays = _pyramid(store, shape, chunks, steps, "float32", old)
    none = (0, 0, 0)
    blocks = split_blocks(Box.from_shape(shape[1:]), chunks, chunks, Halo(none, none), (1, 1, 1))
    done = frozenset(b.key for b in blocks[::2])
    new = old.copy()
    recorded: list[str] = []
    builder = PyramidBuilder(arrays[0], arrays[1:], steps, shape[1:], "float32", blocks, done,
                             lambda b: recorded.append(b.key), flush_s=1e9)
    store.sets.clear()
    for block in blocks:
        if block.key in done:
            continue
        values = random_values(rng, (1, *block.write.shape), "float32")
        new[(slice(None), *block.write.slices())] = values
        arrays[0][(slice(None), *block.write.slices())] = values
        builder.land(block, values)
    deadline = time.monotonic() + 30  # every chunk completes, so all are recorded before close
    while len(recorded) < len(blocks) - len(done) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(recorded) == len(blocks) - len(done)
    builder.close()
    assert sorted(recorded) == sorted(b.key for b in blocks if b.key not in done)
    for got, ref in zip((np.asarray(a[...]) for a in arrays), reference_levels(new, steps,
                                                                                 "float32")):
        np.testing.assert_allclose(got, ref, atol=1e-6)
    coarse = Counter({k: n for k, n in store.sets.items() if not k.startswith("0/")})
    assert coarse and max(coarse.values()) == 1


@pytest.mark.parametrize("flush_s", [0.0, 1e9])
def test_builder_closed_early_then_resumed_equals_one_run(tmp_path: Path, flush_s: float) -> None:
    """As a cancelled run and its resume: only the first half of the blocks land; close()
    writes every chunk they changed and records the blocks whose footprints are complete
    (their levels checked in the store as each is recorded); a second builder, with those
    as done, takes the rest over level 0 left with garbage there; every level equals the
    mean of the final level 0."""
    shape, chunks, steps = (1, 13, 22, 18), (3, 5, 5), [(2, 2, 2), (2, 2, 2)]
    rng = np.random.default_rng(12)
    old = random_values(rng, shape, "float32")
    arrays = _pyramid(str(tmp_path / "out.zarr"), shape, chunks, steps, "float32",
                      old)
    none = (0, 0, 0)
    blocks = split_blocks(Box.from_shape(shape[1:]), chunks, chunks, Halo(none, none), (1, 1, 1))
    new = random_values(rng, shape, "float32")
    want, factors = reference_levels(new, steps, "float32"), cumulative(steps)
    recorded: list[str] = []

    def record(block: Block) -> None:
        for k in range(1, len(steps) + 1):
            box = tuple(slice(a // f, -(-b // f))
                        for a, b, f in zip(block.write.lo, block.write.hi, factors[k]))
            np.testing.assert_allclose(np.asarray(arrays[k][(slice(None), *box)]),
                                       want[k][(slice(None), *box)], atol=1e-6)
        recorded.append(block.key)

    def run(todo: list[Block], done: frozenset[str]) -> None:
        builder = PyramidBuilder(arrays[0], arrays[1:], steps, shape[1:], "float32", blocks,
                                 done, record, flush_s=flush_s)
        for block in todo:
            values = new[(slice(None), *block.write.slices())]
            arrays[0][(slice(None), *block.write.slices())] = values
            builder.land(block, values)
        builder.close()
        builder.check()

    run(blocks[: len(blocks) // 2], frozenset())
    assert 0 < len(recorded) < len(blocks) // 2  # some wait on neighbours that never came
    first = frozenset(recorded)
    for block in blocks:
        if block.key not in first:  # a killed write may leave anything there
            arrays[0][(slice(None), *block.write.slices())] = 7.0
    run([b for b in blocks if b.key not in first], first)
    assert sorted(recorded) == sorted(b.key for b in blocks)
    for got, ref in zip((np.asarray(a[...]) for a in arrays), want):
        np.testing.assert_allclose(got, ref, atol=1e-6)
