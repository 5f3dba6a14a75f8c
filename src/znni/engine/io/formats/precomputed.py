"""A neuroglancer precomputed volume (`precomputed://LOCATION[#mip=N]`), through
TensorStore's own driver (`io/precomputed.py`): read at the scale the location names,
shown as (c, z, y, x); written at scale 0 with the input's resolution and voxel offset, its
pyramid as scales 1..K (`io/precomputed_scales.py`), its provenance in `znni.json` beside
its `info`; a `--labels` output is of type segmentation.
"""

from __future__ import annotations

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
    plain_input,
)
from znni.engine.io.precomputed import (
    check_geometry,
    existing_chunks,
    open_or_create,
    open_volume,
    output_geometry,
)
from znni.engine.io.precomputed_scales import open_scales, pyramid_steps
from znni.engine.location import Location
from znni.triple import as_triple

if TYPE_CHECKING:
    from znni.engine.io.pyramid import Factors



def _volume_type(labels: str | None) -> str:
    return "image" if labels is None else "segmentation"


class PrecomputedVolume(VolumeFormat):
    name = "precomputed"

    def open_input(self, loc: Location, in_channels: int, *, ctx: StoreContext) -> InputVolume:
        return tensorstore_input(loc, in_channels, ctx=ctx)

    def open_level0(self, loc: Location, what: str, *, ctx: StoreContext) -> Any:
        return open_volume(loc, what, ctx=ctx)

    def check_existing(self, loc: Location, shape: Shape4, dtype: str, labels: str | None, *,
                       ctx: StoreContext) -> Triple | None:
        return existing_chunks(loc, shape, dtype, ctx=ctx, volume_type=_volume_type(labels))

    def pyramid(self, loc: Location, source: InputVolume, shape: Shape4, dtype: str,
                levels: int | None, *, exists: bool, check: bool,
                ctx: StoreContext) -> Factors:
        """Scales 1..K: --pyramid, else an existing output's own, else none; the output
        must carry the input's resolution and offset."""
        geometry = output_geometry(source.array, source.ome)
        check_geometry(loc, *geometry, ctx=ctx)
        return pyramid_steps(loc, source.shape, geometry, levels, check, ctx=ctx)

    def create_or_open(self, loc: Location, request: OutputRequest, *,
                       ctx: StoreContext) -> OutputArrays:
        geometry = output_geometry(request.source.array, request.source.ome)
        kind = _volume_type(request.labels)
        array = open_or_create(loc, request.shape, request.dtype, request.chunks, geometry,
                               ctx=ctx, volume_type=kind)
        array.attrs.update({PROVENANCE_ATTR: request.provenance})
        scales = open_scales(loc, request.shape, request.dtype, as_triple(array.chunks[1:]),
                             geometry, request.steps, ctx=ctx, volume_type=kind)
        return OutputArrays(array, loc, list(scales))

    def open_for_writing(self, loc: Location, *, ctx: StoreContext) -> Any:
        return open_volume(loc, "output", ctx=ctx, write=True)


def tensorstore_input(loc: Location, in_channels: int, *, ctx: StoreContext) -> InputVolume:
    """A precomputed or N5 volume opened through TensorStore as an input."""
    return plain_input(loc, open_volume(loc, "input", ctx=ctx), in_channels)
