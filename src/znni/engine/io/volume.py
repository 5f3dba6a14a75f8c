"""Volumes as the engine uses them, whatever their format (`formats/`): an input opened
and checked against the network, an output checked or opened for block writes, the
output's chunks chosen, block values encoded and written.

Input: (z, y, x) when the network has one input channel or (c, z, y, x); integer or
float. Output: (c, z, y, x). Every refusal is a ValueError naming the location and the
offending values.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.geometry import Box, Triple
from znni.engine.io.chunk_cache import ChunkCache, ChunkedReader
from znni.engine.io.faults import write_fault
from znni.engine.io.formats import InputVolume, format_of
from znni.engine.io.formats.base import Shape4
from znni.engine.io.stores import check_readable
from znni.engine.location import Location

DEFAULT_CHUNK = 64


def open_input(path: Location, in_channels: int, cache_bytes: int = 0, *,
               ctx: StoreContext) -> InputVolume:
    """Open the input volume in its format (`formats.format_of`) and check it against the
    network's input channels. With `cache_bytes` > 0, reads keep up to that many bytes of
    decoded chunks for later reads (block workers: neighbouring blocks' halos share
    chunks)."""
    if path.is_remote and not path.is_tensorstore:  # a refused or missing bucket: named
        check_readable(path, "input", ctx=ctx)     # as the input, before any lookup
    volume = format_of(path, ctx=ctx).open_input(path, in_channels, ctx=ctx)
    if cache_bytes <= 0:
        return volume
    reader = ChunkedReader(volume.array, volume.has_channel_axis, ChunkCache(cache_bytes),
                           volume.array_location, volume.bad_chunks)
    return replace(volume, reader=reader)


def default_chunks(shape: Triple) -> Triple:
    """Engine-chosen output chunks: 64 per axis, clipped to the volume."""
    z, y, x = (min(DEFAULT_CHUNK, n) for n in shape)
    return (z, y, x)


# numcodecs' Blosc encodes at most 2**31 - 1 bytes, and every chunk is encoded whole
CHUNK_LIMIT_BYTES = 2**31 - 1


def output_chunks(
    requested: Triple | None, existing: Triple | None, shape: Triple, channels: int,
    dtype: str, where: str,
) -> Triple:
    """The output's spatial chunks: an existing output's own, else `requested` (--chunks)
    clipped to the volume (past it a chunk holds only fill), else `default_chunks`.
    ValueError for chunks that differ from an existing output's (they cannot change in
    place) or that are too large to encode."""
    clipped = None if requested is None else _clip(requested, shape)
    if existing is not None:
        if clipped is not None and clipped != _clip(existing, shape):
            raise ValueError(
                f"chunks {clipped} differ from those of the existing output {where}, "
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


def check_existing_output(path: Location, shape: Shape4, dtype: str,
                          labels: str | None = None, *, ctx: StoreContext) -> Triple | None:
    """Spatial chunks of an existing compatible output, None when there is none; else
    ValueError. `labels` (a --labels job's): a precomputed output is of type segmentation."""
    return format_of(path, ctx=ctx).check_existing(path, shape, dtype, labels, ctx=ctx)


def open_output_array(path: Location, *, ctx: StoreContext) -> Any:
    """An existing output's level-0 array (`OutputArrays.level0_location`) for writing."""
    return format_of(path, ctx=ctx).open_for_writing(path, ctx=ctx)


def encode_output(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 network output -> stored dtype; uint8 stores round(clip(x, 0, 1) * 255)."""
    if dtype == "uint8":
        return np.rint(np.clip(values, 0.0, 1.0) * 255.0).astype(np.uint8)
    return values.astype(np.float32, copy=False)


def write_box(array: Any, box: Box, values: np.ndarray) -> None:
    """Write (C, *box.shape) values to the output array at `box`."""
    array[(slice(None), *box.slices())] = values


def write_block(array: Any | None, path: Location, box: Box, values: np.ndarray, *,
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
