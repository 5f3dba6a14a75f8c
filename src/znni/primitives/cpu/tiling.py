"""Overlap-save tiling for FFT conv: a big patch as a batch of smaller tiles.

At batch 1 the frequency-domain multiply-add is memory-bound (each kernel
spectrum is read once per patch) and kept spectra grow with the patch
(23 GB for 80x80 at 96^3). Cutting the patch into m^3 overlapping tiles of
t + k - 1 voxels turns the product into a real matrix product over the
tiles (spectra read once for m^3 tiles) and shrinks the spectra m^3-fold,
for a little redundant transform work on the k - 1 overlap.
"""

from __future__ import annotations

from math import log2, prod

import numpy as np

from znni.primitives.base import Triple
from znni.primitives.cpu.fft_sizes import padded_shape

FFT_FLOPS_PER_S = 1.0e10
GEMM_FLOPS_PER_S = 1.0e11
MEMORY_BYTES_PER_S = 1.5e10
MAX_TILES_PER_AXIS = 4


def tile_geometry(out: Triple, kernel: Triple, m: int) -> tuple[Triple, Triple, Triple]:
    """(tiles per axis, tile output size, tile input size) for m tiles per axis (capped)."""
    counts = tuple(min(m, o) for o in out)
    t_out = tuple(-(-o // c) for o, c in zip(out, counts, strict=True))
    t_in = tuple(t + k - 1 for t, k in zip(t_out, kernel, strict=True))
    return counts, t_out, t_in  # type: ignore[return-value]


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
    if recompute:  # pruned kernel transforms (about 40% of a full one) plus their traffic
        fft_s += 0.4 * 2.5 * vol * log2(max(vol, 2)) * cin * cout / FFT_FLOPS_PER_S
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


def split_tiles(x: np.ndarray, counts: Triple, t_out: Triple, t_in: Triple) -> np.ndarray:
    """(S, C, n) -> (S*Tz*Ty*Tx, C, t_in), zero-padding the far end to whole tiles."""
    s, c = x.shape[:2]
    need = tuple(cnt * t + (ti - t) for cnt, t, ti in zip(counts, t_out, t_in, strict=True))
    if need != x.shape[2:]:
        xp = np.zeros((s, c, *need), dtype=x.dtype)
        region = tuple(slice(0, min(a, b)) for a, b in zip(need, x.shape[2:], strict=True))
        xp[(slice(None), slice(None), *region)] = x[(slice(None), slice(None), *region)]
        x = xp
    tiles = np.empty((s, *counts, c, *t_in), dtype=x.dtype)  # (S, Tz, Ty, Tx, C, tz, ty, tx)
    for i, j, k in np.ndindex(*counts):
        z0, y0, x0 = i * t_out[0], j * t_out[1], k * t_out[2]
        tiles[:, i, j, k] = x[:, :, z0 : z0 + t_in[0], y0 : y0 + t_in[1], x0 : x0 + t_in[2]]
    return tiles.reshape(s * prod(counts), c, *t_in)


def join_tiles(y: np.ndarray, s: int, counts: Triple, out: Triple) -> np.ndarray:
    """(S*Tz*Ty*Tx, C, t_out) -> (S, C, out), dropping the padded far end."""
    c, tz, ty, tx = y.shape[1:]
    t = y.reshape(s, *counts, c, tz, ty, tx).transpose(0, 4, 1, 5, 2, 6, 3, 7)
    full = t.reshape(s, c, counts[0] * tz, counts[1] * ty, counts[2] * tx)  # (S, C, Z, Y, X)
    return np.ascontiguousarray(full[:, :, : out[0], : out[1], : out[2]])
