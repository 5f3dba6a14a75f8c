"""An OME-Zarr image (NGFF 0.4 on format 2, 0.5 on format 3): read at its level 0 (or the
level `--level` names), written as an NGFF 0.5 image group with arrays `0`..`K` of
(c, z, y, x) and the input level's voxel size, offset and units. A `--labels` output is an
NGFF label image `labels/NAME` whose levels the image's own multiscales name. The
metadata itself is read and written by `io/ome.py`; the provenance is the group's `znni`
attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.geometry import Triple
from znni.engine.io.formats.base import (
    PROVENANCE_ATTR,
    InputVolume,
    OutputArrays,
    OutputRequest,
    Shape4,
    VolumeFormat,
    check_input_dtype,
    fitting_chunks,
)
from znni.engine.io.ome import OmeLevel, find_ome, group_attrs, ome_level, output_metadata
from znni.engine.io.precomputed import output_geometry
from znni.engine.io.pyramid import cumulative, level_shapes, level_steps
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



class OmeZarrImage(VolumeFormat):
    name = "ome-zarr"

    def open_input(self, loc: Location, in_channels: int, *, ctx: StoreContext) -> InputVolume:
        check_readable(loc, "input", ctx=ctx)
        ome = find_ome(loc, ctx=ctx)
        if ome is None:
            raise ValueError(f"input {loc} is not an OME-Zarr image")
        return ome_input(loc, ome, in_channels, ctx=ctx)

    def open_level0(self, loc: Location, what: str, *, ctx: StoreContext) -> Any:
        return open_zarr_array(level0_location(loc, ctx=ctx), what, ctx=ctx)

    def check_existing(self, loc: Location, shape: Shape4, dtype: str, labels: str | None, *,
                       ctx: StoreContext) -> Triple | None:
        if not holds_anything(loc, ctx=ctx):
            return None
        arr = open_zarr_array(level0_location(loc, ctx=ctx), "existing output", ctx=ctx)
        return fitting_chunks(loc, arr, shape, dtype)

    def pyramid(self, loc: Location, source: InputVolume, shape: Shape4, dtype: str,
                levels: int | None, *, exists: bool, check: bool,
                ctx: StoreContext) -> Factors:
        """--pyramid levels, else an existing image's depth, else down to <= 256 voxels."""
        attrs = group_attrs(loc, ctx=ctx) if exists else {}  # read once
        if levels is None and exists:
            levels = ome_level(loc, 0, attrs, ctx=ctx).levels - 1
        described = source_level(source)
        voxel = described.scale if described is not None else (1.0, 1.0, 1.0)
        steps = level_steps(source.shape, voxel, levels)
        if exists and check:
            _check_levels(loc, shape, dtype, steps, attrs, ctx)
        return steps

    def create_or_open(self, loc: Location, request: OutputRequest, *,
                       ctx: StoreContext) -> OutputArrays:
        import zarr

        if holds_anything(loc, ctx=ctx):
            group = zarr.open_group(store=zarr_store(loc, read_only=False, ctx=ctx), mode="r+")
            attrs = group.attrs.asdict()
            where = [ome_level(loc, k, attrs, ctx=ctx).array_location
                     for k in range(len(request.steps) + 1)]
            group.attrs.update({PROVENANCE_ATTR: request.provenance})
            arrays = [open_zarr_for_writing(w, ctx=ctx) for w in where]
            return OutputArrays(arrays[0], where[0], arrays[1:])
        return _create_image(loc, request, ctx)

    def open_for_writing(self, loc: Location, *, ctx: StoreContext) -> Any:
        return open_zarr_for_writing(loc, ctx=ctx)

    def holds_data(self, loc: Location, *, ctx: StoreContext) -> bool:
        return holds_anything(loc, ctx=ctx)


def level0_location(loc: Location, *, ctx: StoreContext) -> Location:
    """The array that holds an image's level 0."""
    try:
        return ome_level(loc, 0, ctx=ctx).array_location
    except ValueError as e:
        raise ValueError(
            f"existing output {loc} is a Zarr group but not an OME-Zarr image ({e})"
        ) from e


def ome_input(loc: Location, ome: OmeLevel, in_channels: int, *,
              ctx: StoreContext) -> InputVolume:
    """An OME-Zarr level read as an input: its axes say which dimension is the channel axis."""
    arr = open_zarr_array(ome.array_location, "input", ctx=ctx)
    shape = tuple(int(s) for s in arr.shape)
    check_input_dtype(loc, np.dtype(arr.dtype))
    if len(shape) != len(ome.axis_names):
        raise ValueError(
            f"input {loc} has {len(ome.axis_names)} axes {list(ome.axis_names)} but its level "
            f"{ome.level} array has {len(shape)} dimensions {shape}"
        )
    channels = shape[0] if ome.has_channel_axis else 1
    if channels != in_channels:
        raise ValueError(
            f"input {loc} has {channels} channels (shape {shape}) but the network expects "
            f"{in_channels}"
        )
    spatial = (shape[-3], shape[-2], shape[-1])
    return InputVolume(loc, arr, channels, spatial, np.dtype(arr.dtype), ome.has_channel_axis,
                       ome)


