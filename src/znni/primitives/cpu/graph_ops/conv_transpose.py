"""Transposed 3D convolution (ONNX ConvTranspose / torch ConvTranspose3d).

U-Net decoders upsample with k == s, pad 0 transposed convs: each input voxel
then owns a disjoint kz*ky*kx output block, so a GEMM per slab of z planes plus
strided copies write the whole output, the slabs on all cores. Other settings
overlap: per slab of z planes one GEMM for every kernel offset, each offset's rows added
into a strided view of the uncropped output, non-overlapping slabs on all cores.
The upsampling case keeps a channels-last input (an OpenVINO layer's output,
engine.graph_forward) channels-last: one GEMM per slab with the channels as its inner
dimension on both sides, and no transposing copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.cpu.graph_ops._parallel import run_tiles
from znni.primitives.cpu.layout import is_channels_last
from znni.primitives.graph_args import (
    Six,
    Triple,
    as_volume,
    channel_vector,
    six,
    triple,
)
from znni.primitives.shapes import transpose_out_size
from znni.triple import as_triple

# bytes of one slab's GEMM result: stays in L2 for the strided copies out of it
SLAB_BYTES = 1 << 20
# the scatter path's slab product (all K offsets' rows), added out of it K times
SCATTER_SLAB_BYTES = 4 << 20


def _check(x: np.ndarray, weight: np.ndarray, groups: int) -> np.ndarray:
    """Validated float32 weight (Cin, Cout/groups, kz, ky, kx)."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 5:
        raise ValueError(f"weight must be 5-D (Cin, Cout/groups, kz, ky, kx), got {w.shape}")
    cin = x.shape[1]
    if groups < 1 or cin % groups:
        raise ValueError(f"groups={groups} must divide Cin={cin}")
    if w.shape[0] != cin:
        raise ValueError(f"weight has {w.shape[0]} input channels, x has Cin={cin}")
    return w


def conv_transpose3d(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    *,
    strides: Sequence[int],
    pads: Sequence[int],
    output_padding: Sequence[int] = (0, 0, 0),
    dilations: Sequence[int] = (1, 1, 1),
    groups: int = 1,
) -> np.ndarray:
    """y[n, co, i*s + k*d - pad_begin] += x[n, ci, i] * w[ci, co, k], plus bias -> float32."""
    x = as_volume(x)
    groups = int(groups)
    w = _check(x, weight, groups)
    s, d = triple(strides, "strides", 1), triple(dilations, "dilations", 1)
    p, op = six(pads), triple(output_padding, "output_padding", 0)
    kernel = as_triple(w.shape[2:])
    out = as_triple(
        transpose_out_size(x.shape[2 + i], kernel[i], s[i], d[i], p[i], p[i + 3], op[i])
        for i in range(3)
    )
    if min(out) < 1:
        raise ValueError(f"empty output {out}: input {x.shape[2:]}, kernel {kernel}, pads {p}")
    b = channel_vector(bias, w.shape[1] * groups, "bias")
    if kernel == s and not any(p) and not any(op) and d == (1, 1, 1):
        if groups == 1 and is_channels_last(x):
            return _upsample_gemm_last(x, w, b)
        return _upsample_gemm(x, w, b, groups)
    y = _scatter(x, w, groups, s, d, p, out)
    if b is not None:
        y += b[None, :, None, None, None]
    return y


