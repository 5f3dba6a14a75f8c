"""The per-offset GEMM loop as a device conv primitive ('gemm-loop'), named as what it is.

graph_kernels.conv / conv_transpose run one batched matmul per kernel offset (729
launches for a 9^3 kernel): the fallback where cuDNN is not installed, and the
arithmetic of the cuDNN stand-in. Stored tensors are cast to float32 first, the
result is computed in float32, activated, and cast back to the storage dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import Any

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.gpu.conv_spec import ConvSpec
from znni.primitives.gpu.device import Device
from znni.primitives.gpu.graph_kernels import conv, conv_transpose
from znni.primitives.gpu.graph_split import workspace_bytes

F32 = np.float32


class _ShapeOnly:
    """A weight stand-in carrying only `.shape`, for the workspace model."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


def gemm_loop_workspace_bytes(spec: ConvSpec) -> int:
    """The loop's temporaries (graph_split's model, its float32 result included) plus
    float32 copies of input and weight when the storage dtype is 2 bytes."""
    op = "conv_transpose" if spec.transposed else "conv"
    p: dict[str, Any] = {"pads": spec.pads, "weight": _ShapeOnly(spec.w_shape)}
    total = workspace_bytes(op, p, prod(spec.x_shape) * 4, spec.out_shape, [spec.x_shape])
    if spec.io_dtype != "float32":
        total += (prod(spec.x_shape) + prod(spec.w_shape)) * 4
    return int(total)


def gemm_loop_arith(xp: Any, x: Any, params: Mapping[str, Any], spec: ConvSpec) -> Any:
    """The conv, bias and activation as `spec` has them (a bare spec adds neither), in
    float32 -> a float32 (N, Cout, ...) array."""
    p = dict(params)
    p["weight"] = xp.asarray(params["weight"], dtype=F32)
    p["bias"] = xp.asarray(params["bias"], dtype=F32) if spec.has_bias else None
    x32 = xp.asarray(x, dtype=F32)
    r = (conv_transpose if spec.transposed else conv)(xp, p, x32)  # (N, Cout, Z, Y, X)
    if spec.activation is not None:
        kind, slope = spec.activation
        r = apply_activation(r, Activation(kind, slope), xp)
    return r


def gemm_loop_conv(device: Device, x: Any, params: Mapping[str, Any], spec: ConvSpec) -> Any:
    """A new counted output in x's dtype; workspace reserved around the loop."""
    ws = gemm_loop_workspace_bytes(spec)
    device.reserve(ws, "gemm-loop conv workspace")
    try:
        y = device.alloc(spec.out_shape, x.dtype, "gemm-loop conv output")
        try:
            y[...] = gemm_loop_arith(device.xp, x, params, spec)
        except BaseException:
            device.free(y)
            raise
    finally:
        device.release(ws)
    return y
