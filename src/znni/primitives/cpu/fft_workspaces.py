"""The FFTW workspaces one FFT conv layer checks out, named without running it.

`CpuBackend._run_fft` (tiled or not) and `fft_conv3d` check workspaces out of the plan
cache by key; a workspace's transforms are planned (FFTW_MEASURE: timed) the first time
its key is built in a process, or read from FFTW's wisdom. `layer_workspaces` lists the
same keys and builders from the layer's shapes and the backend's settings alone, so the
job-time prediction can ask FFTW's wisdom (`fftw_plans.in_wisdom`) which of them a run
would still have to measure. tests/primitives/test_fft_workspaces.py holds the list to
what a real run checks out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from math import prod

from znni.primitives.base import Triple
from znni.primitives.cpu.fft_conv import (
    COMPLEX_BYTES,
    FFT_WORK_BYTES,
    RECOMPUTE_BYTES,
    forward_builder,
    inverse_builder,
    samples_per_chunk,
    spectrum_shape,
)
from znni.primitives.cpu.fftw_plans import PlanCache, Workspace
from znni.primitives.cpu.tiling import (
    RECOMPUTE_SPECTRA_BYTES,
    choose_tiles,
    recompute_parts,
    tile_geometry,
)
from znni.primitives.fft_sizes import padded_shape
from znni.triple import as_triple


@dataclass(frozen=True)
class FftWorkspace:
    key: Hashable  # the plan cache's key (fft_conv.pruned_rfftn, inverse_workspace)
    build: Callable[[PlanCache], Workspace]
    points: int  # b * padded points: images transformed times the transform's size
    images: bool  # False: kernel spectra (planning folded into the image rate, jobtime)


SPECTRA_CACHE_BYTES = 2**30  # CpuBackend's default spectra cache


@dataclass(frozen=True)
class FftSettings:
    """What of a CpuBackend decides its FFT workspaces (its defaults here)."""

    tiles: int | None = None  # CpuBackend.fft_tiles (None: choose_tiles)
    spectra_budget: int = SPECTRA_CACHE_BYTES  # the spectra cache's bytes (fft-keep tiling)
    work_bytes: int = FFT_WORK_BYTES  # CpuBackend.fft_work_bytes
    recompute_spectra_bytes: int = RECOMPUTE_SPECTRA_BYTES  # tiled recompute's parts


def layer_workspaces(keep: bool, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                     settings: FftSettings) -> list[FftWorkspace]:
    """Every workspace an fft-keep (`keep`) or fft-recompute conv of an (S, Cin, n) input
    with a (Cout, Cin, k) weight checks out, once each (CpuBackend._run_fft's choices)."""
    s, cin = int(x_shape[0]), int(x_shape[1])
    cout = int(w_shape[0])
    kernel = as_triple(int(k) for k in w_shape[2:])
    out = as_triple(int(n) - k + 1 for n, k in zip(x_shape[2:], kernel, strict=True))
    budget = settings.spectra_budget if keep else None
    m = settings.tiles or choose_tiles(s, cin, cout, out, kernel, budget)
    counts, t_out, t_in = tile_geometry(out, kernel, m)
    padded = padded_shape(t_in)
    found: dict[Hashable, FftWorkspace] = {}
    if keep:  # kept spectra at the tile size (the whole patch untiled)
        _kernel_spectra(found, cout, cin, kernel, padded, RECOMPUTE_BYTES)
    if counts == (1, 1, 1):
        _conv(found, s, cin, cout, t_in, kernel, keep, settings.work_bytes, RECOMPUTE_BYTES)
        return list(found.values())
    nf = prod(spectrum_shape(padded))
    width = cout if keep else recompute_parts(cin, cout, nf, settings.recompute_spectra_bytes)
    tiles = s * prod(counts)
    group = min(tiles, samples_per_chunk(cin, width, padded, settings.work_bytes))
    for o0 in range(0, cout, width):
        part = min(cout, o0 + width) - o0
        if not keep:
            _kernel_spectra(found, part, cin, kernel, padded, RECOMPUTE_BYTES)
        for g0 in range(0, tiles, group):  # kept or just made spectra: no recompute inside
            _conv(found, min(group, tiles - g0), cin, part, t_in, kernel, True,
                  settings.work_bytes, RECOMPUTE_BYTES)
    return list(found.values())


def _conv(found: dict[Hashable, FftWorkspace], s: int, cin: int, cout: int, size: Triple,
          kernel: Triple, spectra: bool, work_bytes: int, recompute_bytes: int) -> None:
    """fft_conv3d's workspaces: per chunk of samples the forward and inverse transforms,
    and without `spectra` the kernel transforms, `recompute_bytes` of them at a time."""
    padded = padded_shape(size)
    out = as_triple(n - k + 1 for n, k in zip(size, kernel, strict=True))
    sc = min(s, samples_per_chunk(cin, cout, padded, work_bytes))
    for s0 in range(0, s, sc):
        b = min(s, s0 + sc) - s0
        _add(found, ("rfftn", b * cin, size, padded),
             forward_builder(b * cin, size, padded), b * cin * prod(padded), True)
        _add(found, ("irfftn", b * cout, padded, out),
             inverse_builder(b * cout, padded, out), b * cout * prod(padded), True)
        if not spectra:
            _kernel_spectra(found, cout, cin, kernel, padded, recompute_bytes)


def _kernel_spectra(found: dict[Hashable, FftWorkspace], cout: int, cin: int, kernel: Triple,
                    padded: Triple, chunk_bytes: int) -> None:
    """fft_conv.kernel_spectra_into's forward transforms, `chunk_bytes` of them at a time."""
    nf = prod(spectrum_shape(padded))
    oc = max(1, min(cout, chunk_bytes // max(1, cin * nf * COMPLEX_BYTES)))
    for o0 in range(0, cout, oc):
        b = (min(cout, o0 + oc) - o0) * cin
        _add(found, ("rfftn", b, kernel, padded), forward_builder(b, kernel, padded),
             b * prod(padded), False)


def _add(found: dict[Hashable, FftWorkspace], key: Hashable,
         build: Callable[[PlanCache], Workspace], points: int, images: bool) -> None:
    if key not in found:
        found[key] = FftWorkspace(key, build, points, images)
