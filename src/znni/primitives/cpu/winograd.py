"""Winograd minimal filtering F(m, 3) in 3D: valid cross-correlation with 3x3x3 kernels.

Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (CVPR 2016): an output
tile of m^3 voxels is Y = A^T [(G w G^T) . (B^T d B)] A applied on each axis, from an input
tile d of alpha^3 voxels, alpha = m + 2. Summed over input channels, the element-wise
products become alpha^3 independent (Cout x Cin) @ (Cin x T) GEMMs over T tiles: 216/64 =
3.4 multiplies per output and input channel for F(4,3) instead of 27.

The transforms follow the Toom-Cook construction (Lavin & Gray, sec. 4; the `wincnn`
generator): with points p_j plus the point at infinity, G and A evaluate the kernel and
output polynomials at the points, B^T is the transposed interpolation (inverse
Vandermonde) matrix, the Lagrange denominators moved into G. F(4,3) uses the points
0, 1, -1, 1/2, -2 (Barabasz, Anderson, Soodhalter & Gregg, "Error analysis and improving
the accuracy of Winograd convolution for deep neural networks", ACM TOMS 2020): in float32
with 32 channels and N(0,1) inputs, max|error| / max|ref| is 5e-6 there against 2.6e-5
with 0, +-1, +-1/2 (both within the 1e-4 bound). F(2,3) uses 0, 1, -1. F(6,3) (alpha = 8:
512/216 = 2.4 multiplies per output and input channel, and 30% less V and M per output)
uses 0, +-1, +-1/2, +-2: 4-5e-5 on the same statistics (16-128 channels, 8^3-96^3; the
points +-3/2 or +-3 instead of +-2 gave 7e-5 and 3e-4), so the planner offers it only for
the big layers where it measures faster and only after `tile_error` on the layer's own
weights (winograd_error.py, planner/graph/winograd_costs.py).

Layout: a chunk of tiles (one sample, a range of z-tile rows and y-tile rows, every x
tile) is transformed axis by axis (x, then y, then z) as GEMMs with B^T (alpha x alpha) on strided
windows of the previous pass (x windows gathered first), ending in V (alpha^3, Cin, T);
one batched matmul with the kernel transform U (alpha^3, Cout, Cin) gives M (alpha^3,
Cout, T); three GEMMs with A^T give (m^3, Cout, T), which gets the bias and activation
and is scattered into the output.
Chunks hold about `chunk_bytes` of V + M, and run on the thread pool with BLAS
single-threaded inside, like direct_conv.py. The x windows are gathered straight from the
conv's input, which may be several channel parts (a decoder's skip and upsampled tensors)
with zero pads around them: voxels before the start (the pads) or past the end (edge
tiles where an output side is not a multiple of m) read as zeros, and edge tiles are
cropped as they are written, so no concatenated, padded or cropped copy is ever made.

The kernel transform (8 ms for 128 x 128 channels) is cached in an LRU bounded in bytes,
keyed by id(weight) and checked against a kept copy, so an in-place change is never stale.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from itertools import product

import numpy as np
from numpy.lib.stride_tricks import as_strided

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.cpu.threads import blas_single_thread

FLOAT_BYTES = 4
# V (alpha^3, Cin, T) + M (alpha^3, Cout, T) per chunk of T tiles: BasicUNet windows ran
# 5% (64^3) and 13% (96^3) faster with 4 MiB than with 8, valid U-Net 132^3 5% (2026-11-23)
CHUNK_BYTES = 2**22
POINTS: dict[int, tuple[float, ...]] = {
    2: (0.0, 1.0, -1.0),
    4: (0.0, 1.0, -1.0, 0.5, -2.0),
    6: (0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0),
}
# the CPU conv primitives (primitives/cpu/backend.py) that run F(m, 3), by their m
PRIMITIVE_TILES = {"winograd": 4, "winograd6": 6}
# kernel transforms kept (with a copy of their weight): every conv of a U-Net window comes
# back each window, so the bound is bytes (BasicUNet(16..128): 52 MB), not a few entries
CACHE_BYTES = 256 * 2**20
KERNEL_BLOCK_BYTES = 2**21  # float64 transform of a block of output channels at a time
# a chunk's fixed cost (some 40 numpy calls and 216 small GEMMs) outweighs splitting
# fewer tiles over the cores: 8^3 outputs (8 tiles), 64->64 and 128->64 channels, ran
# 15-20% faster in one chunk than in four, 16^3 ones 15-25% faster in two than in four
# (2 workers, CI kind, 2026-11-23); 32^3 ones unchanged
MIN_CHUNK_TILES = 32
# floats: shorter window rows are gathered before their B^T GEMM. 12 rather than 16: rows
# of 12-13 tiles (48^3 and 52^3 outputs) ran 11-25% faster by per-window GEMMs, rows of
# 10-11 7-30% slower (16-32 channels, medians of 11 alternated, CI kind, 2026-11-24)
SHORT_ROW = 12

Chunk = tuple[int, int, int, int, int]  # (sample, z-tile 0, z-tile 1, y-tile 0, y-tile 1)

_cache: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()
_cache_lock = threading.Lock()


@cache
def transforms(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T (m, alpha), G (alpha, 3), B^T (alpha, alpha)) in float64 for F(m, 3)."""
    if m not in POINTS:
        raise ValueError(f"Winograd tile size m must be one of {sorted(POINTS)}, got {m}")
    pts = np.array(POINTS[m])
    alpha = m + 2

    def evaluate(n: int) -> np.ndarray:  # (alpha, n): a degree n-1 polynomial at each point
        e = np.zeros((alpha, n))
        e[:-1] = pts[:, None] ** np.arange(n)
        e[-1, -1] = 1.0  # the point at infinity: the leading coefficient
        return e

    denom = np.ones(alpha)
    for j, p in enumerate(pts):
        denom[j] = np.prod([p - q for i, q in enumerate(pts) if i != j])
    g = evaluate(3) / denom[:, None]
    bt = np.linalg.inv(evaluate(alpha)).T * denom[:, None]
    return evaluate(m).T, g, bt


