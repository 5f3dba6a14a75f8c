"""OME-Zarr (NGFF) image metadata: reading an input's multiscales, writing an output's.

Input: an image group of NGFF 0.4 (Zarr format 2, `multiscales` in the attributes) or
0.5 (Zarr format 3, `ome.multiscales`). Its axes map to (c, z, y, x): at most one
channel axis, exactly three space axes (taken in their stored order as z, y, x), no
time or other axes. A level's voxel size and offset are the composition of the
dataset's and the multiscale's `scale` and `translation` transformations.
Output: NGFF 0.5 metadata for axes c, z, y, x (docs/design.md, "Volumes").
Every refusal is a ValueError of one sentence naming the path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from znni.engine.context import StoreContext
from znni.engine.io.stores import StoreError, read_bytes, zarr_store
from znni.engine.location import Location

Float3 = tuple[float, float, float]
Units = tuple[str | None, str | None, str | None]
SUPPORTED_VERSIONS = ("0.4", "0.5")


@dataclass(frozen=True)
class OmeLevel:
    """One resolution level of an OME-Zarr image, as znni reads it."""

    group_location: Location
    array_location: Location  # the level's array directory
    level: int
    levels: int  # datasets in the multiscale
    version: str
    has_channel_axis: bool
    axis_names: tuple[str, ...]  # as stored
    units: Units  # of the (z, y, x) axes; None where the metadata gives none
    scale: Float3  # voxel size (z, y, x) of this level
    translation: Float3  # physical position (z, y, x) of this level's voxel 0


def is_group(loc: Location, *, ctx: StoreContext) -> bool:
    """Whether `loc` is a Zarr group (format 2 or 3): a directory or a URL."""
    if loc.is_local and (Path(loc.url) / ".zgroup").is_file():
        return True
    raw = read_bytes(loc.join("zarr.json"), ctx=ctx)
    if raw is None:
        return loc.is_remote and read_bytes(loc.join(".zgroup"), ctx=ctx) is not None
    try:
        meta = json.loads(raw)
    except ValueError:
        return False
    return isinstance(meta, dict) and meta.get("node_type") == "group"


def _may_be_image(group: Location, ctx: StoreContext) -> bool:
    """Cheap pre-check (no zarr): whether a group's attribute file mentions multiscales."""
    return any(b"multiscales" in (read_bytes(group.join(name), ctx=ctx) or b"")
               for name in ("zarr.json", ".zattrs"))


def group_attrs(path: Location, *, ctx: StoreContext) -> dict[str, Any]:
    """The attributes of the Zarr group at `path` (through zarr)."""
    import zarr

    try:
        store = zarr_store(path, read_only=True, ctx=ctx)
        return dict(zarr.open_group(store=store, mode="r").attrs.asdict())
    except StoreError:
        raise
    except Exception as e:  # zarr raises several unrelated types for a bad group
        raise ValueError(f"{path} is not a readable Zarr group ({type(e).__name__}: {e})") from e


def multiscale(attrs: dict[str, Any], path: Location) -> tuple[str, dict[str, Any]]:
    """(NGFF version, first multiscale) of an image group's attributes; ValueError if none."""
    if isinstance(attrs.get("ome"), dict):
        ome = attrs["ome"]
        version = str(ome.get("version", ""))
        scales = ome.get("multiscales")
    else:
        scales = attrs.get("multiscales")
        first = scales[0] if isinstance(scales, list) and scales else {}
        version = str(first.get("version", "")) if isinstance(first, dict) else ""
    if scales is None:
        kinds = [k for k in ("plate", "well", "labels") if k in attrs or k in attrs.get("ome", {})]
        what = f"an OME-Zarr {kinds[0]} group" if kinds else "a Zarr group without multiscales"
        raise ValueError(f"input {path} is {what}; give an OME-Zarr image or a Zarr array")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"input {path} is OME-Zarr version {version or 'unknown'!r}; znni reads 0.4 and 0.5"
        )
    if not isinstance(scales, list) or not scales or not isinstance(scales[0], dict):
        raise ValueError(f"input {path} has a 'multiscales' that is not a non-empty list")
    ms = scales[0]
    if not isinstance(ms.get("datasets"), list) or not ms["datasets"]:
        raise ValueError(f"input {path} has a multiscale without datasets")
    if not isinstance(ms.get("axes"), list):
        raise ValueError(f"input {path} has a multiscale without an 'axes' list")
    return version, ms


def map_axes(axes: list[Any], path: Location) -> tuple[bool, tuple[str, ...], Units]:
    """(has a channel axis, axis names, units of the space axes); refuses other layouts."""
    names, kinds, units = [], [], []
    for a in axes:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise ValueError(f"input {path} has an axis that is not an object with a 'name'")
        names.append(a["name"])
        kinds.append(a.get("type") or {"t": "time", "c": "channel"}.get(a["name"], "space"))
        units.append(a.get("unit"))
    if "time" in kinds:
        raise ValueError(
            f"input {path} has a time axis {names[kinds.index('time')]!r}; znni runs on one "
            "3D image (c, z, y, x), so write the time point you want as its own image"
        )
    space = [i for i, k in enumerate(kinds) if k == "space"]
    if len(space) != 3:
        raise ValueError(
            f"input {path} has {len(space)} space axes ({', '.join(names[i] for i in space)}); "
            "znni needs a 3D image with space axes z, y, x"
        )
    other = [n for n, k in zip(names, kinds, strict=True) if k not in ("space", "channel")]
    channels = kinds.count("channel")
    if other or channels > 1 or space != list(range(len(names) - 3, len(names))):
        raise ValueError(
            f"input {path} has axes {names}; znni reads (c, z, y, x) or (z, y, x) images"
        )
    spatial = [names[i].lower() for i in space]
    if sorted(spatial) == ["x", "y", "z"] and spatial != ["z", "y", "x"]:
        raise ValueError(f"input {path} orders its space axes {spatial}; znni needs z, y, x")
    u = [units[i] if isinstance(units[i], str) else None for i in space]
    return channels == 1, tuple(names), (u[0], u[1], u[2])


