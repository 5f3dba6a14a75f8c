"""Any volume znni writes or reads, opened for reading by its path's driver: a Zarr array
(an OME-Zarr image's level 0), or a `precomputed://` or `n5://` volume through
TensorStore (shown as (c, z, y, x), its provenance in `attrs` as a Zarr array's). For
the tools that read results back (`znni preview`, the dashboard's block map)."""

from __future__ import annotations

from typing import Any

from znni.engine.context import StoreContext
from znni.engine.io.precomputed import open_volume
from znni.engine.io.stores import driver_of
from znni.engine.io.volume import open_zarr_array, output_array_path


def open_array(path: str, what: str, *, ctx: StoreContext) -> Any:
    """The array at `path` itself (no OME lookup); ValueError naming `what` if unreadable."""
    if driver_of(path) is not None:
        return open_volume(path, what, ctx=ctx)
    return open_zarr_array(path, what, ctx=ctx)


def open_output_level0(path: str, *, ctx: StoreContext) -> Any:
    """An output's level 0: the precomputed or N5 volume, the Zarr array, or an OME-Zarr
    image's level-0 array."""
    if driver_of(path) is not None:
        return open_volume(path, "output", ctx=ctx)
    return open_zarr_array(output_array_path(path, ctx=ctx), "output", ctx=ctx)
