"""Which OpenVINO convs of a graph hand their output on channels-last, and which run one
after another in one compiled layer (primitives/cpu/openvino_conv; docs/design.md, "Planned").

The executor (engine.graph_forward) and the planner (planner.graph.search) read the same
answers, so what is predicted is what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from znni.model.graph import (
    Graph,
    Node,
    absorbs_next_activation,
    concat_read_in_parts,
    stride_one_conv,
)


def absorbs_next_norm(
    graph: Graph, i: int, readers: dict[str, int], primitive: str | None
) -> bool:
    """Whether node i, a fast conv on `primitive` OpenVINO, applies the InstanceNormalization
    right after it in its own compiled layer: that norm alone reads the conv's output (its
    own following activation then goes with it, see absorbs_next_activation)."""
    nodes = graph.nodes
    if primitive != "openvino" or not stride_one_conv(nodes[i]) or i + 1 >= len(nodes):
        return False
    nxt = nodes[i + 1]
    return (nxt.op == "instance_norm" and nxt.inputs == nodes[i].outputs
            and readers[nodes[i].outputs[0]] == 1)


def openvino_output_node(graph: Graph, i: int, readers: dict[str, int]) -> int:
    """The last node an OpenVINO conv at node i applies in its call: itself, the norm after
    it (absorbs_next_norm), the activation after either (absorbs_next_activation)."""
    j = i + 1 if absorbs_next_norm(graph, i, readers, "openvino") else i
    return j + 1 if absorbs_next_activation(graph, j, readers) else j


def passes_layout_on(node: Node) -> bool:
    """Node's host kernel gives a channels-last output for a channels-last input (the
    same tensor in its own layout): views (a crop's slice, identity, a zero-width pad),
    max pooling, and the k == s upsampling transposed conv of one group
    (primitives/cpu/graph_ops)."""
    p = node.params
    if node.op in ("slice", "identity", "maxpool"):
        return True
    if node.op == "pad":
        return not any(p["pads"])
    return (node.op == "conv_transpose" and int(p["group"]) == 1
            and tuple(p["weight"].shape[2:]) == tuple(p["strides"]) and not any(p["pads"])
            and not any(p["output_padding"]) and tuple(p["dilations"]) == (1, 1, 1))


def channels_last_convs(
    graph: Graph, readers: dict[str, int], primitive_of: Callable[[int], str | None]
) -> frozenset[int]:
    """Conv nodes on OpenVINO that may hand their output on channels-last, the layout its
    layers compute in (primitives/cpu/openvino_conv): every reader takes it as it lies, so
    the copy back to channels-first (and an OpenVINO reader's reorder) is skipped. A reader
    takes it when it is a conv on OpenVINO reading it whole, a concat whose parts such a
    conv reads (model.graph.concat_read_in_parts), or a node that passes the layout on
    (passes_layout_on) whose own output every reader takes so. `primitive_of`: node index
    -> its conv primitive."""
    nodes = graph.nodes
    takers: dict[str, list[int]] = {}  # tensor -> the nodes that read it
    for j, node in enumerate(nodes):
        for t in node.inputs:
            takers.setdefault(t, []).append(j)

    def on_openvino(j: int) -> bool:
        return primitive_of(j) == "openvino" and stride_one_conv(nodes[j])

    def reads_last(j: int, t: str) -> bool:
        node = nodes[j]
        if node.op == "concat":
            return (j + 1 < len(nodes) and on_openvino(j + 1)
                    and concat_read_in_parts(graph, j, readers, "openvino"))
        if node.inputs[0] != t:
            return False
        if on_openvino(j):
            return True
        return passes_layout_on(node) and takes_last(node.outputs[0])

    @cache  # a tensor passed on through several layout-passing readers is asked once
    def takes_last(t: str) -> bool:
        return t != graph.output and bool(takers.get(t)) and all(
            reads_last(j, t) for j in takers[t])

    return frozenset(i for i in range(len(nodes)) if on_openvino(i) and takes_last(
        nodes[openvino_output_node(graph, i, readers)].outputs[0]))


def openvino_chains(
    graph: Graph, readers: dict[str, int], primitive_of: Callable[[int], str | None]
) -> dict[int, tuple[int, ...]]:
    """First conv node -> the convs (two or more) that run one after another in one
    OpenVINO layer (primitives/cpu/openvino_conv): each on OpenVINO, each but the first
    reading whole the output (after its norm and activation) of the one before, its only
    reader. The tensors between them never leave the layer: no call, no copy out and back
    in, no buffer of ours. `primitive_of`: node index -> its conv primitive."""
    nodes = graph.nodes

    def on_openvino(j: int) -> bool:
        return primitive_of(j) == "openvino" and stride_one_conv(nodes[j])

    def next_link(i: int) -> int | None:
        end = openvino_output_node(graph, i, readers)
        out = nodes[end].outputs[0]
        j = end + 1
        if (out == graph.output or readers.get(out) != 1 or j >= len(nodes)
                or not on_openvino(j) or tuple(nodes[j].inputs) != (out,)):
            return None
        return j

    chains: dict[int, tuple[int, ...]] = {}
    inside: set[int] = set()
    for i in range(len(nodes)):
        if i in inside or not on_openvino(i):
            continue
        chain = [i]
        while (j := next_link(chain[-1])) is not None:
            chain.append(j)
        if len(chain) > 1:
            chains[i] = tuple(chain)
            inside.update(chain)
    return chains