def _scale_translation(transforms: Any, ndim: int, where: str) -> tuple[list[float], list[float]]:
    """The scale and translation of a coordinateTransformations list (identity if absent)."""
    scale, shift = [1.0] * ndim, [0.0] * ndim
    for t in transforms if isinstance(transforms, list) else []:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "identity":
            continue
        values = t.get(kind) if kind in ("scale", "translation") else None
        if not isinstance(values, list) or len(values) != ndim or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        ):
            raise ValueError(f"{where} has a coordinate transformation {t!r} that znni cannot use")
        if kind == "scale":
            scale = [float(v) for v in values]
        else:
            shift = [float(v) for v in values]
    return scale, shift


def ome_level(group_path: Location, level: int, attrs: dict[str, Any] | None = None, *,
              ctx: StoreContext) -> OmeLevel:
    """Level `level` of the OME-Zarr image group at `group_path`, with its metadata checked
    (`attrs`: the group's attributes when already read, so each level costs no new read)."""
    version, ms = multiscale(group_attrs(group_path, ctx=ctx) if attrs is None else attrs,
                             group_path)
    datasets = ms["datasets"]
    if not 0 <= level < len(datasets):
        raise ValueError(
            f"input {group_path} has levels 0 to {len(datasets) - 1}; there is no level {level}"
        )
    has_c, names, units = map_axes(ms["axes"], group_path)
    ds = datasets[level]
    if not isinstance(ds, dict) or not isinstance(ds.get("path"), str):
        raise ValueError(f"input {group_path} has a dataset without a 'path'")
    n = len(names)
    where = f"level {level} of input {group_path}"
    s, t = _scale_translation(ds.get("coordinateTransformations"), n, where)
    gs, gt = _scale_translation(ms.get("coordinateTransformations"), n, f"input {group_path}")
    scale = [gs[i] * s[i] for i in range(n)][-3:]
    shift = [gs[i] * t[i] + gt[i] for i in range(n)][-3:]
    return OmeLevel(
        group_path, group_path.join(ds["path"]), level, len(datasets), version, has_c,
        names, units, (scale[0], scale[1], scale[2]), (shift[0], shift[1], shift[2]),
    )


def find_ome(path: Location, *, ctx: StoreContext) -> OmeLevel | None:
    """The OME level that `path` names: an image group (its level 0), or an array that is a
    dataset of the image group around it; None for an array outside any OME image."""
    if is_group(path, ctx=ctx):
        return ome_level(path, 0, ctx=ctx)
    up, name = path.parent(), path.name
    if name and up.url != path.url and _may_be_image(up, ctx) and is_group(up, ctx=ctx):
        try:
            _, ms = multiscale(group_attrs(up, ctx=ctx), up)
        except ValueError:
            return None
        paths = [d.get("path") for d in ms["datasets"] if isinstance(d, dict)]
        if name in paths:
            return ome_level(up, paths.index(name), ctx=ctx)
    return None


def level_path(path: Location, level: int, *, ctx: StoreContext) -> Location:
    """The array directory of level `level` of the OME-Zarr image at `path` (for --level), or
    scale `level` of a precomputed:// volume."""
    if path.is_tensorstore:
        return path.with_level(level)
    if not is_group(path, ctx=ctx):
        raise ValueError(f"--level applies to OME-Zarr image groups, and input {path} is not one")
    return ome_level(path, level, ctx=ctx).array_location


def output_metadata(
    factors: list[tuple[int, int, int]], source: OmeLevel | None, name: str
) -> dict[str, Any]:
    """NGFF 0.5 `ome` attributes for levels 0..K of (c, z, y, x) with cumulative (z, y, x)
    `factors`: level k's voxel size is level 0's times its factor, and its offset moves to
    the centre of the level-0 voxels it averages."""
    scale0 = source.scale if source else (1.0, 1.0, 1.0)
    shift0 = source.translation if source else (0.0, 0.0, 0.0)
    units = source.units if source else (None, None, None)
    axes: list[dict[str, Any]] = [{"name": "c", "type": "channel"}]
    for axis, unit in zip("zyx", units, strict=True):
        axes.append({"name": axis, "type": "space", **({"unit": unit} if unit else {})})
    datasets = []
    for k, f in enumerate(factors):
        scale = [1.0] + [scale0[i] * f[i] for i in range(3)]
        shift = [0.0] + [shift0[i] + scale0[i] * (f[i] - 1) / 2 for i in range(3)]
        datasets.append({"path": str(k), "coordinateTransformations": [
            {"type": "scale", "scale": scale}, {"type": "translation", "translation": shift}]})
    return {"version": "0.5", "multiscales": [{"name": name, "axes": axes,
                                               "datasets": datasets}]}
