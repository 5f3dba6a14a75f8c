"""Element-wise activations written against an array module `xp` (numpy or CuPy)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.base import Activation

# ONNX Selu's default constants, which the CPU and GPU graph kernels both apply
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_GAMMA = 1.0507009873554804934193349852946


def apply_activation(x: Any, act: Activation, xp: ModuleType = np) -> Any:
    """Apply `act` to float32 `x` in place and return it.

    A non-contiguous `x` is copied first: numpy 2.4's float32 in-place unary
    ufuncs (e.g. np.negative(v, out=v)) give wrong values on some strided views.
    """
    if not x.flags.c_contiguous:
        x = xp.ascontiguousarray(x)
    kind = act.kind
    if kind == "linear":
        return x
    if kind == "relu":
        return xp.maximum(x, 0, out=x)
    if kind == "leaky_relu":
        neg = xp.minimum(x, 0)
        xp.maximum(x, 0, out=x)
        x += neg * xp.float32(act.slope)
        return x
    if kind == "sigmoid":
        # 1 / (1 + exp(-x)), computed stably for large |x| by clipping the exponent.
        xp.clip(x, -80.0, 80.0, out=x)
        xp.negative(x, out=x)
        xp.exp(x, out=x)
        x += 1.0
        return xp.reciprocal(x, out=x)
    if kind == "tanh":
        return xp.tanh(x, out=x)
    if kind == "elu":
        neg = xp.expm1(xp.minimum(x, 0))
        xp.maximum(x, 0, out=x)
        x += neg
        return x
    raise ValueError(f"unknown activation {kind!r}")
