"""Overlap-save tiling for FFT conv: a big patch as a batch of smaller tiles.

At batch 1 the frequency-domain multiply-add is memory-bound (each kernel
spectrum is read once per patch) and kept spectra grow with the patch
(23 GB for 80x80 at 96^3). Cutting the patch into m^3 overlapping tiles of
t + k - 1 voxels turns the product into a real matrix product over the
tiles (spectra read once for m^3 tiles) and shrinks the spectra m^3-fold,
for a little redundant transform work on the k - 1 overlap. Tiles stream:
CpuBackend gathers one transform chunk of them at a time and scatters the
results straight into the output, so the layer needs its input, its output
and one chunk of tiles, not whole tiled copies of both. Recomputed kernel
spectra are made once per call at the tile size, RECOMPUTE_SPECTRA_BYTES of
output channels at a time, and every tile streams through each such part:
remaking them per chunk of tiles cost n537's 5^3 layers 2.2x their time.
"""

from __future__ import annotations

from math import log2, prod

import numpy as np

from znni.primitives.base import Triple
from znni.primitives.fft_sizes import padded_shape
from znni.triple import as_triple

FFT_FLOPS_PER_S = 1.0e10
GEMM_FLOPS_PER_S = 1.0e11
MEMORY_BYTES_PER_S = 1.5e10
MAX_TILES_PER_AXIS = 4
RECOMPUTE_SPECTRA_BYTES = 2**31  # CpuBackend's default bound on one part of recomputed spectra


def recompute_parts(cin: int, cout: int, nf: int, part_bytes: int) -> int:
    """Output channels per part of recomputed (F, part, Cin) spectra within `part_bytes`."""
    return max(1, min(cout, part_bytes // max(1, cin * nf * 8)))


def tile_geometry(out: Triple, kernel: Triple, m: int) -> tuple[Triple, Triple, Triple]:
    """(tiles per axis, tile output size, tile input size) for m tiles per axis (capped)."""
    counts = as_triple(min(m, o) for o in out)
    t_out = as_triple(-(-o // c) for o, c in zip(out, counts, strict=True))
    t_in = as_triple(t + k - 1 for t, k in zip(t_out, kernel, strict=True))
    return counts, t_out, t_in


def model_s(
    s: int, cin: int, cout: int, out: Triple, kernel: Triple, m: int, recompute: bool = False
) -> tuple[float, int]:
    """(model seconds, kept spectra bytes) of FFT conv with m tiles per axis."""
    counts, _, t_in = tile_geometry(out, kernel, m)
    padded = padded_shape(t_in)
    vol = prod(padded)
    nf = vol // padded[2] * (padded[2] // 2 + 1)
    batch = s * prod(counts)
    fft_s = 2.5 * vol * log2(max(vol, 2)) * batch * (cin + cout) / FFT_FLOPS_PER_S
    spectra_bytes = 8 * cin * cout * nf
    gemm_s = 8.0 * batch * nf * cin * cout / GEMM_FLOPS_PER_S
    product_s = max(spectra_bytes / MEMORY_BYTES_PER_S, gemm_s)
    if recompute:  # pruned kernel transforms (about 40% of a full one) plus their traffic;
        # tiled, the inputs are transformed again for every part of the spectra
        per_fft_s = 2.5 * vol * log2(max(vol, 2)) / FFT_FLOPS_PER_S
        parts = 1
        if prod(counts) > 1:
            parts = -(-cout // recompute_parts(cin, cout, nf, RECOMPUTE_SPECTRA_BYTES))
        fft_s += (parts - 1) * batch * cin * per_fft_s + 0.4 * per_fft_s * cin * cout
        product_s += 2 * spectra_bytes / MEMORY_BYTES_PER_S
    return fft_s + product_s, spectra_bytes


def choose_tiles(
    s: int, cin: int, cout: int, out: Triple, kernel: Triple, spectra_budget: int | None
) -> int:
    """Tiles per axis with the least model time whose spectra fit `spectra_budget`.

    `spectra_budget` None means recomputed spectra (no memory constraint on them).
    """
    best, best_s = 1, float("inf")
    for m in range(1, MAX_TILES_PER_AXIS + 1):
        t, nbytes = model_s(s, cin, cout, out, kernel, m, recompute=spectra_budget is None)
        fits = spectra_budget is None or nbytes <= spectra_budget
        if fits and t < best_s:
            best, best_s = m, t
    return best


Origin = tuple[int, int, int, int]  # (sample, z0, y0, x0) of a tile's output


def tile_origins(s: int, counts: Triple, t_out: Triple) -> list[Origin]:
    """Every tile of an (S, C, out) output, sample-major then z, y, x."""
    return [
        (si, i * t_out[0], j * t_out[1], k * t_out[2])
        for si in range(s)
        for i, j, k in np.ndindex(*counts)
    ]


def gather_tiles(x: np.ndarray, origins: list[Origin], t_in: Triple, buf: np.ndarray) -> None:
    """buf[b] = the (C, t_in) input tile at origins[b], zero where it runs past the input's far
    end (the last tiles of an output that whole tiles do not cover exactly)."""
    n = x.shape[2:]
    for b, (si, z0, y0, x0) in enumerate(origins):
        ext = tuple(max(0, min(t, a - o)) for t, a, o in zip(t_in, n, (z0, y0, x0), strict=True))
        if ext != t_in:
            buf[b] = 0
        if 0 in ext:  # a tile wholly past the input (ceil division of the output by m)
            continue
        buf[b, :, : ext[0], : ext[1], : ext[2]] = x[
            si, :, z0 : z0 + ext[0], y0 : y0 + ext[1], x0 : x0 + ext[2]
        ]


def scatter_tiles(y: np.ndarray, origins: list[Origin], out: np.ndarray) -> None:
    """out[si, :, tile] = y[b] for the tile at origins[b], cropped at the output's far end."""
    n = out.shape[2:]
    t = y.shape[2:]
    for b, (si, z0, y0, x0) in enumerate(origins):
        ext = tuple(max(0, min(tt, a - o)) for tt, a, o in zip(t, n, (z0, y0, x0), strict=True))
        if 0 in ext:
            continue
        out[si, :, z0 : z0 + ext[0], y0 : y0 + ext[1], x0 : x0 + ext[2]] = y[
            b, :, : ext[0], : ext[1], : ext[2]
        ]
