"""Any volume znni writes or reads, opened read-only in its format (`formats/`) for the
tools that read results back (`znni preview`, the dashboard's block map): a Zarr array, an
OME-Zarr image's level 0, or a `precomputed://` or `n5://` volume through TensorStore
(shown as (c, z, y, x), its provenance in `attrs` as a Zarr array's)."""

from __future__ import annotations

from typing import Any

from znni.engine.context import StoreContext
from znni.engine.io.formats import FORMATS, format_of
from znni.engine.location import Location


def open_array(path: Location, what: str, *, ctx: StoreContext) -> Any:
    """The array at `path` itself (no OME lookup); ValueError naming `what` if unreadable."""
    return FORMATS[path.driver].open_level0(path, what, ctx=ctx)


def open_output_level0(path: Location, *, ctx: StoreContext) -> Any:
    """An output's level 0: the precomputed or N5 volume, the Zarr array, or an OME-Zarr
    image's level-0 array."""
    return format_of(path, ctx=ctx).open_level0(path, "output", ctx=ctx)
