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

from znni.primitives.cpu.graph_ops._args import as_volume, choice, six

PAD_MODES = ("constant", "reflect", "edge")


def pad3d(
    x: np.ndarray, pads: Sequence[int], mode: str = "constant", value: float = 0.0
) -> np.ndarray:
    """Pad (or crop, for negative entries) with pads (z_b, y_b, x_b, z_e, y_e, x_e) -> float32."""
    x = as_volume(x)
    p = six(pads, allow_negative=True)
    choice(mode, "mode", PAD_MODES)
    crop = [slice(None), slice(None)]
    for i in range(3):
        n = x.shape[2 + i]
        lo, hi = max(0, -p[i]), n - max(0, -p[i + 3])
        if hi - lo < 1:
            raise ValueError(f"pads {p} crop axis {i} of size {n} to nothing")
        crop.append(slice(lo, hi))
    xc = x[tuple(crop)]
    width = ((0, 0), (0, 0)) + tuple((max(0, p[i]), max(0, p[i + 3])) for i in range(3))
    if mode == "constant":
        return np.pad(xc, width, mode="constant", constant_values=np.float32(value))
    return np.pad(xc, width, mode=mode)
