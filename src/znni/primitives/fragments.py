"""Max-pooling fragment (MPF) geometry and recombination.

ZNNi (SC16) section on MPF: pooling at every offset o in [0, p)^3 gives p^3
fragments, stacked into the batch axis. Offset o of window p holds the dense
positions o + p*i; nested over several pooling layers the dense position is
o1 + p1*(o2 + p2*(... + p_last*i)). Written against `xp` so GPU code shares it.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.base import Triple


def fragment_size(n: int, p: int) -> int:
    """Size of every fragment of an axis of length n pooled by window p.

    All p offsets give the same size exactly when (n + 1) is divisible by p.
    """
    if p < 1:
        raise ValueError(f"pool window must be >= 1, got {p}")
    if (n + 1) % p != 0 or n + 1 < 2 * p:
        raise ValueError(
            f"axis of length {n} cannot be split into equal max-pooling fragments of window {p}: "
            f"need (n + 1) divisible by {p} and n >= {2 * p - 1}"
        )
    return (n + 1) // p - 1


def fragments_reference(x: Any, window: Triple, xp: ModuleType = np) -> Any:
    """MPF by reshaping each offset's view into windows: (S, C, Z, Y, X) -> (S*P, C, z, y, x)."""
    s, c, nz, ny, nx = x.shape
    pz, py, px = window
    mz, my, mx = fragment_size(nz, pz), fragment_size(ny, py), fragment_size(nx, px)
    out = xp.empty((s, pz, py, px, c, mz, my, mx), dtype=x.dtype)
    for oz in range(pz):
        for oy in range(py):
            for ox in range(px):
                view = x[:, :, oz : oz + mz * pz, oy : oy + my * py, ox : ox + mx * px]
                # (S, C, mz, pz, my, py, mx, px) -> max over the window axes
                windows = view.reshape(s, c, mz, pz, my, py, mx, px)
                out[:, oz, oy, ox] = windows.max(axis=(3, 5, 7))
    return out.reshape(s * pz * py * px, c, mz, my, mx)  # (S*P, C, mz, my, mx)


def recombine(y: Any, batch: int, windows: Sequence[Triple]) -> Any:
    """Interleave MPF fragments back into dense output.

    y: (batch * prod(all window volumes), C, jz, jy, jx), fragments ordered as
    produced by MPF (earlier pooling layers outer in the batch axis).
    Returns (batch, C, jz*Pz, jy*Py, jx*Px) with P the product of the windows.
    """
    if not windows:
        return y
    n = len(windows)
    _, c, jz, jy, jx = y.shape
    # (B, p1z, p1y, p1x, ..., pnz, pny, pnx, C, jz, jy, jx)
    shape = (batch, *[p for w in windows for p in w], c, jz, jy, jx)
    t = y.reshape(shape)
    off = 1  # axis of p1z
    c_ax = 1 + 3 * n
    # dense index along z = ((jz * pnz + onz) * ... ) * p1z + o1z: most significant first.
    axes = [0, c_ax]
    for d in range(3):
        axes.append(c_ax + 1 + d)
        axes.extend(off + 3 * i + d for i in reversed(range(n)))
    t = t.transpose(axes)
    pz, py, px = (prod(w[d] for w in windows) for d in range(3))
    return t.reshape(batch, c, jz * pz, jy * py, jx * px)  # (B, C, Z, Y, X)
