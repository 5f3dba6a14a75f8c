"""Argument checks and attribute vocabularies shared by the CPU and GPU graph kernels.

Graph-imported networks (ONNX) carry attributes that a user never typed, so every
kernel validates them up front and names the offending value in a `ValueError`
instead of failing deep inside numpy with an unrelated broadcasting error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar, cast

import numpy as np

from znni.triple import Triple as Triple  # re-exported: the graph kernels import it here
from znni.triple import as_triple

Six = tuple[int, int, int, int, int, int]
PadMode = Literal["constant", "reflect", "edge"]
S = TypeVar("S", bound=str)

PAD_MODES: tuple[PadMode, ...] = ("constant", "reflect", "edge")  # ONNX Pad
MODES = ("nearest", "linear")  # ONNX Resize's mode, coordinate transform and rounding
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def as_volume(x: np.ndarray, name: str = "x") -> np.ndarray:
    """`x` as a float32 (N, C, Z, Y, X) array; other ranks are a caller error."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 5:
        raise ValueError(f"{name} must be 5-D (N, C, Z, Y, X), got shape {arr.shape}")
    return arr


def _entries(value: int | Sequence[int], n: int) -> list[int]:
    """`value` repeated `n` times where numpy calls it a scalar, else its own entries."""
    if np.isscalar(value):  # numpy's TypeIs narrows to its scalar kinds, never to int
        return [cast(int, value)] * n
    return list(cast(Sequence[int], value))  # not a scalar: the Sequence[int] of the union


def triple(value: int | Sequence[int], name: str, minimum: int) -> Triple:
    """Three ints, each >= `minimum` (a scalar is broadcast to all three axes)."""
    vals = _entries(value, 3)
    if len(vals) != 3:
        raise ValueError(f"{name} must have 3 entries (z, y, x), got {value!r}")
    out = as_triple(vals, name)
    if any(v != f for v, f in zip(out, vals, strict=True)) or min(out) < minimum:
        raise ValueError(f"{name} must be integers >= {minimum}, got {value!r}")
    return out


def six(pads: int | Sequence[int], name: str = "pads", allow_negative: bool = False) -> Six:
    """ONNX-ordered pads (z_b, y_b, x_b, z_e, y_e, x_e) as six ints."""
    vals = _entries(pads, 6)
    if len(vals) != 6:
        raise ValueError(f"{name} must have 6 entries (z_b, y_b, x_b, z_e, y_e, x_e), got {pads!r}")
    zb, yb, xb, ze, ye, xe = (int(v) for v in vals)
    out: Six = (zb, yb, xb, ze, ye, xe)
    if any(v != f for v, f in zip(out, vals, strict=True)):
        raise ValueError(f"{name} must be integers, got {pads!r}")
    if not allow_negative and min(out) < 0:
        raise ValueError(f"{name} must be non-negative, got {pads!r}")
    return out


def channel_vector(v: np.ndarray | None, channels: int, name: str) -> np.ndarray | None:
    """A per-channel parameter as float32 (C,), or None when absent."""
    if v is None:
        return None
    arr = np.asarray(v, dtype=np.float32).reshape(-1)
    if arr.size != channels:
        raise ValueError(f"{name} must have {channels} entries, got shape {np.shape(v)}")
    return arr


def choice(value: str, name: str, allowed: Sequence[S]) -> S:
    """`value` (as the entry of `allowed` it equals), else a ValueError listing them."""
    for entry in allowed:
        if entry == value:
            return entry
    raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
