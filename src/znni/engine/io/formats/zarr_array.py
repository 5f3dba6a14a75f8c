"""A plain Zarr array (format 2 or 3): (z, y, x) or (c, z, y, x) in, (c, z, y, x) out.

An output is created as format 3, fill 0, `dimension_names` c, z, y, x, with the engine's
codecs (`zarr_arrays.output_compressors`); its provenance is the array's `znni` attribute.
An array that is one level of an OME-Zarr image is read as that image's level
(`ome_zarr.py`), with the image's axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from znni.engine.context import StoreContext
from znni.engine.geometry import Triple
from znni.engine.io.formats.base import (
    PROVENANCE_ATTR,
    InputVolume,
    OutputArrays,
    OutputRequest,
    Shape4,
    VolumeFormat,
    fitting_chunks,
    plain_input,
)
from znni.engine.io.ome import find_ome
from znni.engine.io.stores import check_readable, holds_anything, zarr_store
from znni.engine.io.zarr_arrays import (
    DIMENSIONS,
    open_zarr_array,
    open_zarr_for_writing,
    output_compressors,
)
from znni.engine.location import Location

if TYPE_CHECKING:
    from znni.engine.io.pyramid import Factors



class ZarrArray(VolumeFormat):
    name = "zarr"

    def open_input(self, loc: Location, in_channels: int, *, ctx: StoreContext) -> InputVolume:
        from znni.engine.io.formats.ome_zarr import ome_input

        check_readable(loc, "input", ctx=ctx)
        ome = find_ome(loc, ctx=ctx) if loc.is_remote or Path(loc.url).is_dir() else None
        if ome is not None:  # one level's array of an image: the image's axes
            return ome_input(loc, ome, in_channels, ctx=ctx)
        return plain_input(loc, open_zarr_array(loc, "input", ctx=ctx), in_channels)

    def open_level0(self, loc: Location, what: str, *, ctx: StoreContext) -> Any:
        return open_zarr_array(loc, what, ctx=ctx)

    def check_existing(self, loc: Location, shape: Shape4, dtype: str, labels: str | None, *,
                       ctx: StoreContext) -> Triple | None:
        if loc.is_local and Path(loc.url).exists() and not Path(loc.url).is_dir():
            raise ValueError(f"output {loc} exists and is not a directory (a Zarr array)")
        if not holds_anything(loc, ctx=ctx):
            return None
        arr = open_zarr_array(loc, "existing output", ctx=ctx)
        return fitting_chunks(loc, arr, shape, dtype)

    def pyramid(self, loc: Location, source: InputVolume, shape: Shape4, dtype: str,
                levels: int | None, *, exists: bool, check: bool,
                ctx: StoreContext) -> Factors:
        if levels:
            raise ValueError("--pyramid applies to OME-Zarr outputs (--output-format ome-zarr) "
                             "and precomputed:// ones")
        return []

    def create_or_open(self, loc: Location, request: OutputRequest, *,
                       ctx: StoreContext) -> OutputArrays:
        if self.check_existing(loc, request.shape, request.dtype, request.labels,
                               ctx=ctx) is not None:
            array = open_zarr_for_writing(loc, ctx=ctx)
        else:
            array = create_zarr_array(loc, request.shape, request.dtype, request.chunks,
                                      ctx=ctx)
        array.attrs.update({PROVENANCE_ATTR: request.provenance})
        return OutputArrays(array, loc)

    def open_for_writing(self, loc: Location, *, ctx: StoreContext) -> Any:
        return open_zarr_for_writing(loc, ctx=ctx)

    def holds_data(self, loc: Location, *, ctx: StoreContext) -> bool:
        return holds_anything(loc, ctx=ctx)


def create_zarr_array(loc: Location, shape: Shape4, dtype: str, chunks: Triple, *,
                      ctx: StoreContext, compressors: Any = None) -> Any:
    """A new (c, z, y, x) output array: format 3, fill 0, one chunk across the channels;
    `compressors`: zarr's (None: `output_compressors(dtype)`)."""
    import zarr

    return zarr.create_array(
        store=zarr_store(loc, read_only=False, ctx=ctx),
        shape=shape,
        chunks=(shape[0], *chunks),
        dtype=dtype,
        fill_value=0,
        zarr_format=3,
        compressors=output_compressors(dtype) if compressors is None else compressors,
        dimension_names=DIMENSIONS,
        overwrite=True,
    )