def kernel_transform(weight: np.ndarray, m: int = 4) -> np.ndarray:
    """U = G w G^T on each axis, (alpha^3, Cout, Cin) float32, computed in float64 a block
    of output channels at a time: whole, its float64 temporaries were 5x U's float32 bytes
    (74 MB at once for 128 -> 128 channels, the first window's peak of a MONAI UNet)."""
    _, g, _ = transforms(m)
    cout, cin = int(weight.shape[0]), int(weight.shape[1])
    alpha = m + 2
    u = np.empty((alpha**3, cout, cin), np.float32)  # (A3, Cout, Cin)
    step = max(1, KERNEL_BLOCK_BYTES // (8 * alpha**3 * cin))
    for c0 in range(0, cout, step):
        w = weight[c0 : c0 + step].astype(np.float64)  # (c, Cin, 3, 3, 3)
        t = np.tensordot(g, w, axes=([1], [2]))  # (az, c, Cin, 3, 3)
        t = np.tensordot(g, t, axes=([1], [3]))  # (ay, az, c, Cin, 3)
        t = np.tensordot(g, t, axes=([1], [4]))  # (ax, ay, az, c, Cin)
        u[:, c0 : c0 + len(w)] = t.transpose(2, 1, 0, 3, 4).reshape(-1, len(w), cin)
    return u


def cached_kernel_transform(weight: np.ndarray, m: int) -> np.ndarray:
    """`kernel_transform`, reused while the same unchanged weight array comes back."""
    key = (id(weight), m)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0].shape == weight.shape and np.array_equal(hit[0], weight):
            _cache.move_to_end(key)
            return hit[1]
    u = kernel_transform(weight, m)
    with _cache_lock:
        _cache[key] = (np.array(weight, copy=True), u)
        while len(_cache) > 1 and _cached_bytes() > CACHE_BYTES:
            _cache.popitem(last=False)
    return u


def _cached_bytes() -> int:
    return sum(w.nbytes + u.nbytes for w, u in _cache.values())


def _windows(a: np.ndarray, axis: int, count: int, alpha: int, m: int) -> np.ndarray:
    """View of `a` with `axis` replaced by (count, alpha): overlapping windows at stride m."""
    shape = a.shape[:axis] + (count, alpha) + a.shape[axis + 1 :]
    st = a.strides
    strides = st[:axis] + (m * st[axis], st[axis]) + st[axis + 1 :]
    return as_strided(a, shape, strides, writeable=False)


def _transform_axis(bt: np.ndarray, win: np.ndarray) -> np.ndarray:
    """B^T along the window axis of `win` (B, t, alpha, L) -> (alpha', B, t, L). Short rows
    (L < SHORT_ROW) are gathered first into one big GEMM: small per-window GEMMs cost 4x
    more there (64^2 channels, tx = 8), while gathering costs 2x more on long rows."""
    alpha = bt.shape[0]
    out = np.empty((alpha, *win.shape[:2], win.shape[3]), np.float32)  # (alpha', B, t, L)
    if win.shape[3] >= SHORT_ROW:
        np.matmul(bt, win, out=out.transpose(1, 2, 0, 3))  # per-window GEMMs, no copy
        return out
    np.copyto(out.transpose(1, 2, 0, 3), win)  # (alpha, B, t, L) gathered windows
    return np.matmul(bt, out.reshape(alpha, -1)).reshape(out.shape)


