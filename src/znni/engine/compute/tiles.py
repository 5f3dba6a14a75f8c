"""Tile arithmetic of exact graph jobs (valid U-Nets): pure integers, no arrays.

A valid network with total downsampling F is translation-equivariant for shifts that
are multiples of F, so its output is tiled on the F grid aligned to the volume origin
(docs/design.md, "Dense output modes"). The exact-graph worker, the graph choice and
`znni plan` all place tiles with these three functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from znni.engine.geometry import Triple

if TYPE_CHECKING:
    from znni.model.onnx_model import OnnxModel


def tile_output(model: OnnxModel, tile: Triple) -> Triple:
    """The output voxels of one tile of input size `tile`."""
    out = [t - c for t, c in zip(tile, model.context, strict=True)]
    return (out[0], out[1], out[2])


def context_lo(model: OnnxModel) -> Triple:
    """Input voxels a tile reads before its first output voxel (half the context)."""
    c = model.context
    return (c[0] // 2, c[1] // 2, c[2] // 2)


def tile_starts(lo: int, hi: int, factor: int, out: int) -> list[int]:
    """Output starts on the factor grid covering [lo, hi) with tiles of `out` voxels."""
    step = out // factor * factor
    if step < 1:
        raise ValueError(f"a tile output of {out} voxels is less than the grid step {factor}")
    starts = [lo // factor * factor]
    while starts[-1] + out < hi:
        starts.append(starts[-1] + step)
    return starts
