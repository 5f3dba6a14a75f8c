"""Direct convolution on a device: cuDNN when the device has it, else implicit GEMM.

Implicit GEMM (the cuDNN-style formulation on cuBLAS): for each kernel
offset, gather the shifted input window once and do one batched matrix
product (Cout x Cin) @ (S, Cin, V) into a temporary that is added to the
output. Workspace is one window and one product: S*V*(Cin + Cout) floats.
Written against `xp`, so the same code runs on CuPy and on the numpy stand-in.
"""

from __future__ import annotations

from math import prod
from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.base import Triple
from znni.primitives.gpu.workspace import Workspace
from znni.triple import as_triple

FLOAT_BYTES = 4


def conv_output_size(size: Triple, kernel: Triple) -> Triple:
    out = as_triple(n - k + 1 for n, k in zip(size, kernel, strict=True))
    if min(out) < 1:
        raise ValueError(f"input {size} is smaller than kernel {kernel}")
    return out


def direct_workspace_bytes(batch: int, cin: int, cout: int, size: Triple, kernel: Triple) -> int:
    """Bytes of temporaries of `direct_conv` beyond its input, output and weights."""
    v = prod(conv_output_size(size, kernel))
    return batch * v * (cin + cout) * FLOAT_BYTES


def direct_conv(xp: ModuleType, x: Any, w: Any, b: Any, out: Any, ws: Workspace) -> None:
    """out[...] = valid cross-correlation of x (S, Cin, n) with w (Cout, Cin, k), plus b."""
    s, cin = x.shape[:2]
    cout = w.shape[0]
    kz, ky, kx = w.shape[2:]
    oz, oy, ox = out.shape[2:]
    v = oz * oy * ox
    out_flat = out.reshape(s, cout, v)  # (S, Cout, V), a view of out
    out_flat[...] = b.reshape(1, cout, 1)
    window = ws.take(xp.empty((s, cin, oz, oy, ox), dtype=xp.float32))
    product = ws.take(xp.empty((s, cout, v), dtype=xp.float32))
    for dz in range(kz):
        for dy in range(ky):
            for dx in range(kx):
                window[...] = x[:, :, dz : dz + oz, dy : dy + oy, dx : dx + ox]
                xp.matmul(w[:, :, dz, dy, dx], window.reshape(s, cin, v), out=product)
                out_flat += product
    ws.give(window, product)


def native_or_direct_conv(device: Any, x: Any, w: Any, b: Any, out: Any, ws: Workspace) -> str:
    """cuDNN when the device offers it, else implicit GEMM; returns which ran."""
    if device.native_conv3d(x, w, b, out):
        return "cudnn"
    direct_conv(device.xp, x, w, b, out, ws)
    return "gemm"


def as_float32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)
