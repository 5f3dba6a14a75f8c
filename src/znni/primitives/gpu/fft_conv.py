"""FFT convolution on a device (cuFFT through `xp.fft`): padded, pruned, batch-bounded.

- Padded: transforms run at the smallest cuFFT-friendly size >= n
  (2^a 3^b 5^c 7^d, the last axis even), not n + k - 1: circular wrap-around
  only reaches outputs that valid correlation discards.
- Pruned: a 3D transform is three passes of batched 1D transforms; the
  zero-padding is implicit (`n=` on each pass), so the first pass only runs
  over the lines that hold data (k^2 lines for a kernel, not n^2) and the
  inverse crops each axis before transforming the next one.
- Bounded: images are transformed in batches of at most `batch` images, so
  cuFFT's workspace (and our temporaries) stay bounded, and a fixed batch
  keeps hitting CuPy's cuFFT plan cache.
- The frequency-domain multiply-add is one batched matrix product per
  frequency: X (F, S, Cin) @ conj(K) (F, Cin, Cout) -> Y (F, S, Cout).
"""

from __future__ import annotations

from math import prod
from types import ModuleType
from typing import Any

from znni.primitives.base import Triple
from znni.primitives.fft_sizes import (
    CUFFT_EXTRA_FACTORS,
    good_size,
    padded_shape,
    spectrum_points,
)
from znni.primitives.gpu.workspace import Workspace
from znni.triple import as_triple

COMPLEX_BYTES = 8
TRANSFORM_TEMPS = 4  # live batch-sized temporaries in a pass, cuFFT's own workspace included


def cufft_size(n: int, even: bool = False) -> int:
    """Smallest 2^a 3^b 5^c 7^d >= n (even when `even`), where cuFFT is fastest."""
    return good_size(n, even, CUFFT_EXTRA_FACTORS)


def fft_shape(size: Triple) -> Triple:
    """The padded transform shape on the device (the shared rule, cuFFT's factors)."""
    return padded_shape(size, CUFFT_EXTRA_FACTORS)


