"""Device-neutral geometry of the graph ops: output sizes and resize sampling positions.

The CPU kernels (cpu/graph_ops) and the GPU kernels and their memory plan (gpu/graph_kernels,
gpu/graph_split) must agree on every output shape and on where a resized voxel samples its
input, or a network split between devices would not line up; so the rules live once, here,
as plain integer and numpy arithmetic that imports no backend.
"""

from __future__ import annotations

import numpy as np


def conv_out_size(n: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """Output length of one axis: floor((n + pads - d*(k-1) - 1) / s) + 1."""
    return (n + pb + pe - d * (k - 1) - 1) // s + 1


def transpose_out_size(n: int, k: int, s: int, d: int, pb: int, pe: int, op: int) -> int:
    """Output length of one axis: (n-1)*s - pb - pe + d*(k-1) + output_padding + 1."""
    return (n - 1) * s - pb - pe + d * (k - 1) + op + 1


def pool_out_size(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool) -> int:
    """Windows along one axis; in ceil mode a last window starting in the end padding is dropped."""
    span = n + pb + pe - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + pb:
        out -= 1
    return out


def source_coords(n_in: int, n_out: int, transform: str, scale: float | None) -> np.ndarray:
    """Input coordinate (float64) sampled by each output index along one axis.

    Without an explicit scale the ratio n_in / n_out is applied as a
    multiplication then a division, so exact integer positions stay exact.
    """
    i = np.arange(n_out, dtype=np.float64)
    if transform == "align_corners":
        return i * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if transform == "asymmetric":
        return i / scale if scale is not None else i * n_in / n_out
    c = (i + 0.5) / scale if scale is not None else (i + 0.5) * n_in / n_out
    if transform == "pytorch_half_pixel" and n_out == 1:
        return np.zeros(1)
    return c - 0.5


def nearest_index(coords: np.ndarray, n_in: int, nearest_mode: str) -> np.ndarray:
    """Rounded, clamped source indices for nearest resize."""
    fl = np.floor(coords)
    if nearest_mode == "floor":
        idx = fl
    elif nearest_mode == "ceil":
        idx = np.ceil(coords)
    else:
        tie = coords - fl == 0.5
        near = np.floor(coords + 0.5)
        idx = np.where(tie, fl if nearest_mode == "round_prefer_floor" else fl + 1, near)
    return np.clip(idx, 0, n_in - 1).astype(np.intp)


def linear_taps(coords: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i0, i1, w1): neighbours clamped to the edge (ONNX pads with edge values)."""
    fl = np.floor(coords)
    w1 = (coords - fl).astype(np.float32)
    i0 = np.clip(fl, 0, n_in - 1).astype(np.intp)
    i1 = np.clip(fl + 1, 0, n_in - 1).astype(np.intp)
    return i0, i1, w1
