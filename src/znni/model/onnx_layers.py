"""ONNX converters for normalisations, point-wise ops, and the shape-keeping data ops
(Reshape in the GroupNorm form, Slice, Pad). See `onnx_ops` for the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, SupportsInt

import numpy as np

from znni.model.onnx_context import Context, attrs

Converter = Callable[[Context, Any], None]
SELU_ALPHA = 1.67326319217681884765625  # ONNX Selu defaults
SELU_GAMMA = 1.05070102214813232421875


def _f32(a: Any) -> np.ndarray:
    return np.asarray(a, np.float32)


def _batch_norm(ctx: Context, node: Any) -> None:
    a = attrs(node)
    if a.get("training_mode", 0):
        raise ValueError(f"{ctx.where(node)}: training-mode BatchNormalization is not supported")
    x = ctx.data(node, node.input[0])
    params = {
        "scale": _f32(ctx.const(node, 1)),
        "bias": _f32(ctx.const(node, 2)),
        "mean": _f32(ctx.const(node, 3)),
        "var": _f32(ctx.const(node, 4)),
        "epsilon": float(a.get("epsilon", 1e-5)),
    }
    ctx.add(node, "batch_norm", (x,), ctx.shapes[x], params)


def _instance_norm(ctx: Context, node: Any) -> None:
    eps = float(attrs(node).get("epsilon", 1e-5))
    scale, bias = _f32(ctx.const(node, 1)), _f32(ctx.const(node, 2))
    name = ctx.alias.get(node.input[0], node.input[0])
    if name in ctx.grouped:  # Reshape (N, G, -1) -> InstanceNormalization -> Reshape back
        x, groups = ctx.grouped[name]
        c = ctx.shapes[x][1]
        params = {
            "groups": groups,
            "scale": np.repeat(scale, c // groups),
            "bias": np.repeat(bias, c // groups),
            "epsilon": eps,
        }
        ctx.add(node, "group_norm", (x,), ctx.shapes[x], params)
        ctx.grouped[node.output[0]] = (node.output[0], -1)  # the Reshape back aliases it
        return
    x = ctx.data(node, node.input[0])
    ctx.add(
        node, "instance_norm", (x,), ctx.shapes[x], {"scale": scale, "bias": bias, "epsilon": eps}
    )


def _group_norm(ctx: Context, node: Any) -> None:
    a = attrs(node)
    x = ctx.data(node, node.input[0])
    c = ctx.shapes[x][1]
    groups = int(a["num_groups"])
    if groups < 1 or c % groups:
        raise ValueError(f"{ctx.where(node)}: {c} channels do not split into {groups} groups")
    scale, bias = _f32(ctx.const(node, 1)), _f32(ctx.const(node, 2))
    if scale.size == groups and groups != c:  # opset 18: one scale per group
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    params = {
        "groups": groups,
        "scale": scale,
        "bias": bias,
        "epsilon": float(a.get("epsilon", 1e-5)),
    }
    ctx.add(node, "group_norm", (x,), ctx.shapes[x], params)


def norm_converters() -> dict[str, Converter]:
    return {
        "BatchNormalization": _batch_norm,
        "InstanceNormalization": _instance_norm,
        "GroupNormalization": _group_norm,
    }


def _unary(op: str, **defaults: float) -> Converter:
    def convert(ctx: Context, node: Any) -> None:
        a = attrs(node)
        x = ctx.data(node, node.input[0])
        params = {k: float(a.get(k, v)) for k, v in defaults.items()}
        ctx.add(node, op, (x,), ctx.shapes[x], params)

    return convert


def _prelu(ctx: Context, node: Any) -> None:
    x = ctx.data(node, node.input[0])
    slope = _f32(ctx.const(node, 1))
    c = ctx.shapes[x][1]
    if slope.size not in (1, c):
        raise ValueError(
            f"{ctx.where(node)}: slope of shape {slope.shape} is neither one "
            f"value nor one per channel ({c})"
        )
    ctx.add(node, "prelu", (x,), ctx.shapes[x], {"slope": slope.reshape(-1)})


def _softmax(ctx: Context, node: Any) -> None:
    axis = int(attrs(node).get("axis", 1 if ctx.opset < 13 else -1))
    if axis not in (1, -4) or ctx.opset < 13:
        raise ValueError(
            f"{ctx.where(node)}: Softmax on axis {axis} (opset {ctx.opset}); znni "
            "runs softmax over channels (axis 1, opset 13 or later)"
        )
    x = ctx.data(node, node.input[0])
    ctx.add(node, "softmax", (x,), ctx.shapes[x])


def _clip(ctx: Context, node: Any) -> None:
    x = ctx.data(node, node.input[0])
    if ctx.opset < 11:
        a = attrs(node)
        lo, hi = a.get("min"), a.get("max")
    else:
        lo, hi = ctx.const(node, 1, required=False), ctx.const(node, 2, required=False)
    params = {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)}
    ctx.add(node, "clip", (x,), ctx.shapes[x], params)


def _passthrough(ctx: Context, node: Any) -> None:
    """Identity, Dropout (inference), Cast to float: the output is the input tensor."""
    if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
        raise ValueError(f"{ctx.where(node)}: the mask output of Dropout is not supported")
    if node.op_type == "Cast" and int(attrs(node)["to"]) != 1:  # 1 = FLOAT
        raise ValueError(f"{ctx.where(node)}: a Cast of the data to another type than float")
    ctx.alias[node.output[0]] = ctx.data(node, node.input[0])


def pointwise_converters() -> dict[str, Converter]:
    return {
        "Relu": _unary("relu"),
        "Sigmoid": _unary("sigmoid"),
        "Tanh": _unary("tanh"),
        "LeakyRelu": _unary("leaky_relu", alpha=0.01),
        "Elu": _unary("elu", alpha=1.0),
        "Selu": _unary("selu", alpha=SELU_ALPHA, gamma=SELU_GAMMA),
        "PRelu": _prelu,
        "Softmax": _softmax,
        "Clip": _clip,
        "Identity": _passthrough,
        "Dropout": _passthrough,
        "Cast": _passthrough,
    }


def _reshape(ctx: Context, node: Any) -> None:
    """Only the two Reshapes around InstanceNormalization that older exporters write for
    GroupNorm, and reshapes that keep the shape."""
    name = ctx.alias.get(node.input[0], node.input[0])
    target = [int(v) for v in np.asarray(ctx.const(node, 1))]
    if name in ctx.grouped and ctx.grouped[name][1] == -1:  # back from the group norm
        ctx.alias[node.output[0]] = name
        return
    x = ctx.data(node, node.input[0])
    shape = ctx.shapes[x]
    resolved = [shape[i] if v == 0 else v for i, v in enumerate(target)]
    if resolved == list(shape):
        ctx.alias[node.output[0]] = x
        return
    if (
        len(target) == 3
        and resolved[0] == shape[0]
        and resolved[2] == -1
        and resolved[1] > 0
        and shape[1] % resolved[1] == 0
    ):
        ctx.grouped[node.output[0]] = (x, resolved[1])
        return
    raise ValueError(
        f"{ctx.where(node)}: Reshape of {shape} to {target} is not supported "
        "(only the GroupNorm form: (N, G, -1) around InstanceNormalization)"
    )


def _slice(ctx: Context, node: Any) -> None:
    x = ctx.data(node, node.input[0])
    shape = ctx.shapes[x]
    axes: Iterable[SupportsInt]
    steps: Iterable[SupportsInt]
    if ctx.opset < 10:
        a = attrs(node)
        starts, ends = a["starts"], a["ends"]
        axes, steps = a.get("axes", range(len(starts))), [1] * len(starts)
    else:
        starts, ends = ctx.const(node, 1), ctx.const(node, 2)
        given_axes = ctx.const(node, 3, required=False)
        given_steps = ctx.const(node, 4, required=False)
        axes = range(len(starts)) if given_axes is None else given_axes
        steps = [1] * len(starts) if given_steps is None else given_steps
    slices = [(0, n, 1) for n in shape]
    for st, en, ax, sp in zip(starts, ends, axes, steps, strict=True):
        ax = int(ax) % 5
        if ax == 0:
            raise ValueError(f"{ctx.where(node)}: slicing the batch axis is not supported")
        slices[ax] = slice(int(st), int(en), int(sp)).indices(shape[ax])
    out = tuple(len(range(*s)) for s in slices)
    if min(out) < 1:
        raise ValueError(f"{ctx.where(node)}: the slice of {shape} is empty")
    ctx.add(node, "slice", (x,), out, {"slices": tuple(slices)})


def _pad(ctx: Context, node: Any) -> None:
    a = attrs(node)
    x = ctx.data(node, node.input[0])
    shape = ctx.shapes[x]
    if ctx.opset < 11:
        pads, value = list(a["pads"]), float(a.get("value", 0.0))
    else:
        pads = [int(v) for v in np.asarray(ctx.const(node, 1))]
        v = ctx.const(node, 2, required=False)
        value = 0.0 if v is None or np.asarray(v).size == 0 else float(np.asarray(v).reshape(-1)[0])
        axes = ctx.const(node, 3, required=False)
        if axes is not None:
            full = [0] * 10
            for i, ax in enumerate(int(v) % 5 for v in axes):
                full[ax], full[ax + 5] = pads[i], pads[i + len(axes)]
            pads = full
    mode = a.get("mode", "constant")
    if len(pads) != 10 or any(pads[i] or pads[i + 5] for i in (0, 1)):
        raise ValueError(f"{ctx.where(node)}: pads {pads} must pad only the spatial axes")
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"{ctx.where(node)}: Pad mode {mode!r} is not supported")
    spatial = (pads[2], pads[3], pads[4], pads[7], pads[8], pads[9])
    out = (*shape[:2], *(shape[2 + i] + spatial[i] + spatial[i + 3] for i in range(3)))
    ctx.add(node, "pad", (x,), out, {"pads": spatial, "mode": mode, "value": value})


def reshape_converters() -> dict[str, Converter]:
    return {"Reshape": _reshape, "Slice": _slice, "Pad": _pad}