def input_transform(
    parts: Sequence[np.ndarray],
    lo: tuple[int, int, int],
    bt: np.ndarray,
    m: int,
    tiles: tuple[int, int, int],
) -> np.ndarray:
    """V = B^T d B on each axis of every tile -> (alpha^3, Cin, T), alpha order (z, y, x),
    tiles in (tz, ty, tx) order. The tiles' input is the channel concatenation of `parts`
    (Cin_i, Z, Y, X) from voxel `lo` on, which may lie before 0 or run past the end (a
    conv's zero pads, the volume's far edge): voxels outside read as zeros, so neither the
    padded input nor the concatenation is ever built."""
    alpha = m + 2
    tz, ty, tx = tiles
    zs, ys = tz * m + 2, ty * m + 2
    g = _gather_x(parts, lo, (zs, ys, tx), m)  # (ax, Cin, zs, ys, tx)
    cin = g.shape[1]
    p1 = np.matmul(bt, g.reshape(alpha, -1))  # (ax', Cin*zs*ys*tx)
    del g
    w1 = _windows(p1.reshape(alpha * cin * zs, ys, tx), 1, ty, alpha, m)  # (., ty, ay, tx)
    p2 = _transform_axis(bt, w1)  # (ay', ax'*Cin*zs, ty, tx)
    del p1, w1
    w2 = _windows(p2.reshape(alpha * alpha * cin, zs, ty * tx), 1, tz, alpha, m)
    v = _transform_axis(bt, w2)  # (az', ay'*ax'*Cin, tz, ty*tx)
    return v.reshape(alpha**3, cin, tz * ty * tx)  # (A3, Cin, T), alpha order (z, y, x)


def _span(lo: int, length: int, n: int) -> tuple[int, int]:
    """[d0, d1): the positions d of a run of `length` from `lo` with 0 <= lo + d < n."""
    d0 = min(length, max(0, -lo))
    return d0, max(d0, min(length, n - lo))


