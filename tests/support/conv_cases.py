"""Convolution cases for the GPU conv-primitive tests, with their naive references.

Shapes are tiny (the references are Python loops) but odd, anisotropic, strided,
dilated, grouped and transposed. The reference of a reduced-precision case is computed
on the inputs *as stored* (rounded to fp16/bf16, then float64), so what the tolerance
bounds is the primitive's own error: float32 arithmetic plus one rounding of the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from support.naive import naive_activation
from support.naive_graph import naive_conv3d, naive_conv_transpose3d

STORAGE = {"fp32": np.float32, "tf32": np.float32, "fp16": np.float16,
           "bf16": ml_dtypes.bfloat16}
# Normwise bounds, max|y - ref| <= TOL * max|ref|. fp32: float32 accumulation over at
# most a few hundred terms and FFT round-off (~1e-6) stay far below 1e-4. fp16 stores
# the output with a 2^-11 (4.9e-4) relative rounding, bf16 with 2^-8 (3.9e-3); the
# float32 arithmetic adds ~1e-6; so 2e-3 and 1e-2 bound them with margin.
TOL = {"fp32": 1e-4, "tf32": 1e-4, "fp16": 2e-3, "bf16": 1e-2}


@dataclass(frozen=True)
class Case:
    name: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    strides: tuple[int, int, int] = (1, 1, 1)
    pads: tuple[int, ...] = (0,) * 6
    dilations: tuple[int, int, int] = (1, 1, 1)
    group: int = 1
    transposed: bool = False
    output_padding: tuple[int, int, int] = (0, 0, 0)

    @property
    def cout(self) -> int:
        return self.w[1] * self.group if self.transposed else self.w[0]


CASES = [
    Case("odd-anisotropic-padded", (2, 3, 7, 6, 5), (4, 3, 3, 2, 3), pads=(1, 0, 1, 0, 1, 1)),
    Case("stride2", (1, 4, 9, 7, 8), (5, 4, 3, 3, 2), strides=(2, 2, 2),
         pads=(1, 1, 0, 1, 0, 1)),
    Case("dilation2", (1, 2, 9, 8, 7), (3, 2, 2, 3, 2), dilations=(2, 2, 1)),
    Case("groups", (1, 6, 6, 5, 7), (4, 3, 3, 3, 1), group=2, pads=(0, 1, 0, 0, 1, 0)),
    Case("transposed-output-padding", (1, 4, 4, 3, 5), (4, 3, 3, 2, 3), strides=(2, 2, 1),
         pads=(1, 0, 0, 0, 1, 0), transposed=True, output_padding=(1, 0, 0)),
    Case("transposed-grouped-dilated", (1, 4, 3, 4, 3), (4, 2, 2, 3, 2), strides=(2, 1, 2),
         dilations=(1, 2, 1), group=2, transposed=True, output_padding=(0, 0, 1)),
]
CASE_IDS = [c.name for c in CASES]


def host_arrays(case: Case, precision: str, seed: int = 0) -> dict[str, np.ndarray]:
    """x and weight in the storage dtype, bias float32 (the device_conv contract)."""
    rng = np.random.default_rng(seed)
    dt = STORAGE[precision]
    return {
        "x": rng.standard_normal(case.x).astype(dt),
        "weight": (rng.standard_normal(case.w) * 0.5).astype(dt),
        "bias": rng.standard_normal(case.cout).astype(np.float32),
    }


def host_params(case: Case, arrays: dict[str, np.ndarray]) -> dict:
    return {"weight": arrays["weight"], "bias": arrays["bias"], "strides": case.strides,
            "pads": case.pads, "dilations": case.dilations, "group": case.group,
            "output_padding": case.output_padding}


@lru_cache(maxsize=64)
def reference(case: Case, precision: str, activation: tuple[str, float] | None = None,
              seed: int = 0) -> np.ndarray:
    """float64 naive result on the stored inputs, with the activation applied."""
    a = host_arrays(case, precision, seed)
    x, w = a["x"].astype(np.float64), a["weight"].astype(np.float64)
    if case.transposed:
        y = naive_conv_transpose3d(x, w, a["bias"], case.strides, case.pads,
                                   case.output_padding, case.dilations, case.group)
    else:
        y = naive_conv3d(x, w, a["bias"], case.strides, case.pads, case.dilations, case.group)
    if activation is not None:
        y = naive_activation(y, activation[0], activation[1])
    return y


def normwise_error(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(y, np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))
