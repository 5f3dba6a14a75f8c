"""A graph's conv node as the sequential layer shape the cost model prices."""

from __future__ import annotations

from znni.model.graph import Graph, Node
from znni.model.network import LayerShape


def conv_layer(graph: Graph, i: int, node: Node, batch: int = 1) -> LayerShape:
    """The conv node as a sequential layer shape: padded input -> output, `batch` windows."""
    _, cin, *size = graph.shapes[node.inputs[0]]
    pads = node.params["pads"]
    padded = (size[0] + pads[0] + pads[3], size[1] + pads[1] + pads[4], size[2] + pads[2] + pads[5])
    _, cout, *out = graph.shapes[node.outputs[0]]
    w = node.params["weight"].shape
    return LayerShape(i, "conv", batch, cin, padded, batch, cout, (out[0], out[1], out[2]),
                      (int(w[2]), int(w[3]), int(w[4])))
