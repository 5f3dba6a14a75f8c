"""One 3^3 conv compiled by OpenVINO in fp32, or with FakeQuantize on its input (u8) and its
weights (i8), which OpenVINO's CPU plugin runs as an int8 conv (its runtime model reports
the Convolution's runtime precision u8). The planner times both at U-Net layer shapes to
learn this CPU's int8 speed-up (planner/graph/calibrate.int8_rates) without NNCF: what a
quantized network's convs become is this pattern, which NNCF inserts for every conv.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np


def compiled_conv(cin: int, cout: int, side: int, *, int8: bool,
                  threads: int | None = None) -> tuple[Callable[[], object], str]:
    """(a call running the conv once on a fixed random (1, cin, side+2, ...) input, the
    Convolution's runtime precision as OpenVINO reports it: "u8"/"i8" for int8, "f32")."""
    import openvino as ov
    from openvino import opset13 as ops

    n = side + 2
    rng = np.random.default_rng(0)
    x = ops.parameter([1, cin, n, n, n], np.float32, name="x")
    w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(27 * cin)).astype(np.float32)
    weights = ops.constant(w)
    data = x
    if int8:
        lo, hi = np.float32(0.0), np.float32(1.0)  # activations after a ReLU or sigmoid
        data = ops.fake_quantize(x, lo, hi, lo, hi, 256)
        span = np.abs(w).max(axis=(1, 2, 3, 4), keepdims=True).astype(np.float32)  # per Cout
        weights = ops.fake_quantize(weights, -span, span, -span, span, 255)
    y = ops.convolution(data, weights, [1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1])
    model = ov.Model([ops.relu(y)], [x])
    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": int(threads or os.cpu_count() or 1)}
    compiled = ov.Core().compile_model(model, "CPU", config)
    precision = next(str(op.get_rt_info()["runtimePrecision"].astype(str))
                     for op in compiled.get_runtime_model().get_ops()
                     if op.get_rt_info()["layerType"].astype(str) == "Convolution")
    request = compiled.create_infer_request()
    inputs = {0: rng.random((1, cin, n, n, n), dtype=np.float32)}  # (N, C, Z, Y, X)

    def run() -> object:
        return request.infer(inputs, share_inputs=True)

    return run, precision
