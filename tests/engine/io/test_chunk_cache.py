"""The input chunk cache (`engine/io/chunk_cache.py`) on real Zarr stores on disk: reads equal
direct reads on odd shapes and chunkings (3D, 4D, edge chunks, OME levels); a store that
counts its `get` calls shows each chunk is fetched once over a segment run's blocks while
the bound allows, and again after an eviction; the bound is honoured."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume

from znni.engine.context import StoreContext
from znni.engine.geometry import Box
from znni.engine.io.borders import read_with_border
from znni.engine.io.chunk_cache import ChunkCache, ChunkedReader, cover
from znni.engine.io.volume import open_input
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import _blocks_and_spec, prepare_run
from znni.model.network import load_network

CTX = StoreContext()  # store options (none) and caches for this module's calls


class CountingStore(zarr.storage.WrapperStore):
    """A real store that counts the `get` calls per key (chunk keys only)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.gets: Counter[str] = Counter()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if not key.endswith((".json", ".zarray", ".zattrs", ".zgroup")):
            self.gets[key] += 1
        return await self._store.get(key, prototype, byte_range)


def counted(path: str) -> tuple[Any, CountingStore]:
    store = CountingStore(zarr.storage.LocalStore(path, read_only=True))
    return zarr.open_array(store=store, mode="r"), store


def random_boxes(shape: tuple[int, int, int], n: int, seed: int) -> list[Box]:
    rng = np.random.default_rng(seed)
    boxes = [Box((0, 0, 0), shape), Box((0, 0, 0), (1, 1, 1))]
    for _ in range(n):
        lo = [int(rng.integers(0, s)) for s in shape]
        hi = [int(rng.integers(a + 1, s + 1)) for a, s in zip(lo, shape, strict=True)]
        boxes.append(Box((lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2])))
    return boxes


@pytest.mark.parametrize(("shape", "chunks", "bound"), [
    ((13, 17, 11), (4, 5, 3), 2**20),  # everything fits
    ((13, 17, 11), (4, 5, 3), 200),  # a few chunks: evictions between and within reads
    ((3, 9, 10, 7), (2, 4, 3, 5), 2**20),  # 4D, channel chunks smaller than C
    ((2, 5, 6, 7), (2, 5, 6, 7), 0),  # one chunk; a bound of 0 keeps nothing
])
def test_reads_equal_direct_reads(tmp_path: Path, shape: tuple, chunks: tuple,
                                  bound: int) -> None:
    vol = np.random.default_rng(0).integers(0, 255, size=shape).astype(np.uint8)
    arr = zarr.open_array(write_volume(tmp_path / "v.zarr", vol, 3, chunks), mode="r")
    cache = ChunkCache(bound)
    reader = ChunkedReader(arr, len(shape) == 4, cache, Location.parse("v"))
    full = vol if len(shape) == 4 else vol[None]
    for box in random_boxes(full.shape[1:], 40, seed=len(shape)):
        got = reader.read(box)
        assert got.dtype == vol.dtype
        np.testing.assert_array_equal(got, full[(slice(None), *box.slices())])
        assert cache.nbytes <= bound
    with pytest.raises(ValueError, match=r"lo=\(0, 0, 0\) hi=\(1, 1, 99\)"):
        reader.read(Box((0, 0, 0), (1, 1, 99)))


def test_each_chunk_fetched_once_over_a_segment_runs_blocks(tmp_path: Path) -> None:
    """The blocks and cache bound segment() uses, read in its order with its border mode."""
    rng = np.random.default_rng(3)
    spec = write_network(tmp_path, *small_network(rng))
    vol = rng.integers(0, 255, size=(21, 26, 19)).astype(np.uint8)
    path = write_volume(tmp_path / "in.zarr", vol, 3, (5, 6, 4))
    job = SegmentJob(load_network(spec), path, str(tmp_path / "out.zarr"), chunks=(6, 8, 5),
                     block=(6, 8, 5), border="reflect", memory_limit_bytes=2**28)
    blocks, bspec = _blocks_and_spec(job, prepare_run(job))
    assert len(blocks) > 20 and bspec.input_cache_bytes == 2**28 // 16
    worker_volume = open_input(Location.parse(path), 1, bspec.input_cache_bytes, ctx=CTX)
    direct = open_input(Location.parse(path), 1, ctx=CTX)
    arr, store = counted(path)
    reader = ChunkedReader(arr, False, ChunkCache(bspec.input_cache_bytes), Location.parse(path))
    for b in blocks:
        want = read_with_border(direct.read, b.read, direct.shape, "reflect")
        got = read_with_border(reader.read, b.read, direct.shape, "reflect")
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(read_with_border(
            worker_volume.read, b.read, direct.shape, "reflect"), want)
    assert len(store.gets) == 5 * 5 * 5  # every chunk of the volume, each once
    assert set(store.gets.values()) == {1}
    uncached, plain = counted(path)
    for b in blocks:
        read_with_border(lambda box: uncached[box.slices()][None], b.read, direct.shape,
                         "reflect")
    assert sum(plain.gets.values()) > 2 * sum(store.gets.values())  # what the cache saves


