"""One entry point for every network file a user gives: a JSON spec or an ONNX model.

An ONNX model that is a plain chain of valid convolutions, strided max-pools and
ZNNi's activations (an exported `nn.Sequential` ZNNi-style network) becomes the same
`Network` a JSON spec gives, and runs exactly with max-pooling fragments. Any other
ONNX model is an `OnnxModel`, run in overlapping blended windows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from znni.model.graph import Graph, Node
from znni.model.network import Network
from znni.model.onnx_import import load_onnx
from znni.model.onnx_model import OnnxModel, _probe_window, load_onnx_model
from znni.model.spec import LayerSpec
from znni.primitives.base import Activation, Conv, Op, Pool

ACTIVATIONS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "identity": "linear"}


def load_model(
    path: str | Path,
    weights: str | Path | None = None,
    *,
    output_name: str | None = None,
    scale: float | None = None,
    shift: float | None = None,
) -> Network | OnnxModel:
    """The network in `path` (.onnx: an ONNX model; a .zip, a folder or a .yaml: a
    bioimage.io package; anything else: a JSON spec)."""
    from znni.model.network import load_network

    path = Path(path)
    if path.suffix.lower() not in (".onnx", ".json") and _is_package(path):
        given = [f for f, v in (("--weights", weights), ("--output-name", output_name),
                                ("--scale", scale), ("--shift", shift)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} applies to bare ONNX models and JSON specs; "
                             f"the bioimage.io package {path} declares its own weights and "
                             "preprocessing")
        from znni.model.bioimage_package import load_package

        return load_package(path)
    if path.suffix.lower() == ".onnx":
        if weights is not None:
            raise ValueError(f"--weights applies to JSON specs; ONNX model {path} holds its own")
        return load_onnx_network(path, output_name, scale or 1.0, 0.0 if shift is None else shift)
    given = [
        f
        for f, v in (("--output-name", output_name), ("--scale", scale), ("--shift", shift))
        if v is not None
    ]
    if given:
        raise ValueError(
            f"{', '.join(given)} applies to ONNX models; the JSON spec {path} "
            "sets its input transform in its 'input' block"
        )
    return load_network(path, weights)


def _is_package(path: Path) -> bool:
    from znni.model.bioimage_package import is_package

    return is_package(path)


def load_onnx_network(
    path: Path, output_name: str | None, scale: float, shift: float
) -> Network | OnnxModel:
    """A `Network` for chain models (exact, MPF), else an `OnnxModel` (windowed)."""
    try:
        probe = load_onnx(path, _probe_window(path), output_name)
    except ValueError:
        probe = None
    if probe is not None:
        network = chain_network(probe, scale, shift)
        if network is not None:
            return network
    return load_onnx_model(path, output_name, scale, shift)


def chain_network(graph: Graph, scale: float, shift: float) -> Network | None:
    """The graph as a sequential `Network`, or None when it is not such a chain."""
    prev, layers, ops = graph.input, [], []
    for node in graph.nodes:
        if node.inputs != (prev,):
            return None
        layer_op = _layer(node)
        if layer_op is None:
            return None
        layers.append(layer_op[0])
        ops.append(layer_op[1])
        prev = node.outputs[0]
    if prev != graph.output or not any(isinstance(op, Conv) for op in ops):
        return None
    digest = hashlib.sha256(f"{graph.digest}|{scale!r}|{shift!r}".encode()).hexdigest()
    return Network(
        graph.name, graph.in_channels, float(scale), float(shift), tuple(layers), tuple(ops), digest
    )


def _layer(node: Node) -> tuple[LayerSpec, Op] | None:
    p = node.params
    if node.op == "conv":
        plain = p["strides"] == (1, 1, 1) and p["dilations"] == (1, 1, 1) and p["group"] == 1
        if not plain or any(p["pads"]):
            return None
        w = p["weight"]
        kernel = (int(w.shape[2]), int(w.shape[3]), int(w.shape[4]))
        b = p["bias"] if p["bias"] is not None else np.zeros(w.shape[0], np.float32)
        return LayerSpec("conv", int(w.shape[0]), kernel), Conv(w, b)
    if node.op == "maxpool":
        k = tuple(int(v) for v in p["kernel"])
        if (
            tuple(p["strides"]) != k
            or any(p["pads"])
            or p["dilations"] != (1, 1, 1)
            or p["ceil_mode"]
        ):
            return None
        window = (k[0], k[1], k[2])
        return LayerSpec("maxpool", window=window), Pool(window)
    if node.op == "elu" and p.get("alpha", 1.0) == 1.0:
        return LayerSpec("elu"), Activation("elu")
    if node.op == "leaky_relu":
        slope = float(p.get("alpha", 0.01))
        return LayerSpec("leaky_relu", slope=slope), Activation("leaky_relu", slope)
    if node.op in ACTIVATIONS:
        kind = ACTIVATIONS[node.op]
        return LayerSpec(kind), Activation(kind)
    return None
