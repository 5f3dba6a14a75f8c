"""The arithmetic precisions a run may ask for, and what each stores tensors as.

`fp32` and `tf32` store float32 (tf32 lets cuDNN and cuBLAS multiply on tensor cores
with 10-bit mantissas, accumulating in fp32); `bf16` and `fp16` store 2-byte tensors
and accumulate in fp32. Blending and the written output stay float32 whatever the
precision (docs/design.md). bfloat16 is `ml_dtypes.bfloat16`, the numpy dtype CuPy 14
also takes (it comes with onnx, a core dependency).

`int8` lives inside OpenVINO's compiled network only (NNCF's quantized model, on the
CPU: primitives/cpu/openvino_int8.py): the tensors between our own ops (windows in,
outputs out, blending) stay float32, so its storage dtype is float32 and its storage
bytes 4.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

Precision = Literal["fp32", "tf32", "bf16", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "int8")


def check_precision(precision: str) -> str:
    """`precision` itself, or ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def storage_dtype(precision: str) -> np.dtype[Any]:
    """The dtype tensors are kept in between ops at `precision`."""
    check_precision(precision)
    if precision == "fp16":
        return np.dtype(np.float16)
    if precision == "bf16":
        import ml_dtypes  # numpy's bfloat16; a dependency of onnx

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float32)


def storage_bytes(precision: str) -> int:
    """Bytes per stored tensor element at `precision` (the memory model's unit)."""
    return 2 if check_precision(precision) in ("bf16", "fp16") else 4
