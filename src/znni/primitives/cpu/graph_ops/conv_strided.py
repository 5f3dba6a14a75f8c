"""Strided 3D convolution as one column GEMM per block over phase-split input.

A stride-s conv reads every s-th voxel, so the plain window view's rows are strided
runs and gathering the columns from it is numpy's slow short-strided copy (MONAI
UNet's 3^3 stride-2 convs spent about half their time there). Splitting the
zero-padded input once into its s_z*s_y*s_x phases (voxel i goes to phase i mod s at
i div s) turns each kernel tap into a unit-stride shifted window of one phase: tap k
reads phase k mod s from offset k div s. On the phases' (Y*X) planes flattened,
every tap of a block of output voxels is one contiguous run (the windows() trick of
conv_general), so the gather is plain copies and the GEMM has the full
K = Cin/g * kz*ky*kx. The flat grid's columns past the output's y and x are
computed and cropped, as in conv_general.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.cpu.graph_ops._parallel import run_tiles
from znni.primitives.graph_args import Six, Triple
from znni.triple import as_triple

COLUMN_BYTES = 4 * 2**20  # columns per block: a few MB keeps gather and GEMM in cache


def split_phases(x: np.ndarray, kernel: Triple, s: Triple, p: Six, out: Triple) -> np.ndarray:
    """(N, C, Z, Y, X) -> (N, C, rz, ry, rx, Lz + 1, Ly, Lx): padded voxel s*j + r of each
    axis at [r, j], zeros where the padded input is zero. Only the phases some tap reads
    (r < min(s, k)); L = out + ceil(k / s) - 1, plus one zero z plane so the flat runs
    of the last plane stay inside the buffer."""
    n, c = x.shape[:2]
    phases = tuple(min(s[a], kernel[a]) for a in range(3))
    length = tuple(out[a] + -(-kernel[a] // s[a]) - 1 for a in range(3))
    ph = np.zeros((n, c, *phases, length[0] + 1, length[1], length[2]), np.float32)
    for r in np.ndindex(*phases):
        dst: list[slice] = []
        src: list[slice] = []
        for a in range(3):
            size, pb = x.shape[2 + a], p[a]
            j0 = max(0, -(-(pb - r[a]) // s[a]))  # first j whose voxel is inside x
            j1 = min(length[a], (size - 1 - r[a] + pb) // s[a] + 1)
            u0 = s[a] * j0 + r[a] - pb
            dst.append(slice(j0, max(j0, j1)))
            src.append(slice(u0, u0 + s[a] * (j1 - j0 - 1) + 1, s[a]))
        if all(d.stop > d.start for d in dst):
            ph[(slice(None), slice(None), *r, *dst)] = x[(slice(None), slice(None), *src)]
    return ph


def taps(
    kernel: Triple, s: Triple, phases: Triple, plane: tuple[int, int]
) -> list[tuple[int, int]]:
    """(phase index, flat offset) of each kernel tap, in (kz, ky, kx) order."""
    out = []
    for k in np.ndindex(*kernel):
        r = [k[a] % s[a] for a in range(3)]
        q = [k[a] // s[a] for a in range(3)]
        out.append(((r[0] * phases[1] + r[1]) * phases[2] + r[2],
                    (q[0] * plane[0] + q[1]) * plane[1] + q[2]))
    return out


def conv_strided(
    x: np.ndarray, w: np.ndarray, groups: int, s: Sequence[int], p: Six, out: Triple
) -> np.ndarray:
    """Cross-correlation of (N, Cin, Z, Y, X) with (Cout, Cin/g, kz, ky, kx), unit dilation,
    strides `s`, zero pads `p` -> (N, Cout, *out) float32, without bias."""
    stride: Triple = (int(s[0]), int(s[1]), int(s[2]))
    kernel = as_triple(w.shape[2:])
    ph = split_phases(x, kernel, stride, p, out)
    n, cin = x.shape[:2]
    cg, cout = cin // groups, w.shape[0]
    plane = (ph.shape[-2], ph.shape[-1])
    flat = ph.reshape(n, cin, -1, ph.shape[-3] * plane[0] * plane[1])  # (N, C, phases, F+)
    tap_list = taps(kernel, stride, as_triple(ph.shape[2:5]), plane)
    kdim = len(tap_list) * cg
    # K ordered (tap, channel): matches the columns below
    wm = w.reshape(groups, cout // groups, cg, -1).transpose(0, 1, 3, 2).reshape(
        groups, cout // groups, kdim)
    grid = out[0] * plane[0] * plane[1]
    y = np.empty((n, cout, grid), np.float32)
    step = max(1, COLUMN_BYTES // (4 * groups * kdim))
    blocks = [(i, f0, min(f0 + step, grid)) for i in range(n) for f0 in range(0, grid, step)]

    def run(part: Sequence[tuple[int, int, int]]) -> list[None]:
        buf = np.empty(groups * kdim * step, np.float32)
        for i, f0, f1 in part:
            cols = buf[: groups * kdim * (f1 - f0)].reshape(groups, len(tap_list), cg, f1 - f0)
            for t, (phase, off) in enumerate(tap_list):
                src = flat[i, :, phase, off + f0 : off + f1]  # (Cin, f1 - f0), contiguous rows
                np.copyto(cols[:, t], src.reshape(groups, cg, f1 - f0))
            res = np.matmul(wm, cols.reshape(groups, kdim, f1 - f0))  # (G, Cout/g, f1 - f0)
            y[i, :, f0:f1] = res.reshape(cout, f1 - f0)
        return [None] * len(part)

    run_tiles(run, blocks, groups * kdim * grid * n * 4)
    full = y.reshape(n, cout, out[0], plane[0], plane[1])
    return np.ascontiguousarray(full[..., : out[1], : out[2]])
