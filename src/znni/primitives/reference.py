"""The reference backend: simple vectorised numpy, obviously right.

It is the oracle that fast primitives are tested against and the fallback
that always works. Convolution loops over kernel offsets and does one
channel contraction (a BLAS GEMM via tensordot) per offset.
"""

from __future__ import annotations

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation, Triple
from znni.primitives.fragments import fragments_reference


def conv3d_reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Valid cross-correlation: (S, Cin, Z, Y, X) x (Cout, Cin, kz, ky, kx) -> (S, Cout, ...),
    float32; float64 inputs accumulate and return float64 (the exact side of a rounding
    check, e.g. cpu.winograd_error)."""
    s, cin, nz, ny, nx = x.shape
    cout, wcin, kz, ky, kx = weight.shape
    if wcin != cin:
        raise ValueError(f"input has {cin} channels but the kernel expects {wcin}")
    oz, oy, ox = nz - kz + 1, ny - ky + 1, nx - kx + 1
    if min(oz, oy, ox) < 1:
        raise ValueError(f"input {x.shape[2:]} is smaller than kernel {(kz, ky, kx)}")
    dtype = np.float64 if x.dtype == np.float64 else np.float32
    acc = np.zeros((cout, s, oz, oy, ox), dtype=dtype)  # (Cout, S, oz, oy, ox)
    for dz in range(kz):
        for dy in range(ky):
            for dx in range(kx):
                window = x[:, :, dz : dz + oz, dy : dy + oy, dx : dx + ox]
                acc += np.tensordot(weight[:, :, dz, dy, dx], window, axes=([1], [1]))
    acc += bias.astype(dtype).reshape(cout, 1, 1, 1, 1)
    return np.ascontiguousarray(acc.transpose(1, 0, 2, 3, 4))  # (S, Cout, oz, oy, ox)


def maxpool_reference(x: np.ndarray, window: Triple) -> np.ndarray:
    """Strided max-pool, trailing voxels that do not fill a window are dropped."""
    s, c, nz, ny, nx = x.shape
    pz, py, px = window
    mz, my, mx = nz // pz, ny // py, nx // px
    view = x[:, :, : mz * pz, : my * py, : mx * px]
    return view.reshape(s, c, mz, pz, my, py, mx, px).max(axis=(3, 5, 7))  # (S, C, mz, my, mx)


class ReferenceBackend:
    """numpy reference implementation of `Backend`."""

    name = "reference"

    def conv3d(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None = None,
        primitive: str | None = None,
    ) -> np.ndarray:
        out = conv3d_reference(x, weight, bias)
        return out if activation is None else apply_activation(out, activation)

    def maxpool(self, x: np.ndarray, window: Triple) -> np.ndarray:
        return maxpool_reference(x, window)

    def mpf(self, x: np.ndarray, window: Triple) -> np.ndarray:
        return fragments_reference(x, window)

    def activation(self, x: np.ndarray, activation: Activation) -> np.ndarray:
        return apply_activation(x, activation)
