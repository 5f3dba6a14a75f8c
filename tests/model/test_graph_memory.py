"""Graph.live_tensor_bytes / peak_tensor_bytes: the buffers the host executor holds at each
node, against hand counts (engine.graph_forward.run_graph's lifetimes)."""

from __future__ import annotations

import numpy as np

from znni.model.graph import Graph, Node

ONE = (1, 1, 4, 4, 4)  # 64 float32: 256 bytes


def decoder() -> Graph:
    """x -> a, b; concat(a, b) read by a padded 3^3 conv -> y; then z = tanh(y), out = y + z."""
    conv = {"weight": np.zeros((1, 2, 3, 3, 3), np.float32), "bias": None,
            "strides": (1, 1, 1), "pads": (1,) * 6, "dilations": (1, 1, 1), "group": 1}
    nodes = (
        Node("r", "relu", ("x",), ("a",)),  # x is the caller's: a is a new buffer
        Node("s", "sigmoid", ("a",), ("b",)),  # a is read again: b is a new buffer
        Node("cat", "concat", ("a", "b"), ("c",)),  # 512 bytes, or none when read in parts
        Node("k", "conv", ("c",), ("y",), conv),  # y: 256
        Node("t", "tanh", ("y",), ("z",)),  # y is read again: z is a new buffer
        Node("sum", "add", ("y", "z"), ("out",)),
    )
    shapes = {"x": ONE, "a": ONE, "b": ONE, "c": (1, 2, 4, 4, 4), "y": ONE, "z": ONE,
              "out": ONE}
    return Graph("decoder", "x", 1, (4, 4, 4), nodes, "out", 1, (4, 4, 4), "d", shapes)


def test_a_concat_read_in_parts_frees_its_parts_after_the_conv() -> None:
    """Unbuilt, the concat's parts a and b live until conv k has read them, then go; the
    input x lives through the pass. By hand, in units of 256 bytes:
    r: x a | s: x a b | cat: x a b | k: x a b y | t: x y z | sum: x y z out."""
    graph = decoder()
    got = graph.live_tensor_bytes(unbuilt=frozenset({"c"}))
    assert got == [256 * n for n in (2, 3, 3, 4, 3, 4)]
    assert graph.peak_tensor_bytes(unbuilt=frozenset({"c"})) == 4 * 256


def test_a_built_concat_frees_its_parts_at_once() -> None:
    """Built: cat holds x a b and c (2 units); a and b go after it; c after conv k."""
    graph = decoder()
    assert graph.live_tensor_bytes() == [256 * n for n in (2, 3, 5, 4, 3, 4)]
    assert graph.peak_tensor_bytes() == 5 * 256


def test_the_input_lives_through_the_pass() -> None:
    """x's last reader is node 0, yet run_graph (and its caller) hold it: a chain of
    relu (new buffer) and an in-place sigmoid holds x and one more buffer throughout."""
    nodes = (Node("r", "relu", ("x",), ("a",)), Node("s", "sigmoid", ("a",), ("b",)),
             Node("t", "tanh", ("b",), ("y",)))
    shapes = {"x": ONE, "a": ONE, "b": ONE, "y": ONE}
    graph = Graph("chain", "x", 1, (4, 4, 4), nodes, "y", 1, (4, 4, 4), "d", shapes)
    assert graph.live_tensor_bytes() == [512, 512, 512]
    assert graph.live_tensor_bytes(batch=2) == [1024, 1024, 1024]


def test_convs_run_in_one_call_hold_no_buffer_between_them() -> None:
    """r: x -> a, then conv p (its relu q writes p's buffer) and conv k run as one call
    (calls {1: 3}, model.openvino_layers.openvino_chains): u and v get no buffer, and a, the call's
    input, lives until the call ends. By hand, in units of 256 bytes:
    apart r: x a | p: x a u | q: x u | k: x u w; in one call r: x a | p: x a | q: x a | k: x a w."""
    conv = {"weight": np.zeros((1, 1, 3, 3, 3), np.float32), "bias": None,
            "strides": (1, 1, 1), "pads": (1,) * 6, "dilations": (1, 1, 1), "group": 1}
    nodes = (Node("r", "relu", ("x",), ("a",)), Node("p", "conv", ("a",), ("u",), conv),
             Node("q", "relu", ("u",), ("v",)), Node("k", "conv", ("v",), ("w",), conv))
    shapes = {t: ONE for t in ("x", "a", "u", "v", "w")}
    graph = Graph("call", "x", 1, (4, 4, 4), nodes, "w", 1, (4, 4, 4), "d", shapes)
    assert graph.live_tensor_bytes() == [256 * n for n in (2, 3, 2, 3)]
    assert graph.live_tensor_bytes(calls={1: 3}) == [256 * n for n in (2, 2, 2, 3)]
    assert graph.peak_tensor_bytes(batch=2, calls={1: 3}) == 2 * 3 * 256
