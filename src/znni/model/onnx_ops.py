"""ONNX data-path nodes -> `Node`s, with their output shapes (onnx_import drives this).

Each converter reads the node's attributes (with ONNX's defaults) and its constant
inputs (weights, pads, scales, already folded by onnx_import), checks them, and
appends one `Node` whose params are plain values. Shapes follow the ONNX operator
formulas (cited per function); the executor checks them again at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil, floor
from typing import Any

import numpy as np

from znni.model.graph import Node
from znni.model.onnx_context import Context, Shape, attrs, spatial
from znni.model.onnx_layers import norm_converters, pointwise_converters, reshape_converters


def _auto_pads(
    ctx: Context, node: Any, a: dict[str, Any], size: Shape, k: Shape, s: Shape, d: Shape
) -> tuple[int, ...]:
    """ONNX `pads`, or those auto_pad implies (ONNX Conv: SAME_* pad to ceil(n / s) outputs)."""
    mode = a.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", ""):
        pads = tuple(int(p) for p in a.get("pads", (0,) * 6))
        if len(pads) != 6:
            raise ValueError(f"{ctx.where(node)}: pads {pads} are not 3D")
        return pads
    if mode == "VALID":
        return (0,) * 6
    total = [
        max((ceil(n / st) - 1) * st + (kk - 1) * dd + 1 - n, 0)
        for n, kk, st, dd in zip(size, k, s, d, strict=True)
    ]
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    return tuple(small + big) if mode == "SAME_UPPER" else tuple(big + small)


def window_out(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool) -> int:
    """Conv / pool output length (ONNX Conv, MaxPool; ceil_mode as torch: a window must
    start inside the input or the begin padding)."""
    span = n + pb + pe - d * (k - 1) - 1
    out = (ceil(span / s) if ceil_mode else floor(span / s)) + 1
    if ceil_mode and (out - 1) * s >= n + pb:
        out -= 1
    return out


def _conv(ctx: Context, node: Any) -> None:
    a = attrs(node)
    x = ctx.data(node, node.input[0])
    n, c, *size = ctx.shapes[x]
    w = np.asarray(ctx.const(node, 1), np.float32)
    b = ctx.const(node, 2, required=False)
    if w.ndim != 5:
        raise ValueError(f"{ctx.where(node)}: weight of shape {w.shape} is not a 3D kernel")
    k = tuple(int(v) for v in w.shape[2:])
    s = spatial(ctx, node, a.get("strides"), 1, "strides")
    d = spatial(ctx, node, a.get("dilations"), 1, "dilations")
    group = int(a.get("group", 1))
    if c != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(
            f"{ctx.where(node)}: {c} input channels do not fit weight {w.shape} with group={group}"
        )
    pads = _auto_pads(ctx, node, a, tuple(size), k, s, d)
    out = [window_out(size[i], k[i], s[i], d[i], pads[i], pads[i + 3], False) for i in range(3)]
    if min(out) < 1:
        raise ValueError(f"{ctx.where(node)}: window {tuple(size)} is too small for kernel {k}")
    params = {
        "weight": w,
        "bias": None if b is None else np.asarray(b, np.float32),
        "strides": s,
        "pads": pads,
        "dilations": d,
        "group": group,
    }
    ctx.add(node, "conv", (x,), (n, w.shape[0], *out), params)


def _conv_transpose(ctx: Context, node: Any) -> None:
    a = attrs(node)
    x = ctx.data(node, node.input[0])
    n, c, *size = ctx.shapes[x]
    w = np.asarray(ctx.const(node, 1), np.float32)
    b = ctx.const(node, 2, required=False)
    group = int(a.get("group", 1))
    if w.ndim != 5 or w.shape[0] != c or c % group:
        raise ValueError(
            f"{ctx.where(node)}: weight {w.shape} does not fit {c} input channels "
            f"with group={group}"
        )
    k = tuple(int(v) for v in w.shape[2:])
    s = spatial(ctx, node, a.get("strides"), 1, "strides")
    d = spatial(ctx, node, a.get("dilations"), 1, "dilations")
    op = spatial(ctx, node, a.get("output_padding"), 0, "output_padding")
    full = [s[i] * (size[i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 for i in range(3)]
    if "output_shape" in a:  # ONNX ConvTranspose: pads follow from the requested shape
        want = [int(v) for v in a["output_shape"]][-3:]
        total = [f - o for f, o in zip(full, want, strict=True)]
        upper = a.get("auto_pad", "NOTSET") == "SAME_UPPER"
        pb = [t // 2 if upper else t - t // 2 for t in total]
        pads = tuple(pb + [t - p for t, p in zip(total, pb, strict=True)])
    elif a.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
        raise ValueError(
            f"{ctx.where(node)}: auto_pad {a['auto_pad']} without output_shape is not supported"
        )
    else:
        pads = tuple(int(p) for p in a.get("pads", (0,) * 6))
    out = [full[i] - pads[i] - pads[i + 3] for i in range(3)]
    params = {
        "weight": w,
        "bias": None if b is None else np.asarray(b, np.float32),
        "strides": s,
        "pads": pads,
        "output_padding": op,
        "dilations": d,
        "group": group,
    }
    ctx.add(node, "conv_transpose", (x,), (n, w.shape[1] * group, *out), params)


def _pool(ctx: Context, node: Any) -> None:
    a = attrs(node)
    if len(node.output) > 1 and node.output[1]:
        raise ValueError(f"{ctx.where(node)}: the Indices output of MaxPool is not supported")
    x = ctx.data(node, node.input[0])
    n, c, *size = ctx.shapes[x]
    k = spatial(ctx, node, a.get("kernel_shape"), 1, "kernel_shape")
    s = spatial(ctx, node, a.get("strides"), 1, "strides")
    d = spatial(ctx, node, a.get("dilations"), 1, "dilations")
    pads = _auto_pads(ctx, node, a, tuple(size), k, s, d)
    ceil_mode = bool(a.get("ceil_mode", 0))
    out = [window_out(size[i], k[i], s[i], d[i], pads[i], pads[i + 3], ceil_mode) for i in range(3)]
    if min(out) < 1:
        raise ValueError(f"{ctx.where(node)}: window {tuple(size)} is too small for pool {k}")
    params: dict[str, Any] = {"kernel": k, "strides": s, "pads": pads, "ceil_mode": ceil_mode}
    if node.op_type == "MaxPool":
        params["dilations"] = d
        ctx.add(node, "maxpool", (x,), (n, c, *out), params)
    else:
        if d != (1, 1, 1):
            raise ValueError(f"{ctx.where(node)}: dilated AveragePool is not supported")
        params["count_include_pad"] = bool(a.get("count_include_pad", 0))
        ctx.add(node, "avgpool", (x,), (n, c, *out), params)


def _resize(ctx: Context, node: Any) -> None:
    a = attrs(node)
    x = ctx.data(node, node.input[0])
    shape = ctx.shapes[x]
    if node.op_type == "Upsample" or ctx.opset < 11:
        scales_in = ctx.const(node, 1) if len(node.input) > 1 else a.get("scales")
        sizes_in = None
        mode_ctm = "asymmetric"
    else:
        scales_in = ctx.const(node, 2, required=False)
        sizes_in = ctx.const(node, 3, required=False)
        mode_ctm = a.get("coordinate_transformation_mode", "half_pixel")
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear") or a.get("antialias", 0):
        raise ValueError(
            f"{ctx.where(node)}: Resize mode {mode!r} (antialias "
            f"{a.get('antialias', 0)}) is not supported; nearest and linear are"
        )
    if sizes_in is not None and np.asarray(sizes_in).size:
        sizes = [int(v) for v in np.asarray(sizes_in)]
        scales = None
    else:
        sc = [float(v) for v in np.asarray(scales_in)]
        sizes = [floor(n * f) for n, f in zip(shape, sc, strict=True)]
        scales = tuple(sc[2:])
    if len(sizes) != 5 or sizes[:2] != list(shape[:2]):
        raise ValueError(
            f"{ctx.where(node)}: only the spatial axes may be resized "
            f"(input {shape}, output {tuple(sizes)})"
        )
    params = {
        "size": tuple(sizes[2:]),
        "mode": mode,
        "coordinate_transformation_mode": mode_ctm,
        "nearest_mode": a.get("nearest_mode", "round_prefer_floor"),
        "scales": scales,
    }
    if node.op_type == "Upsample" and mode == "nearest":
        params["nearest_mode"] = "floor"
    ctx.add(node, "resize", (x,), tuple(sizes), params)


def _concat(ctx: Context, node: Any) -> None:
    axis = int(attrs(node).get("axis", 1))
    if axis not in (1, -4):
        raise ValueError(
            f"{ctx.where(node)}: Concat on axis {axis}; znni concatenates channels (axis 1) only"
        )
    xs = tuple(ctx.data(node, i) for i in node.input)
    shapes = [ctx.shapes[t] for t in xs]
    if len({(s[0], *s[2:]) for s in shapes}) != 1:
        raise ValueError(f"{ctx.where(node)}: inputs of shapes {shapes} differ outside channels")
    n, _, *size = shapes[0]
    ctx.add(node, "concat", xs, (n, sum(s[1] for s in shapes), *size))


def _binary(ctx: Context, node: Any) -> None:
    op = node.op_type.lower()
    left, right = node.input[0], node.input[1]
    names = [ctx.alias.get(t, t) for t in (left, right)]
    data = [t in ctx.shapes for t in names]
    if all(data):
        shape = np.broadcast_shapes(ctx.shapes[names[0]], ctx.shapes[names[1]])
        ctx.add(node, op, (names[0], names[1]), shape)
        return
    i = 0 if data[0] else 1
    x = ctx.data(node, names[i])
    k = np.asarray(ctx.consts[names[1 - i]], np.float32)
    shape = np.broadcast_shapes(ctx.shapes[x], k.shape)
    if len(shape) != 5 or shape[0] != ctx.shapes[x][0]:
        raise ValueError(
            f"{ctx.where(node)}: constant of shape {k.shape} does not broadcast "
            f"onto {ctx.shapes[x]}"
        )
    ctx.add(node, op, (x,), shape, {"constant": k, "constant_first": i == 1})


CONVERTERS: dict[str, Callable[[Context, Any], None]] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "Resize": _resize,
    "Upsample": _resize,
    "Concat": _concat,
    "Add": _binary,
    "Sub": _binary,
    "Mul": _binary,
    "Div": _binary,
    **norm_converters(),
    **pointwise_converters(),
    **reshape_converters(),
}
SUPPORTED_OPS = tuple(sorted(CONVERTERS))


def fold_batch_norms(nodes: list[Node], output: str) -> list[Node]:
    """BatchNormalization after a Conv whose output nothing else reads -> the conv's weights
    (w * g / sqrt(var + eps), (b - mean) * g / sqrt(var + eps) + beta)."""
    readers: dict[str, int] = {}
    for node in nodes:
        for t in node.inputs:
            readers[t] = readers.get(t, 0) + 1
    producer = {node.outputs[0]: i for i, node in enumerate(nodes)}
    out = list(nodes)
    drop: set[int] = set()
    for i, node in enumerate(nodes):
        if node.op != "batch_norm":
            continue
        j = producer.get(node.inputs[0])
        if j is None:
            continue
        conv = out[j]
        if (
            conv.op != "conv"
            or readers[node.inputs[0]] != 1
            or node.inputs[0] == output
        ):
            continue
        p = node.params
        g = p["scale"] / np.sqrt(p["var"].astype(np.float64) + p["epsilon"])
        w = conv.params["weight"].astype(np.float64) * g[:, None, None, None, None]
        b0 = conv.params["bias"] if conv.params["bias"] is not None else 0.0
        b = (np.asarray(b0, np.float64) - p["mean"]) * g + p["bias"]
        params = {**conv.params, "weight": w.astype(np.float32), "bias": b.astype(np.float32)}
        out[j] = Node(conv.name, "conv", conv.inputs, node.outputs, params)
        drop.add(i)
    return [node for i, node in enumerate(out) if i not in drop]