def _gather_x(
    parts: Sequence[np.ndarray], lo: tuple[int, int, int], size: tuple[int, int, int], m: int
) -> np.ndarray:
    """The x windows of every tile, (alpha, Cin, zs, ys, tx): window j of x offset a reads
    x = lo_x + j*m + a of the parts' channels stacked, zeros outside them."""
    alpha = m + 2
    zs, ys, tx = size
    zv, yv, xv = parts[0].shape[1:]
    cin = sum(p.shape[0] for p in parts)
    g = np.empty((alpha, cin, zs, ys, tx), np.float32)  # (ax, Cin, zs, ys, tx)
    z0, z1 = _span(lo[0], zs, zv)
    y0, y1 = _span(lo[1], ys, yv)
    for a in range(alpha):  # x windows' offset a: x = lo_x + a + j*m, every m-th voxel
        first = lo[2] + a
        j0 = min(tx, max(0, -(first // m)))  # first j with x >= 0
        j1 = max(j0, min(tx, (xv - 1 - first) // m + 1))  # past the last j with x < xv
        c = 0
        for part in parts if j1 > j0 and z1 > z0 and y1 > y0 else ():  # (Cin_i, Z, Y, X)
            src = part[:, lo[0] + z0 : lo[0] + z1, lo[1] + y0 : lo[1] + y1,
                       first + j0 * m : first + (j1 - 1) * m + 1 : m]
            g[a, c : c + part.shape[0], z0:z1, y0:y1, j0:j1] = src
            c += part.shape[0]
        g[a, :, z0:z1, y0:y1, :j0] = 0.0
        g[a, :, z0:z1, y0:y1, j1:] = 0.0
    g[:, :, :z0] = 0.0
    g[:, :, z1:] = 0.0
    g[:, :, z0:z1, :y0] = 0.0
    g[:, :, z0:z1, y1:] = 0.0
    return g


def output_transform(mt: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Y = A^T M A on each axis: (alpha^3, Cout, T) -> (m^3, Cout, T), order (z, y, x)."""
    m, alpha = at.shape
    rest = mt.shape[1] * mt.shape[2]
    y = np.matmul(at, mt.reshape(alpha, alpha * alpha * rest))  # (mz, ay*ax*Cout*T)
    y = np.matmul(at, y.reshape(m, alpha, alpha * rest))  # (mz, my, ax*Cout*T)
    y = np.matmul(at, y.reshape(m * m, alpha, rest))  # (mz*my, mx, Cout*T)
    return y.reshape(m**3, mt.shape[1], mt.shape[2])  # (m^3, Cout, T)


def chunks(s: int, tiles: tuple[int, int, int], per_chunk: int, workers: int) -> list[Chunk]:
    """(sample, z0, z1, y0, y1) tile ranges of at most about `per_chunk` tiles, every x tile
    each, halved while there are fewer than 2 per worker, more than one tile row to split,
    and the halves keep MIN_CHUNK_TILES; the rows are then dealt into that many near-equal
    runs (`_runs`)."""
    tz, ty, tx = tiles
    per_chunk = max(1, per_chunk)
    if ty * tx <= per_chunk:
        zb, yb = max(1, min(tz, per_chunk // (ty * tx))), ty
    else:
        zb, yb = 1, max(1, min(ty, per_chunk // tx))
    while s * -(-tz // zb) * -(-ty // yb) < 2 * workers and (zb > 1 or yb > 1):
        half = (zb // 2, yb) if zb > 1 else (zb, yb // 2)
        if half[0] * half[1] * tx < MIN_CHUNK_TILES:
            break
        zb, yb = half
    return [(si, z0, z1, y0, y1) for si in range(s) for z0, z1 in _runs(tz, zb)
            for y0, y1 in _runs(ty, yb)]


def _runs(rows: int, step: int) -> list[tuple[int, int]]:
    """[r0, r1) runs of at most `step` rows, as many as steps of `step` need, lengths
    differing by one at most: a chunk's fixed cost (its numpy calls and alpha^3 GEMMs) is
    paid as often for a last run of one row as for a full one. 17 rows by 8 made 8, 8, 1,
    now 6, 5, 6: ragged 66^3 outputs (16 -> 16) 35.8 -> 31.0 ms, 35^3 (48 -> 48) 23.4 ->
    21.6 ms alone (medians of 9 alternated, CI kind, 2026-11-24)."""
    k = -(-rows // step)
    edges = [round(i * rows / k) for i in range(k + 1)]
    return list(zip(edges, edges[1:], strict=False))


def run_shared(
    pool: ThreadPoolExecutor | None, items: list[Chunk], fn: Callable[[Chunk], None]
) -> None:
    """fn on every item, pulled from a shared queue by each pool worker (BLAS single-threaded
    inside), so a busy core takes fewer; without a pool, in the calling thread."""
    todo = iter(items)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                item = next(todo, None)
            if item is None:
                return
            fn(item)

    if pool is None:
        worker()
        return
    with blas_single_thread():
        futures = [pool.submit(worker) for _ in range(min(pool._max_workers, len(items)))]
        for f in futures:
            f.result()


def _check(shape: tuple[int, ...], weight: np.ndarray, m: int) -> None:
    """`shape`: the (padded, concatenated) input's."""
    if weight.ndim != 5 or tuple(weight.shape[2:]) != (3, 3, 3):
        raise ValueError(f"Winograd conv takes 3x3x3 kernels only, got weight {weight.shape}")
    if len(shape) != 5 or shape[1] != weight.shape[1] or min(shape[2:]) < 3:
        raise ValueError(f"input {shape} does not fit weight {weight.shape}")
    transforms(m)  # ValueError for an unsupported m


def channel_parts(
    x: np.ndarray | Sequence[np.ndarray], pads: Sequence[int]
) -> tuple[list[np.ndarray], tuple[int, ...], tuple[int, ...]]:
    """(float32 channel parts, pads, shape of the padded concatenation they stand for)."""
    parts = [np.asarray(x, np.float32)] if isinstance(x, np.ndarray) else [
        np.asarray(p, np.float32) for p in x]
    p = tuple(int(v) for v in pads)
    if not parts or len(p) != 6 or min(p) < 0:
        raise ValueError(f"need one or more channel parts and six pads >= 0, got "
                         f"{len(parts)} parts and pads {tuple(pads)}")
    head = parts[0].shape
    if any(a.ndim != 5 or a.shape[0] != head[0] or a.shape[2:] != head[2:] for a in parts):
        raise ValueError(f"channel parts must be 5-d and agree on every axis but 1, got "
                         f"{[a.shape for a in parts]}")
    size = tuple(head[2 + a] + p[a] + p[a + 3] for a in range(3))
    return parts, p, (head[0], sum(a.shape[1] for a in parts), *size)


def winograd_conv3d(
    x: np.ndarray | Sequence[np.ndarray],
    weight: np.ndarray,
    bias: np.ndarray,
    activation: Activation | None = None,
    *,
    pool: ThreadPoolExecutor | None = None,
    m: int = 4,
    chunk_bytes: int = CHUNK_BYTES,
    pads: Sequence[int] = (0,) * 6,
) -> np.ndarray:
    """Valid cross-correlation (S, Cin, n) x (Cout, Cin, 3, 3, 3) -> (S, Cout, n - 2), fused
    bias/activation, float32. `x` may be a list of channel parts (S, Cin_i, n) read as their
    concatenation, and `pads` (z, y, x before, z, y, x after) zeros around it, neither
    built (a U-Net decoder's concat and every padded conv). Chunks run on `pool` with BLAS
    single-threaded inside; with no pool, in the calling thread (BLAS threads as they are)."""
    parts, p, shape = channel_parts(x, pads)
    _check(shape, weight, m)
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    s, cin, cout = shape[0], shape[1], int(weight.shape[0])
    out_size = tuple(n - 2 for n in shape[2:])
    tz, ty, tx = (-(-o // m) for o in out_size)
    at, _, bt = (t.astype(np.float32) for t in transforms(m))
    u = cached_kernel_transform(weight, m)  # (A3, Cout, Cin)
    b2 = np.asarray(bias, dtype=np.float32).reshape(1, cout, 1)
    out = np.empty((s, cout, *out_size), np.float32)  # (S, Cout, oz, oy, ox)
    per_chunk = chunk_bytes // (FLOAT_BYTES * (m + 2) ** 3 * (cin + cout))
    workers = pool._max_workers if pool is not None else 1

    def run_chunk(c: Chunk) -> None:
        si, z0, z1, y0, y1 = c
        lo = (z0 * m - p[0], y0 * m - p[1], -p[2])  # the chunk's first voxel in the parts
        v = input_transform([a[si] for a in parts], lo, bt, m, (z1 - z0, y1 - y0, tx))
        mt = np.matmul(u, v)  # (A3, Cout, T)
        del v
        y = output_transform(mt, at)  # (m^3, Cout, T)
        del mt
        y += b2
        if activation is not None:
            apply_activation(y, activation)
        y7 = y.reshape(m, m, m, cout, z1 - z0, y1 - y0, tx)  # (mz, my, mx, Cout, tz, ty, tx)
        scatter_tiles(out[si], y7.transpose(3, 4, 0, 5, 1, 6, 2), (z0 * m, y0 * m, 0))

    run_shared(pool, chunks(s, (tz, ty, tx), per_chunk, workers), run_chunk)
    return out


def scatter_tiles(out: np.ndarray, tiled: np.ndarray, origin: tuple[int, int, int]) -> None:
    """Write tiles (C, nz, mz, ny, my, nx, mx) into `out` (C, Z, Y, X) from `origin`, cropping
    the tiles that run past out's end: per axis the whole tiles, then the partial last one,
    each a strided view of `out` split into (tiles, tile) (no copy of either side)."""
    pieces = []
    for a in range(3):
        n, mm = tiled.shape[1 + 2 * a], tiled.shape[2 + 2 * a]
        length = min(n * mm, out.shape[1 + a] - origin[a])
        whole, rest = divmod(length, mm)
        axis = []
        if whole:
            axis.append((slice(0, whole), slice(0, mm), whole, mm, 0))
        if rest:
            axis.append((slice(whole, whole + 1), slice(0, rest), 1, rest, whole * mm))
        pieces.append(axis)
    for pz, py, px in product(*pieces):
        dst = out[:, origin[0] + pz[4] : origin[0] + pz[4] + pz[2] * pz[3],
                  origin[1] + py[4] : origin[1] + py[4] + py[2] * py[3],
                  origin[2] + px[4] : origin[2] + px[4] + px[2] * px[3]]
        st = dst.strides
        split = as_strided(  # (C, nz, mz, ny, my, nx, mx): a view of out
            dst, (dst.shape[0], pz[2], pz[3], py[2], py[3], px[2], px[3]),
            (st[0], pz[3] * st[1], st[1], py[3] * st[2], st[2], px[3] * st[3], st[3]))
        split[...] = tiled[:, pz[0], pz[1], py[0], py[1], px[0], px[1]]
