"""The `--mask` volume: where the output is wanted, at the mask's own (often coarse) resolution.

A mask is a Zarr array, an OME-Zarr image (level 0) or level, local or a URL, of
(z, y, x) or (1, z, y, x), whose spatial shape divides the input's: each mask voxel
covers `factor` input voxels per axis (input shape / mask shape), nonzero meaning
inside. A block's coverage is decided from the mask voxels under its write box alone
(a read of the coarse array, no upsampling), so a block wholly outside costs one small
read; a partly covered block gets the mask upsampled (nearest) over its write box.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.geometry import Box, Triple
from znni.engine.io.stores import check_readable
from znni.engine.location import Location
from znni.triple import as_triple

OUTSIDE, PARTIAL, INSIDE = "outside", "partial", "inside"


@dataclass(frozen=True)
class MaskSpec:
    """A checked mask: its path and its factor per axis (picklable; workers open it)."""

    path: Location
    factor: Triple
    store: StoreContext = field(default_factory=StoreContext)


def check_mask(path: Location, input_shape: Triple, *, ctx: StoreContext) -> MaskSpec:
    """Open the mask and check that its shape divides the input's; ValueError naming it."""
    _, shape, _ = _open(path, ctx)
    if any(n % m for n, m in zip(input_shape, shape, strict=True)):
        raise ValueError(
            f"mask {path} has shape {shape}, which does not divide the input's "
            f"{input_shape}; a mask voxel must cover a whole number of input voxels per axis"
        )
    factor = (input_shape[0] // shape[0], input_shape[1] // shape[1],
              input_shape[2] // shape[2])
    return MaskSpec(path, factor, ctx)


def _open(path: Location, ctx: StoreContext) -> tuple[Any, Triple, bool]:
    """(the mask's array, its spatial shape, whether it has a channel axis of 1); a bool,
    integer or float array, or an OME-Zarr image or level of one."""
    from znni.engine.io.ome import find_ome
    from znni.engine.io.zarr_arrays import open_zarr_array

    check_readable(path, "mask", ctx=ctx)
    try:
        ome = find_ome(path, ctx=ctx) if path.is_remote or Path(path.url).is_dir() else None
    except ValueError as e:  # the OME reader names what it reads "input"
        raise ValueError(str(e).replace("input", "mask", 1)) from None
    arr = open_zarr_array(ome.array_location if ome else path, "mask", ctx=ctx)
    shape = tuple(int(n) for n in arr.shape)
    if np.dtype(arr.dtype).kind not in "biuf":
        raise ValueError(f"mask {path} has dtype {arr.dtype}; expected bool, integer or float")
    if len(shape) == 3:
        return arr, (shape[0], shape[1], shape[2]), False
    if len(shape) == 4 and shape[0] == 1:
        return arr, (shape[1], shape[2], shape[3]), True
    raise ValueError(f"mask {path} has shape {shape}; expected (z, y, x) or (1, z, y, x)")


class Mask:
    """An opened mask in a worker: coverage and voxels of write boxes."""

    def __init__(self, spec: MaskSpec) -> None:
        self.spec = spec
        self.array, _, self.channel_axis = _open(spec.path, spec.store)

    def coarse_box(self, box: Box) -> Box:
        """The box of the mask voxels under an input `box`."""
        f = self.spec.factor
        lo = (box.lo[0] // f[0], box.lo[1] // f[1], box.lo[2] // f[2])
        hi = (-(-box.hi[0] // f[0]), -(-box.hi[1] // f[1]), -(-box.hi[2] // f[2]))
        return Box(lo, hi)

    def coarse(self, box: Box) -> tuple[Box, np.ndarray]:
        """(the mask voxels' box, their values as bool (Z, Y, X)) under an input `box`."""
        cbox = self.coarse_box(box)
        index = (0, *cbox.slices()) if self.channel_axis else cbox.slices()
        return cbox, np.asarray(self.array[index]) != 0  # (MZ, MY, MX)

    def coverage(self, box: Box) -> str:
        """OUTSIDE, PARTIAL or INSIDE for the input voxels of `box`."""
        _, inside = self.coarse(box)
        if not inside.any():
            return OUTSIDE
        return INSIDE if inside.all() else PARTIAL

    def voxels(self, box: Box) -> np.ndarray:
        """Bool (Z, Y, X) over `box` at the input's resolution (each mask voxel repeated)."""
        cbox, inside = self.coarse(box)
        f = self.spec.factor
        for axis, n in enumerate(f):
            if n > 1:
                inside = np.repeat(inside, n, axis=axis)
        start = [b - c * n for b, c, n in zip(box.lo, cbox.lo, f, strict=True)]
        s = box.shape
        return inside[start[0]:start[0] + s[0], start[1]:start[1] + s[1],
                      start[2]:start[2] + s[2]]


WHOLE_READ_VOXELS = 2**26  # a coarse mask up to this size is read once to plan with


def outside_boxes(spec: MaskSpec, boxes: list[Box]) -> list[bool]:
    """Whether each box (input coordinates) lies wholly outside the mask: the plan's count of
    blocks not computed. The mask voxels under all the boxes are read at once when few
    enough (WHOLE_READ_VOXELS), else box by box."""
    if not boxes:
        return []
    mask = Mask(spec)
    lo = as_triple(min(b.lo[i] for b in boxes) for i in range(3))
    hi = as_triple(max(b.hi[i] for b in boxes) for i in range(3))
    whole = Box(lo, hi)
    cbox = mask.coarse_box(whole)
    if cbox.size > WHOLE_READ_VOXELS:
        return [mask.coverage(b) == OUTSIDE for b in boxes]
    _, inside = mask.coarse(whole)  # (MZ, MY, MX) over cbox
    out = []
    for b in boxes:
        c = mask.coarse_box(b)
        part = inside[tuple(slice(a - o, e - o) for a, e, o in zip(c.lo, c.hi, cbox.lo,
                                                                   strict=True))]
        out.append(not part.any())
    return out