def test_bound_evicts_least_recent_and_refetches_correctly(tmp_path: Path) -> None:
    vol = np.arange(8 * 8 * 8, dtype=np.uint16).reshape(8, 8, 8)
    arr, store = counted(write_volume(tmp_path / "v.zarr", vol, 2, (4, 4, 4)))
    chunk_bytes = 4 * 4 * 4 * 2
    cache = ChunkCache(3 * chunk_bytes)
    reader = ChunkedReader(arr, False, cache, Location.parse("v"))
    np.testing.assert_array_equal(reader.read(Box((0, 0, 0), (4, 4, 8)))[0], vol[:4, :4, :])
    np.testing.assert_array_equal(reader.read(Box((0, 4, 0), (4, 8, 8)))[0], vol[:4, 4:, :])
    assert cache.nbytes == 3 * chunk_bytes and len(cache) == 3  # the oldest went
    assert sum(store.gets.values()) == 4
    np.testing.assert_array_equal(reader.read(Box((1, 1, 1), (3, 3, 3)))[0], vol[1:3, 1:3, 1:3])
    assert store.gets["0.0.0"] == 2  # evicted, fetched again (format 2 keys)
    np.testing.assert_array_equal(reader.read(Box((0, 4, 4), (4, 8, 8)))[0], vol[:4, 4:, 4:])
    assert store.gets["0.1.1"] == 1  # still kept


def test_ome_level_reads_through_the_cache(tmp_path: Path) -> None:
    vol = np.random.default_rng(2).integers(0, 255, size=(2, 9, 20, 18)).astype(np.uint8)
    path = str(tmp_path / "img.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ome-zarr-py's deprecated default Scaler
        from ome_zarr.writer import write_image

        write_image(vol, zarr.open_group(path, mode="w"), axes="czyx", scale_factors=[],
                    storage_options={"chunks": (1, 4, 7, 5)})
    loc = Location.parse(path)
    cached, direct = open_input(loc, 2, 2**20, ctx=CTX), open_input(loc, 2, ctx=CTX)
    assert cached.reader is not None and direct.reader is None
    for box in random_boxes(cached.shape, 20, seed=7):
        np.testing.assert_array_equal(cached.read(box), direct.read(box))
        np.testing.assert_array_equal(cached.read(box), vol[(slice(None), *box.slices())])


def test_cover_is_an_exact_partition_in_few_boxes() -> None:
    rng = np.random.default_rng(4)
    for _ in range(30):
        grid = list(itertools.product(range(4), range(3), range(5)))
        want = {g for g in grid if rng.random() < 0.6}
        boxes = cover(want)
        got = [i for lo, hi in boxes
               for i in itertools.product(*(range(a, b) for a, b in zip(lo, hi, strict=True)))]
        assert sorted(got) == sorted(want)  # every index once, nothing else
    slab = set(itertools.product(range(2, 4), range(3), range(1, 5)))
    assert cover(slab) == [((2, 0, 1), (4, 3, 5))]


def test_cache_refuses_a_negative_bound_and_oversized_items() -> None:
    with pytest.raises(ValueError, match="-1"):
        ChunkCache(-1)
    cache = ChunkCache(10)
    assert not cache.put("big", np.zeros(11, np.uint8))
    assert cache.put("a", np.zeros(6, np.uint8)) and cache.put("a", np.zeros(6, np.uint8))
    assert cache.nbytes == 6 and len(cache) == 1
    assert cache.put("b", np.zeros(6, np.uint8)) and cache.get("a") is None
    assert cache.nbytes == 6
