"""A look at a result: one input slice with the output drawn over it, as a PNG.

The output is a plain array, an OME-Zarr image (its level 0) or a precomputed volume
(through TensorStore, as the input may be); its input comes from
the output's provenance (`provenance.py`). One output channel is drawn with a colormap,
several with one colour each (opacity rising with the value), each with a colour bar.
Rendering uses matplotlib's object API on the Agg canvas (no pyplot state, so it is
safe in a server thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.io.arrays import open_array
from znni.engine.io.ome import group_attrs, is_group, ome_level
from znni.engine.io.stores import exists
from znni.engine.io.zarr_arrays import open_zarr_array
from znni.engine.location import Location
from znni.engine.output.provenance import read_provenance

AXES = ("z", "y", "x")
CHANNEL_COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4")


@dataclass(frozen=True)
class Slice:
    """One slice of an output and its input, as 2D arrays (rows, columns)."""

    axis: str
    index: int
    extent: int
    image: np.ndarray  # input (first channel), (rows, cols)
    output: np.ndarray  # (C, rows, cols)
    dtype: np.dtype
    provenance: dict[str, Any]


def read_slice(output_path: Location, axis: str = "z", index: int | None = None, *,
               ctx: StoreContext) -> Slice:
    """The input and output values of one slice; ValueError with one sentence when the
    output, its provenance, its input or the slice is not there."""
    if axis not in AXES:
        raise ValueError(f"slice axis {axis!r} is not one of z, y, x")
    if not exists(output_path, ctx=ctx):
        raise ValueError(f"output {output_path} does not exist")
    if not output_path.is_tensorstore and is_group(output_path, ctx=ctx):
        attrs = group_attrs(output_path, ctx=ctx)
        level0 = ome_level(output_path, 0, ctx=ctx).array_location
        out = open_zarr_array(level0, "output", ctx=ctx)
    else:
        out = open_array(output_path, "output", ctx=ctx)
        attrs = out.attrs.asdict()
    prov = read_provenance(attrs, output_path)
    source = Location.parse(prov["input_array"], "input")  # as the provenance recorded it
    if not exists(source, ctx=ctx):
        raise ValueError(
            f"input {source} named by the provenance of {output_path} does not exist"
        )
    inp = open_array(source, "input", ctx=ctx)
    spatial = tuple(int(s) for s in out.shape[1:])
    a = AXES.index(axis)
    extent = spatial[a]
    index = extent // 2 if index is None else index
    if not 0 <= index < extent:
        raise ValueError(
            f"{axis} index {index} is outside the output's {axis} range 0..{extent - 1}"
        )
    if tuple(int(s) for s in inp.shape[-3:]) != spatial:
        raise ValueError(
            f"input {prov['input_array']} has shape {tuple(inp.shape)}, which does not match "
            f"output {output_path} {tuple(out.shape)}"
        )
    cut: list[Any] = [slice(None)] * 3
    cut[a] = index
    image = np.asarray(inp[(*([0] if len(inp.shape) == 4 else []), *cut)], dtype=np.float32)
    values = np.asarray(out[(slice(None), *cut)])
    return Slice(axis, index, extent, image, values, np.dtype(out.dtype), prov)


def render_preview(output_path: Location, png_path: str, axis: str = "z",
                   index: int | None = None, *, ctx: StoreContext) -> str:
    """Write the PNG of one slice (default: the middle z) to `png_path`; returns the path."""
    png = preview_png(output_path, axis, index, ctx=ctx)
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    Path(png_path).write_bytes(png)
    return png_path


def preview_png(output_path: Location, axis: str = "z", index: int | None = None, *,
                ctx: StoreContext) -> bytes:
    """The PNG bytes of one slice, the output drawn over the input (blocks not yet done
    read as the output's fill value, zero)."""
    from io import BytesIO

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = read_slice(output_path, axis, index, ctx=ctx)
    rows, cols = [n for n in AXES if n != axis]
    fig = Figure(figsize=(7.5, 6.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(s.image, cmap="gray", interpolation="nearest", aspect=_aspect(s, rows, cols))
    vmin, vmax = _range(s)
    for c, layer in enumerate(s.output):
        cmap = _channel_cmap(c) if len(s.output) > 1 else "magma"
        alpha = None if len(s.output) > 1 else 0.5
        im = ax.imshow(layer, cmap=cmap, vmin=vmin, vmax=vmax, alpha=alpha,
                       interpolation="nearest", aspect=_aspect(s, rows, cols))
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02 if c == 0 else 0.12,
                     label=f"output channel {c}")
    ax.set_xlabel(cols)
    ax.set_ylabel(rows)
    ax.set_title(_title(output_path, s, rows, cols), fontsize=9)
    buf = BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def default_png(output_path: Location, axis: str, index: int) -> str:
    """`OUT` without its .zarr suffix, plus the slice: e.g. out/boundaries-z32.png (for a URL
    output, in the current directory)."""
    where = output_path.bare()
    p = Path(where.name) if where.is_remote else Path(where.url.rstrip("/"))
    stem = p.name.removesuffix(".zarr").removesuffix(".ome")
    return str(p.with_name(f"{stem}-{axis}{index}.png"))


def _range(s: Slice) -> tuple[float, float]:
    if s.dtype == np.uint8:
        return 0.0, 255.0
    lo, hi = float(np.min(s.output)), float(np.max(s.output))
    if lo >= 0.0 and hi <= 1.0:
        return 0.0, 1.0
    return lo, hi if hi > lo else lo + 1.0


def _channel_cmap(c: int) -> Any:
    """Transparent at the bottom of the range, the channel's colour at the top."""
    from matplotlib.colors import LinearSegmentedColormap, to_rgb

    rgb = to_rgb(CHANNEL_COLOURS[c % len(CHANNEL_COLOURS)])
    return LinearSegmentedColormap.from_list(f"channel{c}", [(*rgb, 0.0), (*rgb, 0.8)])


def _aspect(s: Slice, rows: str, cols: str) -> float:
    size = s.provenance.get("voxel_size")
    if not isinstance(size, list) or len(size) != 3:
        return 1.0
    r, c = size[AXES.index(rows)], size[AXES.index(cols)]
    return float(r / c) if r and c else 1.0


def _title(output_path: Location, s: Slice, rows: str, cols: str) -> str:
    shape = s.output.shape[1:]
    where = f"{s.axis} = {s.index} of 0..{s.extent - 1}"
    size, units = s.provenance.get("voxel_size"), s.provenance.get("units")
    if isinstance(size, list) and isinstance(units, list) and units[AXES.index(s.axis)]:
        a = AXES.index(s.axis)
        shift = s.provenance.get("translation") or [0.0, 0.0, 0.0]
        where += f" at {shift[a] + s.index * size[a]:g} {units[a]}"
    net = s.provenance.get("network", {}).get("name", "?")
    return (f"{output_path.bare().name} ({net}): {where}; {rows} 0..{shape[0] - 1}, "
            f"{cols} 0..{shape[1] - 1}")
