"""Neuroglancer links: a viewer state showing a job's input and output, as a URL.

`view_state` reads each volume's metadata (a precomputed `info`, an OME-Zarr image's
multiscales, a Zarr array's shape) to name its layer type (an output of precomputed type
`segmentation`, or an NGFF labels image, is a segmentation layer), the voxel size of the
display (nm, x, y, z) and where to look (the output's centre). `job_viewer_url` builds the
link from the paths alone, without reading anything (the server's job poll, cached per
row); neuroglancer then takes the voxel sizes from the sources themselves. Neuroglancer
spells sources `precomputed://URL`, `zarr2://URL`, `zarr3://URL`, `zarr://URL` (either)
and `n5://URL`; it reads s3://, gs:// and http(s):// URLs, so a local path is given as the
http://127.0.0.1 URL that `znni view --serve` serves it under (`served`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.io.ome import find_ome, group_attrs, is_group
from znni.engine.io.precomputed import UNIT_NM, read_info, scale_of
from znni.engine.io.stores import read_bytes
from znni.engine.io.zarr_arrays import open_zarr_array
from znni.engine.location import Location

NEUROGLANCER = "https://neuroglancer-demo.appspot.com"
VIEWABLE = ("s3", "gs", "http", "https")  # the locations neuroglancer reads itself
Xyz = tuple[float, float, float]


@dataclass(frozen=True)
class Layer:
    """One volume as a neuroglancer layer, and what it says about the display."""

    name: str
    source: str
    kind: str  # "image" | "segmentation"
    resolution: Xyz | None = None  # nm per voxel (x, y, z), where the metadata gives it
    centre: Xyz | None = None  # voxels (x, y, z), in the volume's own coordinates

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "source": self.source, "name": self.name}


def viewable(path: Location) -> bool:
    """Whether neuroglancer can read the volume at `path` from where it is."""
    return path.scheme in VIEWABLE


def source_url(path: Location, served: str | None = None, zarr: str = "zarr") -> str:
    """The neuroglancer source of a volume: its driver, then its URL (`served`: the http URL
    a local volume is served under). `zarr` spells a Zarr source: zarr, zarr2 or zarr3."""
    location = served or path.bare().url.rstrip("/")
    return f"{path.driver if path.is_tensorstore else zarr}://{location}"


def viewer_state(layers: list[Layer]) -> dict[str, Any]:
    """The JSON state: the layers in order, the display's voxel size and position from the
    last layer that gives them (the output)."""
    state: dict[str, Any] = {"layers": [layer.to_json() for layer in layers],
                             "layout": "4panel"}
    sized = [layer for layer in layers if layer.resolution is not None]
    if sized:
        res = sized[-1].resolution
        assert res is not None
        state["dimensions"] = {a: [r * 1e-9, "m"] for a, r in zip("xyz", res, strict=True)}
    placed = [layer.centre for layer in layers if layer.centre is not None]
    if placed:
        state["position"] = list(placed[-1])
    if layers:
        state["selectedLayer"] = {"layer": layers[-1].name, "visible": True}
    return state


ID_DTYPES = (np.dtype("uint32"), np.dtype("uint64"), np.dtype("int64"))


def viewer_url(state: dict[str, Any]) -> str:
    """The neuroglancer link that opens `state`."""
    return f"{NEUROGLANCER}/#!{quote(json.dumps(state, separators=(',', ':')), safe='')}"


def job_viewer_url(input_path: Location, output_path: Location, labels: bool = False) -> str | None:
    """The link of a job whose volumes neuroglancer can read (s3://, gs://, https://), from
    the paths alone; None when either is a local path."""
    if not (viewable(input_path) and viewable(output_path)):
        return None
    kind = "segmentation" if labels else "image"
    return viewer_url(viewer_state([Layer("input", source_url(input_path), "image"),
                                    Layer("output", source_url(output_path), kind)]))


def describe(path: Location, name: str, *, ctx: StoreContext,
             served: str | None = None) -> Layer:
    """A volume as a layer, from its metadata (ValueError where it cannot be read)."""
    driver = path.driver
    if driver == "precomputed":
        info = read_info(path, name, ctx=ctx)
        if info is None:
            raise ValueError(f"{name} {path} has no info file (not a neuroglancer precomputed "
                             "volume)")
        scale = scale_of(info, path, name)
        rx, ry, rz = (float(r) for r in scale["resolution"])
        size = [int(n) for n in scale["size"]]
        offset = [int(o) for o in scale.get("voxel_offset", (0, 0, 0))]
        kind = "segmentation" if info.get("type") == "segmentation" else "image"
        centre = (offset[0] + size[0] / 2, offset[1] + size[1] / 2, offset[2] + size[2] / 2)
        return Layer(name, source_url(path, served), kind, (rx, ry, rz), centre)
    if driver == "n5":
        return Layer(name, source_url(path, served), "image")
    return _describe_zarr(path, name, ctx, served)


def _describe_zarr(path: Location, name: str, ctx: StoreContext, served: str | None) -> Layer:
    """A Zarr array or OME-Zarr image: zarr3 or zarr2 by its metadata, its voxel size (nm)
    and offset from the OME metadata where there is some."""
    zarr = "zarr3" if read_bytes(path.join("zarr.json"), ctx=ctx) is not None else "zarr2"
    ome = find_ome(path, ctx=ctx) if path.is_remote or Path(path.url).is_dir() else None
    array = open_zarr_array(ome.array_location if ome else path, name, ctx=ctx)
    sz, sy, sx = (int(n) for n in array.shape[-3:])
    if ome is None:  # 32- and 64-bit integers are ids (znni agglomerate writes uint64)
        kind = "segmentation" if np.dtype(array.dtype) in ID_DTYPES else "image"
        return Layer(name, source_url(path, served, zarr), kind, None, (sx / 2, sy / 2, sz / 2))
    nm = [s * UNIT_NM.get(u or "", 1.0) for s, u in zip(ome.scale, ome.units, strict=True)]
    at = [t / s if s else 0.0 for t, s in zip(ome.translation, ome.scale, strict=True)]
    group = ome.group_location
    attrs = group_attrs(group, ctx=ctx) if is_group(group, ctx=ctx) else {}
    labels = "image-label" in attrs.get("ome", attrs)  # NGFF 0.5 under "ome", 0.4 at the top
    labels = labels or np.dtype(array.dtype) in ID_DTYPES  # e.g. an image naming labels/NAME
    return Layer(name, source_url(group if served is None else path, served, zarr),
                 "segmentation" if labels else "image", (nm[2], nm[1], nm[0]),
                 (at[2] + sx / 2, at[1] + sy / 2, at[0] + sz / 2))


def view_state(output: Location, input_path: Location | None = None, *, ctx: StoreContext,
               served: dict[Location, str] | None = None) -> dict[str, Any]:
    """The state showing `input_path` (an image layer) under `output`; `served` maps a
    local path to the http URL it is served under."""
    served = served or {}
    layers = [] if input_path is None else [
        describe(input_path, "input", ctx=ctx, served=served.get(input_path))]
    layers.append(describe(output, "output", ctx=ctx, served=served.get(output)))
    return viewer_state(layers)
