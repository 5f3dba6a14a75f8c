"""Padded and pruned FFT convolution (ZNNi, SC16), on pyFFTW.

Cross-correlation is a product with the conjugate kernel spectrum. Transforms
run at the smallest good size N >= n (not n + k - 1): circular wrap-around
only reaches outputs past n - k, which valid convolution discards. Forward
transforms are pruned: a (a, b, c) image zero-padded to N needs rfft on a*b
x-lines, fft on a*Fx y-lines and on Ny*Fx z-lines. Inverse transforms are
pruned the other way: all z-lines, then only the oz*Fx y-lines and oz*oy
x-lines that reach the valid output. Each input image is transformed once
per layer; the frequency-domain multiply-add is spectra (F, Cout, Cin) @
inputs (F, Cin, S), the frequency range split over a thread pool.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from math import prod

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation, Triple
from znni.primitives.cpu.fftw_plans import PlanCache, Workspace
from znni.primitives.cpu.threads import blas_single_thread
from znni.primitives.fft_sizes import padded_shape
from znni.triple import as_triple

COMPLEX_BYTES = 8
FLOAT_BYTES = 4
RECOMPUTE_BYTES = 2**27  # kernel spectra made this many bytes of output channels at a time
FFT_WORK_BYTES = 2**29  # input and output spectra of one chunk of samples (fft_conv3d)


def spectrum_shape(padded: Triple) -> Triple:
    """(Nz, Ny, Fx) of an rfft over the padded shape."""
    return (padded[0], padded[1], padded[2] // 2 + 1)


def forward_builder(b: int, size: Triple, padded: Triple) -> Callable[[PlanCache], Workspace]:
    nz, ny, _ = size
    nzp, nyp, nxp = padded

    def build(cache: PlanCache) -> Workspace:
        ws = Workspace()
        a = ws.array("a", (b, nz, ny, nxp), np.float32)
        d = ws.array("d", (b, *spectrum_shape(padded)), np.complex64)
        ws.plans["x"] = cache.fftw(a, d[:, :nz, :ny], -1)
        ws.plans["y"] = cache.fftw(d[:, :nz], d[:, :nz], -2)
        ws.plans["z"] = cache.fftw(d, d, -3)
        return ws

    del nzp, nyp
    return build


def pruned_rfftn(
    cache: PlanCache, images: np.ndarray, padded: Triple
) -> tuple[Workspace, tuple[Hashable, ...]]:
    """Spectra of real (b, a, c, e) images zero-padded to `padded`: ws.arrays['d'] (b, Nz, Ny, Fx).

    The caller must `cache.checkin(key, ws)` once done with the spectra.
    """
    b = images.shape[0]
    size = as_triple(images.shape[1:])
    nz, ny, nx = size
    key = ("rfftn", b, size, padded)
    ws = cache.checkout(key, forward_builder(b, size, padded))
    a, d = ws.arrays["a"], ws.arrays["d"]
    a[..., :nx] = images
    a[..., nx:] = 0
    ws.plans["x"].execute()  # nz*ny lines
    d[:, :nz, ny:] = 0
    ws.plans["y"].execute()  # nz*Fx lines
    d[:, nz:] = 0
    ws.plans["z"].execute()  # Ny*Fx lines
    return ws, key


def inverse_builder(b: int, padded: Triple, out: Triple) -> Callable[[PlanCache], Workspace]:
    oz, oy, _ = out

    def build(cache: PlanCache) -> Workspace:
        ws = Workspace()
        y = ws.array("y", (b, *spectrum_shape(padded)), np.complex64)
        r = ws.array("r", (b, oz, oy, padded[2]), np.float32)
        ws.plans["z"] = cache.fftw(y, y, -3, "FFTW_BACKWARD")
        ws.plans["y"] = cache.fftw(y[:, :oz], y[:, :oz], -2, "FFTW_BACKWARD")
        ws.plans["x"] = cache.fftw(y[:, :oz, :oy], r, -1, "FFTW_BACKWARD")
        return ws

    return build


def inverse_workspace(
    cache: PlanCache, b: int, padded: Triple, out: Triple
) -> tuple[Workspace, tuple[Hashable, ...]]:
    key = ("irfftn", b, padded, out)
    return cache.checkout(key, inverse_builder(b, padded, out)), key


def pruned_irfftn(ws: Workspace) -> np.ndarray:
    """Unnormalised inverse of ws.arrays['y'] into ws.arrays['r'] (b, oz, oy, Nx), pruned."""
    ws.plans["z"].execute()  # all Ny*Fx lines
    ws.plans["y"].execute()  # oz*Fx lines
    ws.plans["x"].execute()  # oz*oy lines
    return ws.arrays["r"]


def kernel_spectra_into(
    cache: PlanCache, weight: np.ndarray, padded: Triple, out: np.ndarray, chunk_bytes: int
) -> None:
    """Write conj(rfftn(w / N^3)) as (F, Cout, Cin) into `out`, Cout chunked to bound memory."""
    cout, cin = weight.shape[:2]
    nf = prod(spectrum_shape(padded))
    scale = np.float32(1.0 / prod(padded))
    oc = max(1, min(cout, chunk_bytes // max(1, cin * nf * COMPLEX_BYTES)))
    for o0 in range(0, cout, oc):
        o1 = min(cout, o0 + oc)
        w = weight[o0:o1].reshape((o1 - o0) * cin, *weight.shape[2:]) * scale
        ws, key = pruned_rfftn(cache, w, padded)
        d = ws.arrays["d"].reshape(o1 - o0, cin, nf)  # (oc, Cin, F)
        np.conjugate(d.transpose(2, 0, 1), out=out[:, o0:o1, :])
        cache.checkin(key, ws)
        del ws, d  # a workspace over the cache bound is freed now, not at the next chunk


def kernel_spectra(
    cache: PlanCache, weight: np.ndarray, padded: Triple, chunk_bytes: int
) -> np.ndarray:
    """(F, Cout, Cin) complex64 kernel spectra for correlation at `padded`, scaled by 1/N^3."""
    cout, cin = weight.shape[:2]
    out = np.empty((prod(spectrum_shape(padded)), cout, cin), dtype=np.complex64)
    kernel_spectra_into(cache, weight, padded, out, chunk_bytes)
    return out


def freq_product(
    pool: ThreadPoolExecutor,
    k: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    chunk_f: int,
    raw: bool = False,
) -> None:
    """y[s, o, f] = sum_i k[f, o, i] x[s, i, f] as (F, Co, Ci) @ (F, Ci, S) per frequency chunk.

    With `raw`, k is the unconjugated (Co, Ci, F) output of the transforms, conjugated
    and transposed one chunk at a time (no full-size transposition pass).
    """
    nf = x.shape[2]

    def task(f0: int) -> None:
        f1 = min(nf, f0 + chunk_f)
        xt = np.ascontiguousarray(x[:, :, f0:f1].transpose(2, 1, 0))  # (fc, Ci, S)
        if raw:
            kc = np.conjugate(k[:, :, f0:f1].transpose(2, 0, 1))  # (fc, Co, Ci)
        else:
            kc = k[f0:f1]
        yt = np.matmul(kc, xt)  # (fc, Co, S)
        y[:, :, f0:f1] = yt.transpose(2, 1, 0)

    with blas_single_thread():
        list(pool.map(task, range(0, nf, chunk_f)))


def _chunk_f(cin: int, cout: int, s: int) -> int:
    """Frequencies per task: about 1 MiB of inputs and outputs, at least 64."""
    return int(max(64, (2**20) // ((cin + cout) * s * COMPLEX_BYTES)))


def output_step(
    pool: ThreadPoolExecutor,
    r: np.ndarray,
    bias: np.ndarray,
    out: np.ndarray,
    activation: Activation | None,
) -> None:
    """out (s, Co, oz, oy, ox) = act(r[..., :ox] + bias), split over the pool in row blocks.

    Each task works on a C-contiguous block of (sample, channel) rows: numpy 2.4's in-place
    unary ufuncs (np.negative(v, out=v)) give wrong results on some strided views.
    """
    s, co = out.shape[:2]
    ox = out.shape[-1]
    rows = s * co
    out2 = out.reshape(rows, *out.shape[2:])  # (s*Co, oz, oy, ox), a view: out is contiguous
    bias_rows = np.tile(bias.astype(np.float32), s).reshape(rows, 1, 1, 1)
    step = max(1, -(-rows // (4 * pool._max_workers)))

    def task(r0: int) -> None:
        r1 = min(rows, r0 + step)
        block = out2[r0:r1]
        np.add(r[r0:r1, ..., :ox], bias_rows[r0:r1], out=block)
        if activation is not None:
            apply_activation(block, activation)

    list(pool.map(task, range(0, rows, step)))


def samples_per_chunk(cin: int, cout: int, padded: Triple, work_bytes: int) -> int:
    """Samples whose input and output spectra fit `work_bytes` (at least 1)."""
    per_sample_bytes = (cin + cout) * prod(spectrum_shape(padded)) * COMPLEX_BYTES
    return max(1, work_bytes // per_sample_bytes)


def fft_conv3d(
    cache: PlanCache,
    pool: ThreadPoolExecutor,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    activation: Activation | None,
    spectra: np.ndarray | None,
    *,
    work_bytes: int = FFT_WORK_BYTES,
    recompute_bytes: int = RECOMPUTE_BYTES,
) -> np.ndarray:
    """FFT conv of (S, Cin, n) with kept `spectra` (F, Cout, Cin), or pruned recompute if None.

    Samples are processed in chunks whose transforms fit `work_bytes`; recomputed
    kernel spectra are made `recompute_bytes` of output channels at a time.
    """
    s, cin = x.shape[:2]
    size: Triple = (int(x.shape[2]), int(x.shape[3]), int(x.shape[4]))
    cout = weight.shape[0]
    out_size = as_triple(n - k + 1 for n, k in zip(size, weight.shape[2:], strict=True))
    padded = padded_shape(size)
    nf = prod(spectrum_shape(padded))
    out = np.empty((s, cout, *out_size), dtype=np.float32)
    sc = min(s, samples_per_chunk(cin, cout, padded, work_bytes))
    for s0 in range(0, s, sc):
        s1 = min(s, s0 + sc)
        images = x[s0:s1].reshape((s1 - s0) * cin, *size)  # (sc*Cin, nz, ny, nx)
        fws, fkey = pruned_rfftn(cache, images, padded)
        xs = fws.arrays["d"].reshape(s1 - s0, cin, nf)  # (sc, Cin, F)
        iws, ikey = inverse_workspace(cache, (s1 - s0) * cout, padded, out_size)
        ys = iws.arrays["y"].reshape(s1 - s0, cout, nf)  # (sc, Cout, F)
        chunk = _chunk_f(cin, cout, s1 - s0)
        if spectra is not None:
            freq_product(pool, spectra, xs, ys, chunk)
        else:
            oc = max(1, min(cout, recompute_bytes // max(1, cin * nf * COMPLEX_BYTES)))
            scale = np.float32(1.0 / prod(padded))
            for o0 in range(0, cout, oc):
                o1 = min(cout, o0 + oc)
                w = weight[o0:o1].reshape((o1 - o0) * cin, *weight.shape[2:]) * scale
                kws, kkey = pruned_rfftn(cache, w, padded)
                k = kws.arrays["d"].reshape(o1 - o0, cin, nf)  # (oc, Cin, F)
                freq_product(pool, k, xs, ys[:, o0:o1], chunk, raw=True)
                cache.checkin(kkey, kws)
                del kws, k
        cache.checkin(fkey, fws)
        del fws, xs  # workspaces the cache does not keep (over its bound) are freed here,
        r = pruned_irfftn(iws)  # (sc*Cout, oz, oy, Nx)
        output_step(pool, r, bias, out[s0:s1], activation)
        cache.checkin(ikey, iws)
        del iws, ys, r  # not when the next chunk's workspaces are already allocated
    return out