def source_level(volume: InputVolume) -> OmeLevel | None:
    """The input's level as an OME-Zarr output describes its voxels: an OME-Zarr input's
    own; a precomputed input's scale, in nanometres, at its voxel offset; else None (unit
    voxels at 0)."""
    if volume.ome is not None:
        return volume.ome
    if volume.path.driver != "precomputed":
        return None
    (rx, ry, rz), (ox, oy, oz) = output_geometry(volume.array, None)  # (x, y, z)
    return OmeLevel(volume.path, volume.path, 0, 1, "0.5", True, ("c", "z", "y", "x"),
                    ("nanometer",) * 3, (rz, ry, rx), (oz * rz, oy * ry, ox * rx))


def _check_levels(loc: Location, shape: Shape4, dtype: str, steps: Factors,
                  attrs: dict[str, Any], ctx: StoreContext) -> None:
    """An existing OME-Zarr output (whose group attributes are `attrs`) must hold exactly the
    levels this run would write."""
    import zarr

    first = ome_level(loc, 0, attrs, ctx=ctx)
    if first.levels != len(steps) + 1:
        raise ValueError(
            f"existing output {loc} has {first.levels - 1} pyramid levels, this run writes "
            f"{len(steps)}; give --pyramid {first.levels - 1}, remove it or choose another path"
        )
    for k, level_shape in enumerate(level_shapes((shape[1], shape[2], shape[3]), steps)):
        where = ome_level(loc, k, attrs, ctx=ctx).array_location
        try:
            arr = zarr.open_array(store=zarr_store(where, read_only=True, ctx=ctx), mode="r")
        except Exception as e:  # zarr raises several unrelated types for "not an array"
            raise ValueError(f"existing output {loc} has no level {k} array ({e})") from e
        want = (shape[0], *level_shape)
        if tuple(arr.shape) != want or np.dtype(arr.dtype) != np.dtype(dtype):
            raise ValueError(
                f"existing output {loc} level {k} is {tuple(arr.shape)} {arr.dtype}, expected "
                f"{want} {dtype}; remove it or choose another output path"
            )


def _create_image(loc: Location, request: OutputRequest, ctx: StoreContext) -> OutputArrays:
    """A new NGFF 0.5 image group with its level arrays (the label image's, for labels)."""
    import zarr

    meta = output_metadata(cumulative(request.steps), source_level(request.source), loc.name)
    if request.channel_names and request.labels is None:
        meta["omero"] = {"channels": [{"label": str(n), "active": True}
                                      for n in request.channel_names]}
    home, root_meta = labels_layout(request.labels, meta)
    group = zarr.create_group(store=zarr_store(loc, read_only=False, ctx=ctx), zarr_format=3,
                              overwrite=True,
                              attributes={"ome": root_meta, PROVENANCE_ATTR: request.provenance})
    levels_group = group
    for name, attrs in home:  # --labels: labels/NAME, the NGFF label image
        levels_group = levels_group.create_group(name, attributes={"ome": attrs})
    arrays, dtype, c = [], request.dtype, request.shape[0]
    spatial = (request.shape[1], request.shape[2], request.shape[3])
    for k, shape in enumerate(level_shapes(spatial, request.steps)):
        level_chunks = tuple(min(n, m) for n, m in zip(request.chunks, shape, strict=True))
        arrays.append(levels_group.create_array(
            str(k), shape=(c, *shape), chunks=(c, *level_chunks), dtype=dtype, fill_value=0,
            dimension_names=DIMENSIONS, compressors=output_compressors(dtype),
        ))
    level0 = ome_level(loc, 0, {"ome": root_meta}, ctx=ctx).array_location
    return OutputArrays(arrays[0], level0, arrays[1:])


def labels_layout(labels: str | None, meta: dict[str, Any]
                  ) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """(the groups from the image down to its level arrays, each with its `ome` attributes;
    the image's own `ome`) for an OME-Zarr output's NGFF metadata `meta`. Labels live in the
    NGFF label image `labels/NAME` (`image-label` metadata, its levels `0`..`K`), and the
    image's own multiscales name those same arrays (`labels/NAME/k`), so a reader of the
    image, znni's resume and `znni preview` find level 0 where they always do. `labels`:
    the label image's name."""
    if labels is None:
        return [], meta
    image_label = {"version": "0.5", "source": {"image": "../../"}}
    scales = [{**ms, "datasets": [{**d, "path": f"labels/{labels}/{d['path']}"}
                                  for d in ms["datasets"]]} for ms in meta["multiscales"]]
    return ([("labels", {"version": "0.5", "labels": [labels]}),
             (labels, {**meta, "image-label": image_label})],
            {**meta, "multiscales": scales})
