"""A store's write and read bandwidth, measured through the engine's own zarr path
(`znni plan --measure-store URL`): a scratch array of random float32 (incompressible)
in chunks, created and written as an output is (formats/zarr_array.create_zarr_array,
Blosc LZ4, block writes of whole chunks that zarr sends concurrently), then opened anew
and read back whole slabs at a time, then removed. One client's rates: an object store's
aggregate over many nodes is usually higher, and a local path's reads come from the page
cache when the file system kept them."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.location import Location

CHUNK = (64, 128, 128)  # float32: 4 MiB per chunk, as 64^3 chunks of a 4-channel output
MIN_BYTES = CHUNK[0] * CHUNK[1] * CHUNK[2] * 4


def measure_store(where: Location, total_bytes: int, *, ctx: StoreContext) -> dict[str, Any]:
    """Write then read about `total_bytes` under `where` (a directory or URL prefix) in
    CHUNK chunks, a slab of chunks per call; the record of both rates (bytes/s)."""
    from znni.engine.io.formats.zarr_array import create_zarr_array
    from znni.engine.io.stores import remove_tree
    from znni.engine.io.zarr_arrays import url_array

    if total_bytes < MIN_BYTES:
        raise ValueError(f"store measurement size {total_bytes:,} bytes is under one chunk "
                         f"({MIN_BYTES:,} bytes)")
    slab_chunks = max(1, min(16, total_bytes // MIN_BYTES))
    side = int(np.sqrt(slab_chunks))
    ny, nx = side, max(1, slab_chunks // side)
    slabs = max(1, total_bytes // (ny * nx * MIN_BYTES))
    shape = (1, slabs * CHUNK[0], ny * CHUNK[1], nx * CHUNK[2])
    loc = where.join(f"znni-store-speed-{uuid.uuid4().hex[:12]}")
    rng = np.random.default_rng(0)
    slab = rng.random((1, CHUNK[0], shape[2], shape[3]), dtype=np.float32)
    try:
        array = create_zarr_array(loc, shape, "float32", CHUNK, ctx=ctx)
        t0 = time.perf_counter()
        for i in range(slabs):
            slab[0, 0, 0, 0] = i  # each slab its own bytes
            array[:, i * CHUNK[0]:(i + 1) * CHUNK[0]] = slab
        write_s = time.perf_counter() - t0
        fresh = url_array(loc, "r", ctx=ctx) if loc.is_remote else _open_local(loc)
        t1 = time.perf_counter()
        for i in range(slabs):
            fresh[:, i * CHUNK[0]:(i + 1) * CHUNK[0]]
        read_s = time.perf_counter() - t1
    finally:
        remove_tree(loc, ctx=ctx)
    moved = int(np.prod(shape)) * 4
    return {"location": str(where), "bytes": moved, "chunks": slabs * ny * nx,
            "chunk_bytes": MIN_BYTES, "write_s": write_s, "read_s": read_s,
            "write_bytes_per_s": moved / max(write_s, 1e-9),
            "read_bytes_per_s": moved / max(read_s, 1e-9),
            "bytes_per_s": 2 * moved / max(write_s + read_s, 1e-9)}


def _open_local(loc: Location) -> Any:
    import zarr

    return zarr.open_array(loc.url, mode="r")
