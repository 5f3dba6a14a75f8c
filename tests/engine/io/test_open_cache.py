"""The engine reuses an opened Zarr array only while its metadata files are unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from znni.engine.context import StoreContext
from znni.engine.io.volume import open_input
from znni.engine.io.zarr_arrays import open_zarr_array
from znni.engine.location import Location

CTX = StoreContext()  # store options (none) and caches for this module's calls


def make(path: Path, shape: tuple[int, ...], fmt: int, dtype: str = "float32") -> np.ndarray:
    values = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    arr = zarr.create_array(
        str(path), shape=shape, chunks=shape, dtype=dtype, zarr_format=fmt, overwrite=True
    )
    arr[...] = values
    return values


@pytest.mark.parametrize("fmt", [2, 3])
def test_unchanged_metadata_reuses_the_opened_array(tmp_path: Path, fmt: int) -> None:
    make(tmp_path / "a.zarr", (5, 6, 7), fmt)
    first = open_zarr_array(Location.parse(tmp_path / "a.zarr"), "input", ctx=CTX)
    assert open_zarr_array(Location.parse(tmp_path / "a.zarr"), "input", ctx=CTX) is first


@pytest.mark.parametrize("fmt", [2, 3])
def test_rewritten_array_is_opened_again_at_once(tmp_path: Path, fmt: int) -> None:
    """No sleep between the writes: within one mtime tick the new shape must be seen."""
    path = str(tmp_path / "a.zarr")
    make(tmp_path / "a.zarr", (5, 6, 7), fmt)
    assert open_zarr_array(Location.parse(path), "input", ctx=CTX).shape == (5, 6, 7)
    values = make(tmp_path / "a.zarr", (5, 6, 8), fmt)
    reopened = open_zarr_array(Location.parse(path), "input", ctx=CTX)
    assert reopened.shape == (5, 6, 8)
    np.testing.assert_array_equal(np.asarray(reopened[...]), values)
    make(tmp_path / "a.zarr", (5, 6, 8), fmt, dtype="uint8")
    assert np.dtype(open_zarr_array(Location.parse(path), "input", ctx=CTX).dtype) == np.uint8


@pytest.mark.parametrize("fmt", [2, 3])
def test_rewrite_that_keeps_mtime_and_size_is_seen(tmp_path: Path, fmt: int) -> None:
    """A copy that preserves mtimes (cp -p, rsync -t) must not hide a new shape."""
    path = tmp_path / "a.zarr"
    make(path, (5, 6, 7), fmt)
    meta = path / ("zarr.json" if fmt == 3 else ".zarray")
    before = meta.stat()
    assert open_zarr_array(Location.parse(path), "input", ctx=CTX).shape == (5, 6, 7)
    make(path, (5, 6, 8), fmt)  # same metadata size: one digit differs
    os.utime(meta, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert meta.stat().st_size == before.st_size
    assert open_zarr_array(Location.parse(path), "input", ctx=CTX).shape == (5, 6, 8)


def test_new_channel_count_is_checked_again(tmp_path: Path) -> None:
    path = str(tmp_path / "a.zarr")
    make(tmp_path / "a.zarr", (2, 4, 5, 6), 3)
    assert open_input(Location.parse(path), 2, ctx=CTX).channels == 2
    make(tmp_path / "a.zarr", (3, 4, 5, 6), 3)
    with pytest.raises(ValueError, match="has 3 channels"):
        open_input(Location.parse(path), 2, ctx=CTX)


def test_changed_attributes_give_a_fresh_array(tmp_path: Path) -> None:
    path = str(tmp_path / "a.zarr")
    make(tmp_path / "a.zarr", (4, 4, 4), 3)
    first = open_zarr_array(Location.parse(path), "input", ctx=CTX)
    zarr.open_array(path, mode="r+").attrs["resolution"] = [40, 4, 4]
    second = open_zarr_array(Location.parse(path), "input", ctx=CTX)
    assert second is not first
    assert second.attrs["resolution"] == [40, 4, 4]


def test_cached_array_reads_current_chunk_data(tmp_path: Path) -> None:
    """Only metadata is cached: data written after the open is what a read returns."""
    path = str(tmp_path / "a.zarr")
    make(tmp_path / "a.zarr", (4, 4, 4), 3)
    cached = open_zarr_array(Location.parse(path), "input", ctx=CTX)
    zarr.open_array(path, mode="r+")[...] = 7.0
    assert open_zarr_array(Location.parse(path), "input", ctx=CTX) is cached
    np.testing.assert_array_equal(np.asarray(cached[...]), np.full((4, 4, 4), 7.0, np.float32))


def test_not_an_array_is_still_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="is not a Zarr array"):
        open_zarr_array(Location.parse(tmp_path / "plain"), "input", ctx=CTX)
    with pytest.raises(ValueError, match="does not exist"):
        open_zarr_array(Location.parse(tmp_path / "missing"), "input", ctx=CTX)
    make(tmp_path / "gone.zarr", (4, 4, 4), 3)
    assert open_zarr_array(Location.parse(tmp_path / "gone.zarr"), "input", ctx=CTX).shape == (4, 4, 4)
    (tmp_path / "gone.zarr" / "zarr.json").unlink()
    with pytest.raises(ValueError, match="is not a Zarr array"):
        open_zarr_array(Location.parse(tmp_path / "gone.zarr"), "input", ctx=CTX)


def test_opened_arrays_are_kept_per_context(tmp_path: Path) -> None:
    """The cache lives in the StoreContext, not the process: another context opens again,
    and a pickled context (what a Dask worker receives) arrives with empty caches."""
    import pickle

    path = str(tmp_path / "a.zarr")
    make(tmp_path / "a.zarr", (4, 4, 4), 3)
    first = open_zarr_array(Location.parse(path), "input", ctx=CTX)
    assert open_zarr_array(Location.parse(path), "input", ctx=StoreContext()) is not first
    assert open_zarr_array(Location.parse(path), "input", ctx=CTX) is first
    copy = pickle.loads(pickle.dumps(CTX))
    assert copy == CTX and not copy.caches.opened and copy.caches is not CTX.caches