def _upsample_gemm(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, groups: int
) -> np.ndarray:
    """k == s, no pads: each input voxel owns a disjoint kz*ky*kx block of the output.

    Per (sample, group, slab of z planes): one GEMM (Cout/g*kz*ky*kx, Cin/g) @ (Cin/g,
    planes) into a cache-sized buffer, then kx strided copies (runs of X voxels) into
    the output, the bias added on the way; the slabs run on all cores. A whole-volume
    GEMM and one transpose copy with kx-long inner runs took 4x as long for
    16 x 32^3 -> 64^3.
    """
    n, cin, z, y, xx = x.shape
    cg, cog = cin // groups, w.shape[1]
    kz, ky, kx = w.shape[2:]
    kk, plane = kz * ky * kx, y * xx
    wt = w.reshape(groups, cg, cog * kk).transpose(0, 2, 1)  # (G, Cout/g*k, Cin/g): BLAS's A^T
    rows = None if bias is None else np.repeat(bias.reshape(groups, cog), kk, axis=1)[..., None]
    xs = x.reshape(n, groups, cg, z, plane)  # (N, G, Cin/g, Z, Y*X)
    out = np.empty((n, groups, cog, z, kz, y, ky, xx, kx), np.float32)
    dst = out.transpose(0, 1, 8, 2, 4, 6, 3, 5, 7)  # (N, G, kx, Cout/g, kz, ky, Z, Y, X)
    per = max(1, min(z, SLAB_BYTES // (4 * cog * kk * plane)))  # z planes per slab
    slabs = [
        (b, g, z0, min(z0 + per, z))
        for b in range(n)
        for g in range(groups)
        for z0 in range(0, z, per)
    ]

    def run(part: Sequence[tuple[int, int, int, int]]) -> list[None]:
        for b, g, z0, z1 in part:
            src = xs[b, g, :, z0:z1].reshape(cg, (z1 - z0) * plane)  # (Cin/g, planes)
            r = np.matmul(wt[g], src)  # (Cout/g*k, planes)
            if rows is not None:
                r += rows[g]
            r = r.reshape(cog, kz, ky, kx, z1 - z0, y, xx)
            for c in range(kx):
                dst[b, g, c, :, :, :, z0:z1] = r[:, :, :, c]
        return [None] * len(part)

    run_tiles(run, slabs, out.nbytes)
    return out.reshape(n, groups * cog, z * kz, y * ky, xx * kx)  # (N, Cout, Z*kz, Y*ky, X*kx)


def _upsample_gemm_last(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """`_upsample_gemm` of a channels-last x, one group, into a channels-last output: per
    slab of z planes one GEMM (voxels, Cin) @ (Cin, kz*ky*kx*Cout), then one copy whose
    inner runs are (kx, Cout) long on both sides; the slabs on all cores."""
    n, cin, z, y, xx = x.shape
    cout = w.shape[1]
    kz, ky, kx = w.shape[2:]
    xl = x.transpose(0, 2, 3, 4, 1)  # (N, Z, Y, X, Cin), contiguous
    wm = np.ascontiguousarray(w.transpose(0, 2, 3, 4, 1)).reshape(cin, -1)  # (Cin, k*Cout)
    row = None if bias is None else np.tile(bias, kz * ky * kx)  # (k*Cout,)
    out = np.empty((n, z, kz, y, ky, xx, kx, cout), np.float32)  # (N, Z, kz, Y, ky, X, kx, C)
    per = max(1, min(z, SLAB_BYTES // (4 * cout * kz * ky * kx * y * xx)))  # z planes per slab
    slabs = [(b, z0, min(z0 + per, z)) for b in range(n) for z0 in range(0, z, per)]

    def run(part: Sequence[tuple[int, int, int]]) -> list[None]:
        for b, z0, z1 in part:
            r = np.matmul(xl[b, z0:z1].reshape(-1, cin), wm)  # (planes, k*Cout)
            if row is not None:
                r += row
            r = r.reshape(z1 - z0, y, xx, kz, ky, kx, cout)
            out[b, z0:z1] = r.transpose(0, 3, 1, 4, 2, 5, 6)  # (z, kz, Y, ky, X, kx, Cout)
        return [None] * len(part)

    run_tiles(run, slabs, out.nbytes)
    # (N, Z*kz, Y*ky, X*kx, Cout) seen as (N, Cout, Z*kz, Y*ky, X*kx): channels-last
    return out.reshape(n, z * kz, y * ky, xx * kx, cout).transpose(0, 4, 1, 2, 3)


def scatter_slab_planes(kz: int, stride_z: int, dilation_z: int, plane_bytes: int) -> int:
    """Input z planes per slab of the scatter path: its product (`plane_bytes` a plane)
    within SCATTER_SLAB_BYTES, but at least the planes a slab's last one writes past, so
    slabs two apart never share an output plane."""
    overlap = -(-dilation_z * (kz - 1) // stride_z)
    return max(1, overlap, SCATTER_SLAB_BYTES // plane_bytes)


def _scatter(
    x: np.ndarray, w: np.ndarray, groups: int, s: Triple, d: Triple, p: Six, out: Triple
) -> np.ndarray:
    """Per slab of input z planes, one GEMM for every kernel offset at once, (K*Cout/g,
    Cin/g) @ (Cin/g, planes), each offset's rows then added into a strided view of the
    uncropped output. The input is read once and the GEMM has K*Cout/g rows; a GEMM per
    offset (per range of output channels) re-read the whole input K times in products a
    few rows high (MONAI UNet's 64 -> 16 upsampling at 16^3: 11-16 ms, one core). Slabs
    that write a common output plane never run together: even slabs on all cores, then
    odd ones (BLAS on one thread in each)."""
    n, cin, *size = x.shape
    cg, cog = cin // groups, w.shape[1]
    kz, ky, kx = w.shape[2:]
    kk, plane = kz * ky * kx, size[1] * size[2]
    # uncropped extent: every contribution, and at least pad_begin + out (output_padding)
    full = tuple(
        max((size[i] - 1) * s[i] + d[i] * (w.shape[2 + i] - 1) + 1, p[i] + out[i])
        for i in range(3)
    )
    acc = np.zeros((n, groups, cog) + full, np.float32)  # (N, G, Cout/g, Fz, Fy, Fx)
    xs = x.reshape(n, groups, cg, size[0], plane)  # (N, G, Cin/g, Z, Y*X)
    # rows ordered (kz, ky, kx, Cout/g): (G, K*Cout/g, Cin/g)
    wt = np.ascontiguousarray(
        w.reshape(groups, cg, cog, kk).transpose(0, 3, 2, 1).reshape(groups, kk * cog, cg))
    per = scatter_slab_planes(kz, s[0], d[0], 4 * kk * cog * plane)
    slabs = [(b, g, z0, min(z0 + per, size[0]))
             for b in range(n) for g in range(groups) for z0 in range(0, size[0], per)]

    def run(part: Sequence[tuple[int, int, int, int]]) -> list[None]:
        for b, g, z0, z1 in part:
            src = xs[b, g, :, z0:z1].reshape(cg, (z1 - z0) * plane)  # (Cin/g, planes)
            prod = np.matmul(wt[g], src).reshape(kz, ky, kx, cog, z1 - z0, *size[1:])
            for a, bb, c in np.ndindex(kz, ky, kx):
                dst = (
                    slice(s[0] * z0 + a * d[0], s[0] * (z1 - 1) + a * d[0] + 1, s[0]),
                    slice(bb * d[1], bb * d[1] + (size[1] - 1) * s[1] + 1, s[1]),
                    slice(c * d[2], c * d[2] + (size[2] - 1) * s[2] + 1, s[2]),
                )
                acc[(b, g, slice(None)) + dst] += prod[a, bb, c]  # (Cout/g, planes, Y, X)
        return [None] * len(part)

    for phase in (0, 1):  # slabs 2 apart never share an output plane (per >= overlap)
        run_tiles(run, slabs[phase::2], acc.nbytes)
    crop = tuple(slice(p[i], p[i] + out[i]) for i in range(3))
    y = acc[(Ellipsis,) + crop]  # (N, G, Cout/g, oz, oy, ox)
    return np.ascontiguousarray(y).reshape((n, groups * cog) + out)
