"""The pyramid of a precomputed output (`--pyramid N`): scales 1..N of the same volume.

Scale k is pyramid level k (`pyramid.py`): the same halving steps (so an anisotropic
volume halves only the axes the OME rule halves, from the output's `resolution`), the
same shape (ceil of level 0's over the factor), made by the same `PyramidBuilder` from
blocks as they land. Only the arrays differ: each scale is created by TensorStore's
`neuroglancer_precomputed` driver (`scale_metadata`, which adds the scale to `info`)
and written through `TsArray`. Its `info` entry: `resolution` level 0's times the
factor, `size` the level's, `chunk_size` level 0's clipped to it, `voxel_offset` level
0's divided by the factor, rounded down (as CloudVolume does; exact where the offset is
a multiple of the factor, else the scale sits less than one of its voxels off).
"""

from __future__ import annotations

from typing import Any

from znni.engine.context import StoreContext
from znni.engine.geometry import Triple
from znni.engine.io.precomputed import (
    TsArray,
    Xyz,
    error_sentence,
    kvstore_spec,
    open_volume,
    read_info,
    ts_context,
)
from znni.engine.io.pyramid import Factors, cumulative, level_shapes, level_steps
from znni.engine.location import Location

Geometry = tuple[Xyz, tuple[int, int, int]]  # (resolution nm, voxel offset), both (x, y, z)


def scales_metadata(shape: Triple, chunks: Triple, geometry: Geometry,
                    steps: Factors) -> list[dict[str, Any]]:
    """TensorStore's `scale_metadata` of scales 1..K for a (z, y, x) level-0 `shape`."""
    (rx, ry, rz), (ox, oy, oz) = geometry
    out = []
    for (fz, fy, fx), (z, y, x) in zip(cumulative(steps)[1:], level_shapes(shape, steps)[1:],
                                       strict=True):
        size = [x, y, z]
        out.append({"size": size,
                    "resolution": [float(rx * fx), float(ry * fy), float(rz * fz)],
                    "voxel_offset": [ox // fx, oy // fy, oz // fz],
                    "chunk_size": [min(c, n) for c, n in zip(chunks[::-1], size, strict=True)],
                    "encoding": "raw"})
    return out


def pyramid_steps(path: Location, shape: Triple, geometry: Geometry, levels: int | None,
                  check: bool, *, ctx: StoreContext) -> Factors:
    """The halving steps of a precomputed output's pyramid: `levels` (--pyramid) of them,
    else an existing output's own depth, else none. With `check`, an existing output must
    hold exactly the scales this run writes, or fewer where its ledger lists no finished
    block (a run killed before it added them: the rest are added, `open_scales`);
    ValueError (one sentence) otherwise."""
    info = read_info(path, "output", ctx=ctx)
    have = None if info is None else len(info["scales"]) - 1
    if levels is None:
        levels = have or 0
    rx, ry, rz = geometry[0]
    steps = level_steps(shape, (rz, ry, rx), levels)
    if info is None or not check:
        return steps
    assert have is not None  # an info was read: it has scale 0 at least
    if have != len(steps) and not (have < len(steps) and _nothing_done(path, ctx)):
        raise ValueError(
            f"existing output {path} has {have} pyramid levels (scales after scale 0), this "
            f"run writes {len(steps)}; give --pyramid {have}, remove it or choose another path"
        )
    for k, want in enumerate(scales_metadata(shape, (1, 1, 1), geometry, steps)[:have], start=1):
        found = info["scales"][k]
        got = {"size": [int(n) for n in found.get("size", ())],
               "resolution": [float(r) for r in found.get("resolution", ())],
               "voxel_offset": [int(o) for o in found.get("voxel_offset", (0, 0, 0))]}
        if any(got[name] != want[name] for name in got):
            diff = ", ".join(f"{name} {got[name]} (expected {want[name]})" for name in got
                             if got[name] != want[name])
            raise ValueError(f"existing output {path} scale {k} has {diff}; remove it or "
                             "choose another output path")
    return steps


def _nothing_done(path: Location, ctx: StoreContext) -> bool:
    """Whether the output's ledger lists no finished block (or there is no ledger)."""
    from znni.engine.io.ledger import read_ledger

    return not read_ledger(path, ctx=ctx)[1]


def open_scales(path: Location, shape: tuple[int, ...], dtype: str, chunks: Triple,
                geometry: Geometry, steps: Factors, *, ctx: StoreContext,
                volume_type: str = "image") -> list[TsArray]:
    """Scales 1..K of the precomputed output at `path` (scale 0 already there, a (c, z, y, x)
    `shape`) for writing: those its `info` lists opened, the others added to it."""
    import tensorstore as ts

    info = read_info(path, "output", ctx=ctx)
    have = 0 if info is None else len(info["scales"]) - 1
    spatial: Triple = (int(shape[1]), int(shape[2]), int(shape[3]))
    out: list[TsArray] = []
    for k, meta in enumerate(scales_metadata(spatial, chunks, geometry, steps), start=1):
        scale_path = path.with_level(k)
        if k <= have:
            out.append(open_volume(scale_path, "output", ctx=ctx, write=True))
            continue
        spec = {"driver": "neuroglancer_precomputed",
                "kvstore": kvstore_spec(path, ctx),
                "multiscale_metadata": {"type": volume_type, "data_type": dtype,
                                        "num_channels": int(shape[0])},
                "scale_metadata": meta, "create": True, "open": True}
        try:
            handle = ts.open(spec, context=ts_context()).result()
        except ValueError as e:
            raise ValueError(f"output {path} scale {k} could not be created "
                             f"({error_sentence(e)})") from e
        out.append(TsArray(handle, scale_path, True, ctx, read_info(path, "output", ctx=ctx)))
    return out
