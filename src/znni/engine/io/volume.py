"""Zarr input and output arrays: opening, checking, creating, reading and writing boxes.

Input: format 2 or 3, (z, y, x) when the network has one input channel or
(c, z, y, x); integer or float; or an OME-Zarr image group (its level 0) or one
level's array inside it (`ome.py`). Output: (c, z, y, x), format 3 when created;
an existing OME-Zarr output is checked through its level 0.
Every refusal is a ValueError naming the path and the offending values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from znni.engine.context import OPEN_CACHE_ENTRIES, StoreContext
from znni.engine.geometry import Box, Triple
from znni.engine.io.chunk_cache import ChunkCache, ChunkedReader
from znni.engine.io.faults import BadChunks, write_fault
from znni.engine.io.ome import OmeLevel, find_ome, is_group, ome_level
from znni.engine.io.precomputed import existing_chunks, open_volume
from znni.engine.io.stores import (
    StoreError,
    check_readable,
    driver_of,
    holds_anything,
    is_refusal,
    is_url,
    join,
    read_bytes,
    refusal,
    zarr_store,
)

DEFAULT_CHUNK = 64
METADATA_FILES = ("zarr.json", ".zarray", ".zattrs")  # all an opened array's fields come from


def import_zarr() -> None:
    """Import zarr now: it is imported lazily, so a long-lived process (the server) can
    pay that cost at startup instead of inside its first request."""
    import zarr  # noqa: F401


def open_zarr_array(path: str, what: str, *, ctx: StoreContext) -> Any:
    """Open an existing Zarr array read-only, or raise ValueError saying why not.

    An opened array is kept in the context's caches and reused while its metadata files
    hold the same bytes: zarr's
    open costs ~0.4 ms of CPU and several hops through its I/O threads, which a
    server validating many submissions of one volume pays per request, while reading
    the metadata files to compare takes ~0.02 ms. Comparing the bytes (not mtimes,
    which the kernel stamps at a few ms resolution) makes any rewrite a miss.
    """
    import zarr

    if is_url(path):
        return _open_url_array(path, what, ctx)
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{what} {path} does not exist")
    key = (str(p.resolve()), _metadata_bytes(p))
    caches = ctx.caches
    with caches.lock:
        cached = caches.opened.get(key)
    if cached is not None:
        return cached
    try:
        arr = zarr.open_array(str(p), mode="r")
    except Exception as e:  # zarr raises several unrelated types for "not an array"
        raise ValueError(f"{what} {path} is not a Zarr array ({type(e).__name__}: {e})") from e
    if any(b is not None for b in key[1]) and key[1] == _metadata_bytes(p):  # unchanged meanwhile
        with caches.lock:
            caches.opened[key] = arr
            while len(caches.opened) > OPEN_CACHE_ENTRIES:
                caches.opened.popitem(last=False)
    return arr


def _open_url_array(url: str, what: str, ctx: StoreContext) -> Any:
    """An array at a URL, read-only (not cached: its metadata is a request away)."""
    if all(read_bytes(join(url, n), what, ctx=ctx) is None for n in METADATA_FILES[:2]):
        raise ValueError(f"{what} {url} does not exist (no zarr.json or .zarray there)")
    try:
        return url_array(url, "r", ctx=ctx)
    except StoreError:
        raise
    except Exception as e:  # zarr raises several unrelated types for "not an array"
        if is_refusal(e):
            raise refusal(e, url, what, ctx=ctx) from e
        raise ValueError(f"{what} {url} is not a Zarr array ({type(e).__name__}: {e})") from e


def url_array(url: str, mode: str, *, ctx: StoreContext) -> Any:
    """zarr.open_array of the array at a URL. A format 3 array is built from its
    `zarr.json` as `read_bytes` gives it (remembered within a run's setup, `memo.py`)
    instead of zarr asking the store for zarr.json, .zarray and .zattrs again; anything
    else (format 2, a group, unreadable JSON) goes through zarr's own open."""
    import zarr

    store = zarr_store(url, read_only=mode == "r", ctx=ctx)
    meta = _json_object(read_bytes(join(url, METADATA_FILES[0]), ctx=ctx))
    if meta.get("zarr_format") == 3 and meta.get("node_type") == "array":
        from zarr.core.array import AsyncArray
        from zarr.storage import StorePath

        try:
            return zarr.Array(AsyncArray(meta, StorePath(store)))
        except Exception:  # zarr's own open says what is wrong with it
            pass
    return zarr.open_array(store=store, mode=mode)


def _json_object(raw: bytes | None) -> dict[str, Any]:
    try:
        meta = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _metadata_bytes(p: Path) -> tuple[bytes | None, ...]:
    """The bytes of each of an array's metadata files (None where there is none).

    A format 3 array's `zarr.json` holds all of it; zarr reads that one first.
    """
    try:
        return ((p / METADATA_FILES[0]).read_bytes(), None, None)
    except OSError:
        pass
    out: list[bytes | None] = [None]
    for name in METADATA_FILES[1:]:
        try:
            out.append((p / name).read_bytes())
        except OSError:  # missing, or not a directory: zarr.open_array says what is wrong
            out.append(None)
    return tuple(out)


@dataclass(frozen=True)
class InputVolume:
    """An opened input array and how its axes map to (C, Z, Y, X)."""

    path: str
    array: Any
    channels: int
    shape: Triple  # spatial (z, y, x)
    dtype: np.dtype
    has_channel_axis: bool
    ome: OmeLevel | None = None  # the OME-Zarr level read (voxel size, units); None: plain
    # reads through decoded chunks kept between blocks (`chunk_cache.py`); None: straight
    reader: ChunkedReader | None = field(default=None, compare=False, repr=False)
    # the policy for chunks that do not decode, and those filled (`faults.py`)
    bad_chunks: BadChunks = field(default_factory=BadChunks, compare=False, repr=False)

    def read(self, box: Box) -> np.ndarray:
        """Raw (C, Z, Y, X) values of a box inside the volume; a chunk that fails to read
        raises a `VolumeFault` naming it (or is filled, `bad_chunks.policy` 'fill')."""
        if self.reader is not None:
            return self.reader.read(box)
        try:
            if self.has_channel_axis:
                return np.asarray(self.array[(slice(None), *box.slices())])
            return np.asarray(self.array[box.slices()])[None]
        except Exception:  # noqa: BLE001 - read through chunks to name the one that failed
            name = self.ome.array_path if self.ome is not None else self.path
            return ChunkedReader(self.array, self.has_channel_axis, ChunkCache(0), name,
                                 self.bad_chunks).read(box)


def open_input(path: str, in_channels: int, cache_bytes: int = 0, *,
               ctx: StoreContext) -> InputVolume:
    """Open and check the input volume against the network's input channels. With
    `cache_bytes` > 0, reads keep up to that many bytes of decoded chunks for later
    reads (block workers: neighbouring blocks' halos share chunks)."""
    volume = _open_input(path, in_channels, ctx)
    if cache_bytes <= 0:
        return volume
    name = volume.ome.array_path if volume.ome is not None else path
    reader = ChunkedReader(volume.array, volume.has_channel_axis, ChunkCache(cache_bytes), name,
                           volume.bad_chunks)
    return replace(volume, reader=reader)


def _open_input(path: str, in_channels: int, ctx: StoreContext) -> InputVolume:
    ome = None
    if driver_of(path) is not None:  # precomputed (shown as c, z, y, x) or N5: TensorStore
        arr = open_volume(path, "input", ctx=ctx)
    else:
        check_readable(path, "input", ctx=ctx)
        ome = find_ome(path, ctx=ctx) if is_url(path) or Path(path).is_dir() else None
        arr = open_zarr_array(ome.array_path if ome else path, "input", ctx=ctx)
    shape = tuple(int(s) for s in arr.shape)
    dtype = np.dtype(arr.dtype)
    if dtype.kind not in "iuf":
        raise ValueError(f"input {path} has dtype {dtype}; expected an integer or float type")
    if ome is not None:
        return _ome_input(path, arr, ome, in_channels)
    if len(shape) == 3:
        if in_channels != 1:
            raise ValueError(
                f"input {path} is 3D {shape} (one channel) but the network expects "
                f"{in_channels} input channels as a 4D (c, z, y, x) array"
            )
        return InputVolume(path, arr, 1, (shape[0], shape[1], shape[2]), dtype, False)
    if len(shape) == 4:
        if shape[0] != in_channels:
            raise ValueError(
                f"input {path} has {shape[0]} channels (shape {shape}) but the network "
                f"expects {in_channels}"
            )
        return InputVolume(path, arr, shape[0], (shape[1], shape[2], shape[3]), dtype, True)
    raise ValueError(
        f"input {path} has {len(shape)} dimensions {shape}; expected 3 (z, y, x) or 4 (c, z, y, x)"
    )


def _ome_input(path: str, arr: Any, ome: OmeLevel, in_channels: int) -> InputVolume:
    """An OME-Zarr level whose axes say which dimension is the channel axis."""
    shape = tuple(int(s) for s in arr.shape)
    if len(shape) != len(ome.axis_names):
        raise ValueError(
            f"input {path} has {len(ome.axis_names)} axes {list(ome.axis_names)} but its level "
            f"{ome.level} array has {len(shape)} dimensions {shape}"
        )
    channels = shape[0] if ome.has_channel_axis else 1
    if channels != in_channels:
        raise ValueError(
            f"input {path} has {channels} channels (shape {shape}) but the network expects "
            f"{in_channels}"
        )
    spatial = (shape[-3], shape[-2], shape[-1])
    return InputVolume(path, arr, channels, spatial, np.dtype(arr.dtype), ome.has_channel_axis,
                       ome)


def output_array_path(path: str, *, ctx: StoreContext) -> str:
    """The array that holds an output's level 0: itself, or an OME-Zarr group's level 0."""
    if is_group(path, ctx=ctx):
        try:
            return ome_level(path, 0, ctx=ctx).array_path
        except ValueError as e:
            raise ValueError(
                f"existing output {path} is a Zarr group but not an OME-Zarr image ({e})"
            ) from e
    return path


def default_chunks(shape: Triple) -> Triple:
    """Engine-chosen output chunks: 64 per axis, clipped to the volume."""
    z, y, x = (min(DEFAULT_CHUNK, n) for n in shape)
    return (z, y, x)


# numcodecs' Blosc encodes at most 2**31 - 1 bytes, and every chunk is encoded whole
CHUNK_LIMIT_BYTES = 2**31 - 1


def output_chunks(
    requested: Triple | None, existing: Triple | None, shape: Triple, channels: int,
    dtype: str, path: str,
) -> Triple:
    """The output's spatial chunks: an existing output's own, else `requested` (--chunks)
    clipped to the volume (past it a chunk holds only fill), else `default_chunks`.
    ValueError for chunks that differ from an existing output's (they cannot change in
    place) or that are too large to encode."""
    clipped = None if requested is None else _clip(requested, shape)
    if existing is not None:
        if clipped is not None and clipped != _clip(existing, shape):
            raise ValueError(
                f"chunks {clipped} differ from those of the existing output {path}, "
                f"{existing}; leave the chunks out to use the output's, or write a new output"
            )
        return existing
    chunks = clipped or default_chunks(shape)
    nbytes = channels * int(np.prod(chunks)) * np.dtype(dtype).itemsize
    if nbytes > CHUNK_LIMIT_BYTES:
        raise ValueError(
            f"chunks {chunks} of {channels} {dtype} channel{'s' * (channels != 1)} take "
            f"{nbytes:,} bytes each, more than the {CHUNK_LIMIT_BYTES:,} a chunk may encode "
            "to; choose smaller chunks"
        )
    return chunks


def _clip(chunks: Triple, shape: Triple) -> Triple:
    z, y, x = (min(c, n) for c, n in zip(chunks, shape, strict=True))
    return (z, y, x)


def check_existing_output(path: str, shape: tuple[int, ...], dtype: str,
                          labels: str | None = None, *, ctx: StoreContext) -> Triple | None:
    """Spatial chunks of an existing compatible output, None when there is none; else
    ValueError. `labels` (a --labels job's): a precomputed output is of type segmentation."""
    if driver_of(path) is not None:
        return existing_chunks(path, shape, dtype, ctx=ctx,
                               volume_type="image" if labels is None else "segmentation")
    if not is_url(path) and Path(path).exists() and not Path(path).is_dir():
        raise ValueError(f"output {path} exists and is not a directory (a Zarr array)")
    if not holds_anything(path, ctx=ctx):
        return None
    arr = open_zarr_array(output_array_path(path, ctx=ctx), "existing output", ctx=ctx)
    found = tuple(int(s) for s in arr.shape)
    if found != shape:
        raise ValueError(
            f"existing output {path} has shape {found}, expected {shape}; "
            "remove it or choose another output path"
        )
    if np.dtype(arr.dtype) != np.dtype(dtype):
        raise ValueError(
            f"existing output {path} has dtype {arr.dtype}, expected {dtype}; "
            "remove it or choose another output path"
        )
    chunks = tuple(int(c) for c in arr.chunks)
    return (chunks[1], chunks[2], chunks[3])


def output_compressors(dtype: str) -> Any:
    """float32 outputs: Blosc LZ4 with byte shuffle; uint8 ones: zarr's default (zstd).

    Network outputs in float32 barely compress (BasicUNet's: 1.08x by zstd, 1.07x by this),
    and zstd's 412 MB/s encode took 0.1-0.25 CPU s a run from the cores the compute needs
    (benchmarks/volume.py: 67 MB of output); LZ4 encodes at 862 MB/s and decodes at 5.4 GB/s
    (2 x 64^3 chunk, one thread, CI kind, 2026-11-23). Rounded to uint8 the same output
    compresses 1.22x by zstd and not at all by LZ4, so uint8 keeps zstd. Both are read by
    zarr, TensorStore, ome-zarr-py and neuroglancer."""
    if dtype != "float32":
        return "auto"
    from zarr.codecs import BloscCodec

    return (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)


def open_or_create_output(path: str, shape: tuple[int, ...], dtype: str, chunks: Triple, *,
                          ctx: StoreContext) -> Any:
    """The output array, created (format 3, fill 0) when missing; checked when present."""
    import zarr

    if check_existing_output(path, shape, dtype, ctx=ctx) is not None:
        return open_output_array(path, ctx=ctx)
    return zarr.create_array(
        store=zarr_store(path, read_only=False, ctx=ctx),
        shape=shape,
        chunks=(shape[0], *chunks),
        dtype=dtype,
        fill_value=0,
        zarr_format=3,
        compressors=output_compressors(dtype),
        dimension_names=("c", "z", "y", "x"),
        overwrite=True,
    )


def open_output_array(path: str, *, ctx: StoreContext) -> Any:
    """An existing output array (level 0 of an image: its array's path), for writing."""
    import zarr

    if driver_of(path) is not None:
        return open_volume(path, "output", ctx=ctx, write=True)
    if is_url(path):
        return url_array(path, "r+", ctx=ctx)
    return zarr.open_array(store=zarr_store(path, read_only=False, ctx=ctx), mode="r+")


def encode_output(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 network output -> stored dtype; uint8 stores round(clip(x, 0, 1) * 255)."""
    if dtype == "uint8":
        return np.rint(np.clip(values, 0.0, 1.0) * 255.0).astype(np.uint8)
    return values.astype(np.float32, copy=False)


def write_box(array: Any, box: Box, values: np.ndarray) -> None:
    """Write (C, *box.shape) values to the output array at `box`."""
    array[(slice(None), *box.slices())] = values


def write_block(array: Any | None, path: str, box: Box, values: np.ndarray, *,
                ctx: StoreContext) -> Any:
    """`write_box` into `array`, or into the output at `path` opened first when `array` is
    None (a worker opens its output at its first write, so `segment` can start reading the
    first block's input while it still creates the output); returns the array written."""
    try:
        if array is None:
            array = open_output_array(path, ctx=ctx)
        write_box(array, box, values)
    except (OSError, RuntimeError) as e:  # a full disk, a refusal, a gone store: named
        raise write_fault(e, path, box.key()) from e
    return array
