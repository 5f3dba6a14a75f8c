"""Zarr arrays through zarr-python: opened (cached by their metadata bytes), created with the
engine's codecs, opened for writing. The Zarr and OME-Zarr formats (`formats/`) share these.
Every refusal is a ValueError naming the location and the offending values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
from pathlib import Path
from typing import Any, cast

from znni.engine.context import OPEN_CACHE_ENTRIES, StoreContext
from znni.engine.io.stores import StoreError, is_refusal, read_bytes, refusal, zarr_store
from znni.engine.location import Location

METADATA_FILES = ("zarr.json", ".zarray", ".zattrs")  # all an opened array's fields come from
DIMENSIONS = ("c", "z", "y", "x")
SETTLE_S = 5.0  # at most this long for abandoned zarr tasks to take their cancellation


def import_zarr() -> None:
    """Import zarr now: it is imported lazily, so a long-lived process (the server) can
    pay that cost at startup instead of inside its first request."""
    import zarr  # noqa: F401


def open_zarr_array(path: Location, what: str, *, ctx: StoreContext) -> Any:
    """Open an existing Zarr array read-only, or raise ValueError saying why not.

    An opened array is kept in the context's caches and reused while its metadata files
    hold the same bytes: zarr's
    open costs ~0.4 ms of CPU and several hops through its I/O threads, which a
    server validating many submissions of one volume pays per request, while reading
    the metadata files to compare takes ~0.02 ms. Comparing the bytes (not mtimes,
    which the kernel stamps at a few ms resolution) makes any rewrite a miss.
    """
    import zarr

    if path.is_remote:
        return _open_url_array(path, what, ctx)
    p = Path(path.url)
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


def _open_url_array(url: Location, what: str, ctx: StoreContext) -> Any:
    """An array at a URL, read-only (not cached: its metadata is a request away)."""
    if all(read_bytes(url.join(n), what, ctx=ctx) is None for n in METADATA_FILES[:2]):
        raise ValueError(f"{what} {url} does not exist (no zarr.json or .zarray there)")
    try:
        return url_array(url, "r", ctx=ctx)
    except StoreError:
        raise
    except Exception as e:  # zarr raises several unrelated types for "not an array"
        if is_refusal(e):
            raise refusal(e, url, what, ctx=ctx) from e
        raise ValueError(f"{what} {url} is not a Zarr array ({type(e).__name__}: {e})") from e


def url_array(url: Location, mode: str, *, ctx: StoreContext) -> Any:
    """zarr.open_array of the array at a URL. A format 3 array is built from its
    `zarr.json` as `read_bytes` gives it (remembered within a run's setup, `memo.py`)
    instead of zarr asking the store for zarr.json, .zarray and .zattrs again; anything
    else (format 2, a group, unreadable JSON) goes through zarr's own open."""
    import zarr

    store = zarr_store(url, read_only=mode == "r", ctx=ctx)
    meta = _json_object(read_bytes(url.join(METADATA_FILES[0]), ctx=ctx))
    if meta.get("zarr_format") == 3 and meta.get("node_type") == "array":
        from zarr.core.array import AsyncArray
        from zarr.storage import StorePath

        try:
            return zarr.Array(AsyncArray(cast(Any, meta), StorePath(store)))  # checked by zarr
        except Exception:  # zarr's own open says what is wrong with it
            pass
    return zarr.open_array(store=store, mode=mode)


def open_zarr_for_writing(path: Location, *, ctx: StoreContext) -> Any:
    """An existing Zarr array opened read-write (a block writer's output)."""
    import zarr

    if path.is_remote:
        return url_array(path, "r+", ctx=ctx)
    return zarr.open_array(store=zarr_store(path, read_only=False, ctx=ctx), mode="r+")


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


def settle_zarr_io(timeout_s: float = SETTLE_S) -> None:
    """End the work still running in zarr's event loop after a failed read or write, before
    the process exits.

    zarr reads and writes a selection as one task per chunk (and per stage: encode, then
    store) under `asyncio.gather`, which returns at the first failure: a full disk or a
    corrupt chunk leaves the other chunks' tasks running, each starting its next stage's
    tasks. At exit zarr's handler (`zarr.core.sync.cleanup_resources`) stops the loop under
    them and closes it: a task made but not yet stepped is dropped with its coroutine,
    which prints `RuntimeWarning: coroutine 'concurrent_map.<locals>.run' was never
    awaited` after the run's one sentence. Here every other task is cancelled and waited
    for, with those they start meanwhile, for at most `timeout_s`. Nothing to do when zarr
    was never imported or its loop never started."""
    zsync = sys.modules.get("zarr.core.sync")
    loop = zsync.loop[0] if zsync is not None else None
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed() \
            or not loop.is_running():
        return
    done = asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), loop)
    try:
        done.result(timeout_s)
    except concurrent.futures.TimeoutError:  # a task that ignores its cancellation
        done.cancel()


async def _cancel_other_tasks() -> None:
    """Cancel every task of the running loop but this one, and wait until they have ended,
    again for tasks started meanwhile."""
    me = asyncio.current_task()
    while left := [t for t in asyncio.all_tasks() if t is not me]:
        for task in left:
            task.cancel()
        await asyncio.wait(left)
