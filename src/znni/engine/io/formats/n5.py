"""An N5 dataset (`n5://LOCATION`), read through TensorStore's `n5` driver as (z, y, x) or
(c, z, y, x); input only: znni writes Zarr, OME-Zarr and precomputed volumes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from znni.engine.context import StoreContext
from znni.engine.geometry import Triple
from znni.engine.io.formats.base import (
    InputVolume,
    OutputArrays,
    OutputRequest,
    Shape4,
    VolumeFormat,
)
from znni.engine.io.formats.precomputed import tensorstore_input
from znni.engine.io.precomputed import open_volume
from znni.engine.location import Location

if TYPE_CHECKING:
    from znni.engine.io.pyramid import Factors


def _read_only(loc: Location) -> NoReturn:
    raise ValueError(f"output {loc} is an N5 dataset; znni reads N5 and writes Zarr or "
                     "precomputed:// volumes")


class N5Dataset(VolumeFormat):
    name = "n5"
    writable = False

    def open_input(self, loc: Location, in_channels: int, *, ctx: StoreContext) -> InputVolume:
        return tensorstore_input(loc, in_channels, ctx=ctx)

    def open_level0(self, loc: Location, what: str, *, ctx: StoreContext) -> Any:
        return open_volume(loc, what, ctx=ctx)

    def check_existing(self, loc: Location, shape: Shape4, dtype: str, labels: str | None, *,
                       ctx: StoreContext) -> Triple | None:
        _read_only(loc)

    def pyramid(self, loc: Location, source: InputVolume, shape: Shape4, dtype: str,
                levels: int | None, *, exists: bool, check: bool,
                ctx: StoreContext) -> Factors:
        _read_only(loc)

    def create_or_open(self, loc: Location, request: OutputRequest, *,
                       ctx: StoreContext) -> OutputArrays:
        _read_only(loc)

    def open_for_writing(self, loc: Location, *, ctx: StoreContext) -> Any:
        _read_only(loc)
