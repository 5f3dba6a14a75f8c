"""ONNX Pad over the three spatial axes of (N, C, Z, Y, X).

Graph exports express asymmetric and reflect padding (and crops, as negative
pads) with an explicit Pad node; numpy.pad does the work. Negative pads crop the
input first, then the positive pads are applied to the cropped array (as
onnxruntime slices before padding). Reflect pads wider than the axis reflect
repeatedly, as numpy.pad (and so the ONNX reference implementation) does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.graph_args import PAD_MODES, as_volume, choice, six


def pad3d(
    x: np.ndarray, pads: Sequence[int], mode: str = "constant", value: float = 0.0
) -> np.ndarray:
    """Pad (or crop, for negative entries) with pads (z_b, y_b, x_b, z_e, y_e, x_e) -> float32."""
    x = as_volume(x)
    p = six(pads, allow_negative=True)
    kind = choice(mode, "mode", PAD_MODES)
    crop = [slice(None), slice(None)]
    for i in range(3):
        n = x.shape[2 + i]
        lo, hi = max(0, -p[i]), n - max(0, -p[i + 3])
        if hi - lo < 1:
            raise ValueError(f"pads {p} crop axis {i} of size {n} to nothing")
        crop.append(slice(lo, hi))
    xc = x[tuple(crop)]
    width = ((0, 0), (0, 0)) + tuple((max(0, p[i]), max(0, p[i + 3])) for i in range(3))
    if kind == "constant":
        if all(v >= 0 for v in p):
            return pad_constant(xc, p, value)
        return np.pad(xc, width, mode="constant", constant_values=np.float32(value))
    return np.pad(xc, width, mode=kind)


def pad_constant(x: np.ndarray, pads: Sequence[int], value: float = 0.0) -> np.ndarray:
    """Non-negative constant padding of the spatial axes of (N, C, Z, Y, X) -> float32.

    One filled buffer and one interior copy: numpy.pad pads axis by axis and took ~6x as
    long (24.6 ms vs 3.8 ms for 16 x 64^3, pad 1, on the CI kind)."""
    n, c, z, y, x_ = x.shape
    p = [int(v) for v in pads]
    out = np.full((n, c, z + p[0] + p[3], y + p[1] + p[4], x_ + p[2] + p[5]), value, np.float32)
    out[:, :, p[0] : p[0] + z, p[1] : p[1] + y, p[2] : p[2] + x_] = x  # (N, C, Z, Y, X) inside
    return out
