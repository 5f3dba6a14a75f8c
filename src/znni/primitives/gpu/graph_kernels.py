"""The graph-only ops (ONNX semantics, float32) written against an array module `xp`.

The same code runs on numpy (the stand-in device) and on CuPy (a real GPU): only
operations both provide (pad, slicing, reshape, matmul, take, reductions,
ufuncs with `out=`), no Python loop over voxels; convs loop over kernel offsets.
Each kernel is `kernel(xp, params, *arrays) -> array`: `params` are the graph
node's (graph_split.py has validated them on the host), with array-valued
entries already on the device. Small host-computed tables (resize taps, pool
divisors) are made with numpy and moved with `xp.asarray`.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import product
from math import prod
from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.activations import SELU_ALPHA, SELU_GAMMA
from znni.primitives.shapes import (
    conv_out_size,
    linear_taps,
    nearest_index,
    pool_out_size,
    source_coords,
    transpose_out_size,
)

Kernel = Callable[..., Any]  # (xp, params, *arrays) -> device array
F32 = np.float32


def _pad_zero(xp: ModuleType, x: Any, pads: tuple[int, ...], fill: float = 0.0) -> Any:
    """Pad the spatial axes with `fill` by ONNX-ordered pads (begin z, y, x, end z, y, x)."""
    if not any(pads):
        return x
    width = ((0, 0), (0, 0)) + tuple((pads[i], pads[i + 3]) for i in range(3))
    return xp.pad(x, width, mode="constant", constant_values=fill)


def _taps(off: tuple[int, ...], d: tuple[int, ...], s: tuple[int, ...], n: tuple[int, ...]) -> Any:
    """Spatial index: positions o*d + i*s for i < n along each axis."""
    return (Ellipsis,) + tuple(
        slice(off[i] * d[i], off[i] * d[i] + (n[i] - 1) * s[i] + 1, s[i]) for i in range(3)
    )


def conv(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """ONNX Conv: one grouped matmul per kernel offset on a strided view of the padded input."""
    w, g = p["weight"], int(p["group"])
    s, d, pads = tuple(p["strides"]), tuple(p["dilations"]), tuple(p["pads"])
    cout, cg, *kernel = w.shape
    n = x.shape[0]
    out = tuple(
        conv_out_size(x.shape[2 + i], kernel[i], s[i], d[i], pads[i], pads[i + 3]) for i in range(3)
    )
    xpad = _pad_zero(xp, x, pads)
    wg = w.reshape(g, cout // g, cg, prod(kernel))  # (G, Cout/g, Cin/g, kvol)
    acc = xp.zeros((n, g, cout // g, prod(out)), F32)
    for t, off in enumerate(product(*(range(k) for k in kernel))):
        cols = xpad[_taps(off, d, s, out)].reshape(n, g, cg, -1)  # (N, G, Cin/g, V): a copy
        acc += xp.matmul(wg[:, :, :, t], cols)  # (G, Cout/g, Cin/g) @ -> (N, G, Cout/g, V)
    y = acc.reshape(n, cout, *out)
    if p.get("bias") is not None:
        y += p["bias"].reshape(1, cout, 1, 1, 1)
    return y


def conv_transpose(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """ONNX ConvTranspose: per kernel offset a grouped matmul added into a strided view."""
    w, g = p["weight"], int(p["group"])
    s, d, pads = tuple(p["strides"]), tuple(p["dilations"]), tuple(p["pads"])
    opad = tuple(p["output_padding"])
    n, cin, *size = x.shape
    cg, cog, kernel = cin // g, w.shape[1], w.shape[2:]
    out = tuple(
        transpose_out_size(size[i], kernel[i], s[i], d[i], pads[i], pads[i + 3], opad[i])
        for i in range(3)
    )
    full = tuple(
        max((size[i] - 1) * s[i] + d[i] * (kernel[i] - 1) + 1, pads[i] + out[i]) for i in range(3)
    )
    acc = xp.zeros((n, g, cog, *full), F32)
    xg = x.reshape(n, g, cg, -1)  # (N, G, Cin/g, Z*Y*X)
    wg = w.reshape(g, cg, cog, prod(kernel)).transpose(0, 2, 1, 3)  # (G, Cout/g, Cin/g, kvol)
    for t, off in enumerate(product(*(range(k) for k in kernel))):
        part = xp.matmul(wg[:, :, :, t], xg).reshape(n, g, cog, *size)
        acc[_taps(off, d, s, tuple(size))] += part
    crop = (Ellipsis,) + tuple(slice(pads[i], pads[i] + out[i]) for i in range(3))
    y = xp.ascontiguousarray(acc[crop]).reshape(n, g * cog, *out)
    if p.get("bias") is not None:
        y += p["bias"].reshape(1, g * cog, 1, 1, 1)
    return y


def _pool(xp: ModuleType, p: dict[str, Any], x: Any, fill: float,
          op: Any) -> tuple[Any, tuple[int, ...]]:
    """Separable strided window reduction with `op` over the padded input; (result, out)."""
    k, s, pads = tuple(p["kernel"]), tuple(p["strides"]), tuple(p["pads"])
    d = tuple(p.get("dilations", (1, 1, 1)))
    out = tuple(
        pool_out_size(x.shape[2 + i], k[i], s[i], d[i], pads[i], pads[i + 3], bool(p["ceil_mode"]))
        for i in range(3)
    )
    width = [(0, 0), (0, 0)]
    for i in range(3):
        need = (out[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
        width.append((pads[i], max(0, need - pads[i] - x.shape[2 + i])))
    y = xp.pad(x, width, mode="constant", constant_values=fill)
    for i in range(3):
        sel: list[Any] = [slice(None)] * 5
        acc = None
        for t in range(k[i]):
            sel[2 + i] = slice(t * d[i], t * d[i] + (out[i] - 1) * s[i] + 1, s[i])
            tap = y[tuple(sel)]
            if acc is None:
                acc = xp.array(tap, copy=True)
            else:
                op(acc, tap, out=acc)
        y = acc
    return y, out


def maxpool(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """ONNX MaxPool: padding never wins (-inf)."""
    return _pool(xp, p, x, -np.inf, xp.maximum)[0]


def avgpool(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """ONNX AveragePool; pads count in the divisor only with count_include_pad."""
    total, out = _pool(xp, p, x, 0.0, xp.add)
    k, s, pads = tuple(p["kernel"]), tuple(p["strides"]), tuple(p["pads"])
    counts = []
    for i in range(3):
        n = x.shape[2 + i]
        start = np.arange(out[i]) * s[i] - pads[i]
        end = np.minimum(start + k[i], n + pads[i + 3])
        if not p["count_include_pad"]:
            start, end = np.maximum(start, 0), np.minimum(end, n)
        counts.append((end - start).astype(np.float64))
    inv = 1.0 / (counts[0][:, None, None] * counts[1][None, :, None] * counts[2][None, None, :])
    total *= xp.asarray(inv.astype(F32))
    return total


def resize(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """ONNX Resize (nearest, linear) axis by axis: gathers and a weighted sum."""
    size, mode = tuple(p["size"]), p["mode"]
    transform = p["coordinate_transformation_mode"]
    scales = p.get("scales") or (None, None, None)
    y = x
    for i in range(3):
        axis, n_in = 2 + i, x.shape[2 + i]
        coords = source_coords(n_in, size[i], transform, scales[i])
        if mode == "nearest":
            idx = nearest_index(coords, n_in, p.get("nearest_mode", "round_prefer_floor"))
            y = xp.take(y, xp.asarray(idx), axis=axis)
            continue
        i0, i1, w1 = linear_taps(coords, n_in)
        shape = [1] * 5
        shape[axis] = size[i]
        a = xp.take(y, xp.asarray(i0), axis=axis)
        b = xp.take(y, xp.asarray(i1), axis=axis)
        b -= a
        b *= xp.asarray(w1.reshape(shape))
        a += b
        y = a
    return xp.ascontiguousarray(y, dtype=F32)


def pad(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """ONNX Pad: negative pads crop first, then constant, reflect or edge padding."""
    pads = tuple(int(v) for v in p["pads"])
    crop = (slice(None), slice(None)) + tuple(
        slice(max(0, -pads[i]), x.shape[2 + i] - max(0, -pads[i + 3])) for i in range(3)
    )
    width = ((0, 0), (0, 0)) + tuple((max(0, pads[i]), max(0, pads[i + 3])) for i in range(3))
    xc = x[crop]
    if p["mode"] == "constant":
        return xp.pad(xc, width, mode="constant", constant_values=F32(p["value"]))
    return xp.pad(xc, width, mode=p["mode"])


def _normalize(xp: ModuleType, x: Any, groups: int, scale: Any, bias: Any, eps: float) -> Any:
    """(x - mean) / sqrt(biased var + eps) per (n, group), two passes, then the affine."""
    n, c = x.shape[:2]
    rows = x.reshape(n * groups, -1)
    size = rows.shape[1]
    centred = rows - rows.sum(axis=1, keepdims=True) / F32(size)
    resid = centred.sum(axis=1, dtype=xp.float64) / size  # float32 mean's residual
    sq = (centred * centred).sum(axis=1, dtype=xp.float64)
    inv = 1.0 / xp.sqrt(xp.maximum(sq / size - resid**2, 0.0) + eps)
    factor = xp.repeat(inv, c // groups).reshape(n, c)
    shift = -xp.repeat(resid * inv, c // groups).reshape(n, c)
    if scale is not None:
        factor, shift = factor * scale[None, :], shift * scale[None, :]
    if bias is not None:
        shift = shift + bias[None, :]
    y = centred.reshape(n * c, -1)
    y *= factor.astype(F32).reshape(n * c, 1)
    y += shift.astype(F32).reshape(n * c, 1)
    return y.reshape(x.shape)


def batch_norm(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """Inference BatchNorm: a per-channel affine map with float64 coefficients."""
    var = p["var"].astype(xp.float64)
    a = p["scale"].astype(xp.float64) / xp.sqrt(var + float(p["epsilon"]))
    b = p["bias"].astype(xp.float64) - p["mean"].astype(xp.float64) * a
    c = x.shape[1]
    y = x * a.astype(F32).reshape(1, c, 1, 1, 1)
    y += b.astype(F32).reshape(1, c, 1, 1, 1)
    return y


def _binary(name: str) -> Kernel:
    def run(xp: ModuleType, p: dict[str, Any], a: Any, b: Any = None) -> Any:
        if b is None:
            k = p["constant"]
            a, b = (k, a) if p["constant_first"] else (a, k)
        return xp.asarray(getattr(xp, name)(a, b), dtype=F32)

    return run


def _elu(xp: ModuleType, x: Any, alpha: float) -> Any:
    return xp.where(x > 0, x, F32(alpha) * xp.expm1(xp.minimum(x, 0)))


def _prelu(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    s = p["slope"]
    s = s.reshape(()) if s.size == 1 else s.reshape(x.shape[1], 1, 1, 1)
    return xp.where(x >= 0, x, x * s)


def _softmax(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    e = x - x.max(axis=1, keepdims=True)
    xp.exp(e, out=e)
    e /= e.sum(axis=1, keepdims=True)
    return e


def _clip(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    y = xp.array(x, dtype=F32, copy=True)
    if p.get("min") is not None:
        xp.maximum(y, F32(p["min"]), out=y)
    if p.get("max") is not None:
        xp.minimum(y, F32(p["max"]), out=y)
    return y


def _slice(xp: ModuleType, p: dict[str, Any], x: Any) -> Any:
    """Each axis's (start, stop, step) as Python's slice.indices gives them: a range."""
    rs = [range(*s) for s in p["slices"][1:]]  # the whole batch: batch slices are refused
    index = tuple(slice(r.start, r.stop if r.stop >= 0 else None, r.step) for r in rs)
    return xp.ascontiguousarray(x[(slice(None), *index)])


KERNELS: dict[str, Kernel] = {
    "conv": conv,
    "conv_transpose": conv_transpose,
    "maxpool": maxpool,
    "avgpool": avgpool,
    "resize": resize,
    "concat": lambda xp, p, *xs: xp.concatenate(xs, axis=1),
    "add": _binary("add"),
    "sub": _binary("subtract"),
    "mul": _binary("multiply"),
    "div": _binary("divide"),
    "slice": _slice,
    "pad": pad,
    "instance_norm": lambda xp, p, x: _normalize(
        xp, x, x.shape[1], p.get("scale"), p.get("bias"), float(p["epsilon"])
    ),
    "group_norm": lambda xp, p, x: _normalize(
        xp, x, int(p["groups"]), p.get("scale"), p.get("bias"), float(p["epsilon"])
    ),
    "batch_norm": batch_norm,
    "relu": lambda xp, p, x: xp.maximum(x, F32(0)),
    "leaky_relu": lambda xp, p, x: xp.where(x >= 0, x, x * F32(p["alpha"])),
    "prelu": _prelu,
    "elu": lambda xp, p, x: _elu(xp, x, p["alpha"]),
    "selu": lambda xp, p, x: _elu(xp, x, SELU_ALPHA) * F32(SELU_GAMMA),
    "sigmoid": lambda xp, p, x: F32(1) / (F32(1) + xp.exp(-x)),
    "tanh": lambda xp, p, x: xp.tanh(x),
    "softmax": _softmax,
    "clip": _clip,
    "identity": lambda xp, p, x: xp.array(x, copy=True),
}
