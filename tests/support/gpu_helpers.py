"""Shared helpers of the GPU tests: random networks as ops plus their layer dicts."""

from __future__ import annotations

import numpy as np

from znni.primitives.base import Activation, Conv, Op, Pool


def ops_from_layers(layers: list[dict], params: dict) -> list[Op]:
    ops: list[Op] = []
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            ops.append(Conv(params[f"{i}.weight"], params[f"{i}.bias"]))
        elif layer["kind"] == "maxpool":
            ops.append(Pool(tuple(layer["window"])))
        else:
            ops.append(Activation(layer["kind"], layer.get("slope", 0.01)))
    return ops


def valid_size(layers: list[dict], minimum: int, axis: int) -> int:
    """Smallest MPF-valid input size >= minimum along `axis` (independent of znni)."""
    for n0 in range(minimum, minimum + 200):
        n, ok = n0, True
        for layer in layers:
            if layer["kind"] == "conv":
                n -= layer["kernel"][axis] - 1
            elif layer["kind"] == "maxpool":
                p = layer["window"][axis]
                if (n + 1) % p or n + 1 < 2 * p:
                    ok = False
                    break
                n = (n + 1) // p - 1
            if n < 1:
                ok = False
                break
        if ok:
            return n0
    raise AssertionError("no valid size")


def net_layers(cin: int, rng: np.random.Generator, widths=(4, 5, 3)) -> tuple[list[dict], dict]:
    """conv-relu-pool(2,2,2)-conv-tanh-pool(1,2,2)-conv-sigmoid with anisotropic kernels."""
    layers = [
        {"kind": "conv", "out_channels": widths[0], "kernel": [3, 2, 3]},
        {"kind": "relu"},
        {"kind": "maxpool", "window": [2, 2, 2]},
        {"kind": "conv", "out_channels": widths[1], "kernel": [2, 3, 2]},
        {"kind": "tanh"},
        {"kind": "maxpool", "window": [1, 2, 2]},
        {"kind": "conv", "out_channels": widths[2], "kernel": [2, 2, 1]},
        {"kind": "sigmoid"},
    ]
    params, c = {}, cin
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], c, *layer["kernel"])
            params[f"{i}.weight"] = (
                rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
            ).astype(np.float32)
            params[f"{i}.bias"] = (0.1 * rng.standard_normal(shape[0])).astype(np.float32)
            c = shape[0]
    return layers, params