def batch_images(fshape: Triple, batch_bytes: int) -> int:
    """How many images one bounded transform batch holds."""
    return max(1, batch_bytes // (spectrum_points(fshape) * COMPLEX_BYTES))


def kernel_group(cin: int, cout: int, batch: int, fshape: Triple, batch_bytes: int) -> int:
    """Output channels whose kernel spectra are recomputed together ('fft-recompute')."""
    per_channel = (cin + batch) * spectrum_points(fshape) * COMPLEX_BYTES
    return max(1, min(cout, batch_bytes // per_channel))


def fft_workspace_bytes(
    batch: int, cin: int, cout: int, size: Triple, keep: bool, batch_bytes: int
) -> int:
    """Upper bound of `fft_conv`'s temporaries (kept spectra are counted by their owner)."""
    fshape = fft_shape(size)
    nf = spectrum_points(fshape)
    g = cout if keep else kernel_group(cin, cout, batch, fshape, batch_bytes)
    images = max(batch * cin, batch * cout, 0 if keep else g * cin)  # the largest transform set
    b = min(batch_images(fshape, batch_bytes), images)
    total = batch * (cin + cout) * nf * COMPLEX_BYTES + TRANSFORM_TEMPS * b * nf * COMPLEX_BYTES
    if not keep:
        total += g * (cin + batch) * nf * COMPLEX_BYTES
    return total


def _forward_pruned(xp: ModuleType, a: Any, fshape: Triple, ws: Workspace) -> Any:
    """(b, nz, ny, nx) real -> (b, fz, fy, fx//2+1) complex64, zero-padded implicitly."""
    fz, fy, fx = fshape
    t1 = ws.take(xp.fft.rfft(a, n=fx, axis=-1))  # lines: b*nz*ny, only those with data
    t2 = ws.take(xp.fft.fft(t1, n=fy, axis=-2))  # lines: b*nz*(fx//2+1)
    ws.give(t1)
    del t1
    t3 = ws.take(xp.fft.fft(t2, n=fz, axis=-3))  # lines: b*fy*(fx//2+1)
    ws.give(t2)
    return t3.astype(xp.complex64, copy=False)


def _inverse_pruned(xp: ModuleType, t: Any, fshape: Triple, out_size: Triple, ws: Workspace) -> Any:
    """(b, fz, fy, fh) complex -> (b, oz, oy, ox) real: crop each axis before the next pass."""
    oz, oy, ox = out_size
    t1 = ws.take(xp.fft.ifft(t, axis=-3))
    t2 = ws.take(xp.fft.ifft(t1[:, :oz], axis=-2))  # only the oz planes that reach the output
    ws.give(t1)
    del t1
    r = ws.take(xp.fft.irfft(t2[:, :, :oy], n=fshape[2], axis=-1))  # only oz*oy lines
    ws.give(t2)
    return r  # (b, oz, oy, fx): the caller keeps [..., :ox]


def kernel_spectra(
    xp: ModuleType, w: Any, fshape: Triple, batch_bytes: int, ws: Workspace, out: Any = None
) -> Any:
    """conj(FFT(w)) laid out (F, Cin, Cout) complex64, transformed in bounded batches.

    Written into `out` (kept spectra, owned by the caller) or a new workspace array.
    """
    cout, cin = w.shape[:2]
    nf = spectrum_points(fshape)
    if out is None:
        spec = ws.take(xp.empty((nf, cin * cout), dtype=xp.complex64))  # (F, Cin*Cout)
    else:
        spec = out.reshape(nf, cin * cout)  # (F, Cin*Cout), a view of out
    # Cin-major images, so the spectra are the right-hand operand of the per-frequency
    # products as they lie: (F, S, Cin) @ (F, Cin, Cout), no transposed copy per call
    wt = ws.take(xp.ascontiguousarray(w.transpose(1, 0, 2, 3, 4)))  # (Cin, Cout, k)
    images = wt.reshape(cin * cout, *w.shape[2:])
    step = batch_images(fshape, batch_bytes)
    for i0 in range(0, cin * cout, step):
        t = _forward_pruned(xp, images[i0 : i0 + step], fshape, ws)
        spec[:, i0 : i0 + t.shape[0]] = xp.conj(t.reshape(t.shape[0], nf)).T
        ws.give(t)
    ws.give(wt)
    return spec.reshape(nf, cin, cout)  # (F, Cin, Cout)


def fft_conv(
    xp: ModuleType,
    x: Any,
    w: Any,
    b: Any,
    out: Any,
    ws: Workspace,
    batch_bytes: int,
    spectra: Any | None = None,
) -> None:
    """out[...] = valid cross-correlation of x (S, Cin, n) with w (Cout, Cin, k), plus b.

    `spectra` are kept kernel spectra from `kernel_spectra` ('fft-keep'); None
    recomputes them in groups of output channels with pruned transforms.
    """
    s, cin = x.shape[:2]
    cout = w.shape[0]
    size = as_triple(x.shape[2:])
    fshape = fft_shape(size)
    nf = spectrum_points(fshape)
    step = batch_images(fshape, batch_bytes)
    xs = ws.take(xp.empty((nf, s * cin), dtype=xp.complex64))  # (F, S*Cin)
    images = x.reshape(s * cin, *size)
    for i0 in range(0, s * cin, step):
        t = _forward_pruned(xp, images[i0 : i0 + step], fshape, ws)
        xs[:, i0 : i0 + t.shape[0]] = t.reshape(t.shape[0], nf).T
        ws.give(t)
        del t
    ys = ws.take(xp.empty((nf, s, cout), dtype=xp.complex64))  # (F, S, Cout)
    x3 = xs.reshape(nf, s, cin)  # (F, S, Cin)
    if spectra is not None:
        xp.matmul(x3, spectra, out=ys)  # (F, S, Cin) @ (F, Cin, Cout)
    else:
        g = kernel_group(cin, cout, s, fshape, batch_bytes)
        for o0 in range(0, cout, g):
            spec = kernel_spectra(xp, w[o0 : o0 + g], fshape, batch_bytes, ws)  # (F, Cin, g)
            part = ws.take(xp.matmul(x3, spec))  # (F, S, g)
            ys[:, :, o0 : o0 + g] = part
            ws.give(spec, part)
            del spec, part
    ws.give(xs)
    del xs, x3
    _inverse_into(xp, ys.reshape(nf, s * cout), fshape, out, step, ws)
    ws.give(ys)
    out += b.reshape(1, cout, 1, 1, 1)


def _inverse_into(
    xp: ModuleType, ys: Any, fshape: Triple, out: Any, step: int, ws: Workspace
) -> None:
    """Inverse-transform the (F, S*Cout) spectra into out (S, Cout, o), `step` images at a time."""
    s, cout = out.shape[:2]
    out_size = as_triple(out.shape[2:])
    fh = fshape[2] // 2 + 1
    out_images = out.reshape(s * cout, *out_size)  # a view of out
    for j0 in range(0, s * cout, step):
        j1 = min(j0 + step, s * cout)
        t = ws.take(xp.ascontiguousarray(ys[:, j0:j1].T))  # (b, F)
        r = _inverse_pruned(xp, t.reshape(j1 - j0, fshape[0], fshape[1], fh), fshape, out_size, ws)
        ws.give(t)
        out_images[j0:j1] = r[..., : out_size[2]]
        ws.give(r)
        del t, r


def fft_flops(batch: int, cin: int, cout: int, size: Triple) -> int:
    """Rough flop count (ZNNi's model), used only to pick a default primitive."""
    n = prod(fft_shape(size))
    return int(batch * (cin + cout) * 2.5 * n * max(1, n.bit_length()) + 4 * batch * cin * cout * n)
