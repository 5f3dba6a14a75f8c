"""Which overlap-save tiling CpuBackend will use for an FFT conv layer, and its shapes.

CpuBackend cuts a big FFT conv into m^3 overlapping tiles when its tiling
model (primitives/cpu/tiling.py) says that is faster; kept spectra are then
made at the tile size and must fit the spectra cache bound. The planner asks
the backend's own model (never a re-implementation) so that the memory it
predicts is the memory the backend allocates.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import prod

from znni.model.network import LayerShape
from znni.primitives.cpu.tiling import (
    RECOMPUTE_SPECTRA_BYTES,
    choose_tiles,
    recompute_parts,
)
from znni.primitives.cpu.tiling import tile_geometry as cpu_tile_geometry
from znni.primitives.fft_sizes import padded_shape, spectrum_points
from znni.triple import Triple


def fft_tiles(layer: LayerShape, primitive: str | None, spectra_budget: int | None) -> int:
    """Tiles per axis CpuBackend picks: its model, with the cache bound for fft-keep
    (`spectra_budget`) and no bound for fft-recompute. 1 for every other primitive."""
    if layer.kind != "conv" or primitive not in ("fft-keep", "fft-recompute"):
        return 1
    budget = spectra_budget if primitive == "fft-keep" else None
    return _choose_tiles(layer.batch_in, layer.channels_in, layer.channels_out,
                         tuple(layer.size_out), tuple(layer.kernel), budget)


@lru_cache(maxsize=1 << 16)
def _choose_tiles(s: int, cin: int, cout: int, out: Triple, kernel: Triple,
                  budget: int | None) -> int:
    """choose_tiles (a pure function of its arguments), remembered: a plan's search asks
    the same layer about ten times (n337 on the paper's profile: 48,000 asks, 5,400 layers)."""
    return choose_tiles(s, cin, cout, out, kernel, budget)


def tile_geometry(layer: LayerShape, m: int) -> tuple[Triple, Triple, Triple]:
    """(tiles per axis, tile output size, tile input size), as CpuBackend computes them."""
    return cpu_tile_geometry(layer.size_out, layer.kernel, m)


def tiled_layer(layer: LayerShape, m: int) -> LayerShape:
    """The layer fft_conv3d really runs: S*T tiles of the tile input size (itself when m=1
    or the patch is too small to cut)."""
    counts, t_out, t_in = tile_geometry(layer, m)
    if counts == (1, 1, 1):
        return layer
    t = prod(counts)
    return replace(layer, batch_in=layer.batch_in * t, size_in=t_in, batch_out=layer.batch_in * t,
                   size_out=t_out)


def recompute_width(tiled: LayerShape) -> int:
    """Output channels per part of recomputed spectra CpuBackend makes for a tiled layer
    (its default recompute_spectra_bytes)."""
    nc = spectrum_points(padded_shape(tiled.size_in))
    return recompute_parts(tiled.channels_in, tiled.channels_out, nc, RECOMPUTE_SPECTRA_BYTES)
