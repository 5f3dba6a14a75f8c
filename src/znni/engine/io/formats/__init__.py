"""Volume formats behind one interface (`base.VolumeFormat`), one module each, and the
registry that says which format a `Location` is.

A precomputed:// or n5:// location names its format; any other location is a Zarr array,
or an OME-Zarr image where it is a Zarr group. A new format is a module here and a line in
`FORMATS` (docs/architecture.md shows one).
"""

from __future__ import annotations

from znni.engine.context import StoreContext
from znni.engine.io.formats.base import InputVolume, OutputArrays, OutputRequest, VolumeFormat
from znni.engine.io.formats.n5 import N5Dataset
from znni.engine.io.formats.ome_zarr import OmeZarrImage
from znni.engine.io.formats.precomputed import PrecomputedVolume
from znni.engine.io.formats.zarr_array import ZarrArray
from znni.engine.io.ome import is_group
from znni.engine.location import Location

FORMATS: dict[str, VolumeFormat] = {
    f.name: f for f in (ZarrArray(), OmeZarrImage(), PrecomputedVolume(), N5Dataset())
}
# what --output-format may name (a precomputed output is named by its location's prefix)
OUTPUT_FORMATS = ("zarr", "ome-zarr")

__all__ = ["FORMATS", "OUTPUT_FORMATS", "InputVolume", "OutputArrays", "OutputRequest",
           "VolumeFormat", "format_of", "existing_format"]


def format_of(loc: Location, *, ctx: StoreContext) -> VolumeFormat:
    """The format of the volume at `loc`: its driver's, else OME-Zarr for a Zarr group,
    else a Zarr array (also for a location that holds nothing yet)."""
    if loc.is_tensorstore:
        return FORMATS[loc.driver]
    return FORMATS["ome-zarr"] if is_group(loc, ctx=ctx) else FORMATS["zarr"]


def existing_format(loc: Location, *, ctx: StoreContext) -> VolumeFormat | None:
    """The format of what is at `loc`, None when nothing is there."""
    fmt = format_of(loc, ctx=ctx) if loc.is_tensorstore else None
    if fmt is not None:
        return fmt if fmt.holds_data(loc, ctx=ctx) else None
    from znni.engine.io.stores import holds_anything

    if not holds_anything(loc, ctx=ctx):
        return None
    return format_of(loc, ctx=ctx)
