"""What each graph op runs on the host: the kernel table `engine.graph_forward` calls
for ops that are not fast convs, and the in-place variants it may use when an op's input
dies at it (no new buffer). Kernels read the node's params dict and its input arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Params = Mapping[str, Any]  # a node's params (model.graph.Node.params)


def _relu_(p: Params, x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


def _leaky_relu_(p: Params, x: np.ndarray) -> np.ndarray:
    neg = x * np.float32(p["alpha"])  # alpha < 1: max(x, alpha x); else min
    return np.maximum(x, neg, out=x) if p["alpha"] <= 1 else np.minimum(x, neg, out=x)


def _sigmoid_(p: Params, x: np.ndarray) -> np.ndarray:
    np.negative(x, out=x)
    np.exp(x, out=x)
    x += 1
    return np.reciprocal(x, out=x)


def _tanh_(p: Params, x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


def _instance_norm_(p: Params, x: np.ndarray) -> np.ndarray:
    from znni.primitives.cpu import graph_ops as g

    act = p.get("activation")
    return g.instance_norm(x, p["scale"], p["bias"], p["epsilon"], activation=act, out=x)


def _group_norm_(p: Params, x: np.ndarray) -> np.ndarray:
    from znni.primitives.cpu import graph_ops as g

    act = p.get("activation")
    return g.group_norm(x, p["groups"], p["scale"], p["bias"], p["epsilon"], activation=act, out=x)


# ops that may overwrite their input when it dies at them (no new buffer)
INPLACE: dict[str, Callable[[Params, np.ndarray], np.ndarray]] = {
    "relu": _relu_,
    "leaky_relu": _leaky_relu_,
    "sigmoid": _sigmoid_,
    "tanh": _tanh_,
    "instance_norm": _instance_norm_,
    "group_norm": _group_norm_,
}


def _slice(p: Params, x: np.ndarray) -> np.ndarray:
    """(start, stop, step) per axis as slice.indices gives them; a stop of -1 with a
    negative step means 'through index 0', which a slice writes as None."""
    index = tuple(slice(a, b if b >= 0 else None, c) for a, b, c in p["slices"][1:])
    # the whole batch (the importer refuses batch slices); a view: its readers copy it once
    return x[(slice(None), *index)]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(params: Params, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        if b is None:
            k = params["constant"]
            a, b = (k, a) if params["constant_first"] else (a, k)
        return np.asarray(fn(a, b), np.float32)

    return run


def _kernels() -> dict[str, Callable[..., np.ndarray]]:
    from znni.primitives.cpu import graph_ops as g

    def sigmoid(p: Params, x: np.ndarray) -> np.ndarray:
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)

    return {
        "conv_transpose": lambda p, x: g.conv_transpose3d(
            x,
            p["weight"],
            p["bias"],
            strides=p["strides"],
            pads=p["pads"],
            output_padding=p["output_padding"],
            dilations=p["dilations"],
            groups=p["group"],
        ),
        "maxpool": lambda p, x: g.max_pool3d(
            x, p["kernel"], p["strides"], p["pads"], p["dilations"], p["ceil_mode"]
        ),
        "avgpool": lambda p, x: g.avg_pool3d(
            x, p["kernel"], p["strides"], p["pads"], p["ceil_mode"], p["count_include_pad"]
        ),
        "resize": lambda p, x: g.resize3d(
            x,
            p["size"],
            mode=p["mode"],
            coordinate_transformation_mode=p["coordinate_transformation_mode"],
            nearest_mode=p["nearest_mode"],
            scales=p["scales"],
        ),
        "concat": lambda p, *xs: g.concat_channels(xs),
        "add": _binary(np.add),
        "sub": _binary(np.subtract),
        "mul": _binary(np.multiply),
        "div": _binary(np.divide),
        "slice": _slice,
        # a Pad of zero widths (U-Net skip alignment) passes x on, as identity does
        "pad": lambda p, x: g.pad3d(x, p["pads"], p["mode"], p["value"]) if any(p["pads"]) else x,
        "instance_norm": lambda p, x: g.instance_norm(
            x, p["scale"], p["bias"], p["epsilon"], activation=p.get("activation")
        ),
        "group_norm": lambda p, x: g.group_norm(
            x, p["groups"], p["scale"], p["bias"], p["epsilon"], activation=p.get("activation")
        ),
        "batch_norm": lambda p, x: g.batch_norm(
            x, p["scale"], p["bias"], p["mean"], p["var"], p["epsilon"]
        ),
        "relu": lambda p, x: np.maximum(x, 0, dtype=np.float32),
        "leaky_relu": lambda p, x: g.leaky_relu(x, p["alpha"]),
        "prelu": lambda p, x: g.prelu(x, p["slope"] if p["slope"].size > 1 else p["slope"][0]),
        "elu": lambda p, x: g.elu(x, p["alpha"]),
        "selu": lambda p, x: g.selu(x),
        "sigmoid": sigmoid,
        "tanh": lambda p, x: np.tanh(x).astype(np.float32),
        "softmax": lambda p, x: g.softmax_channels(x),
        "clip": lambda p, x: g.clip(x, p["min"], p["max"]),
        "identity": lambda p, x: x,
    }


class _LazyKernels(dict[str, Callable[..., np.ndarray]]):
    """The kernel table, built on first use (graph_ops lives in the pyFFTW package)."""

    def get(self, key: str, default: Any = None) -> Any:
        if not self:
            self.update(_kernels())
        return super().get(key, default)


KERNELS: dict[str, Callable[..., np.ndarray]] = _LazyKernels()
