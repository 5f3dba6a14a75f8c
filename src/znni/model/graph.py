"""Networks as graphs: a DAG of layer nodes over named tensors (docs/design.md, "Planned").

A `Graph` is what the ONNX importer produces for one window shape: every node's
attributes and constant inputs (weights, pads, scales) are resolved to plain
values, so the executor needs nothing but the node list. Nodes are stored in a
topological order; `last_use` gives each tensor's lifetime, which both the
executor (to free it) and the memory model (to count it) follow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from znni.model.network import Network
from znni.primitives.base import Activation, Conv, Pool

# op kinds a node may have, and what each node's `params` holds (see `onnx_import`)
NODE_OPS = (
    "conv",  # weight, bias|None, strides, pads (6), dilations, group
    "conv_transpose",  # weight, bias|None, strides, pads, output_padding, dilations, group
    "maxpool",  # kernel, strides, pads, dilations, ceil_mode
    "avgpool",  # kernel, strides, pads, ceil_mode, count_include_pad
    "resize",  # size (3), mode, coordinate_transformation_mode, nearest_mode, scales|None
    "concat",  # (channels)
    "add",  # elementwise binary ops; a constant operand is in params["constant"]
    "sub",
    "mul",
    "div",
    "slice",  # starts (3), stops (3), steps (3) on the spatial axes
    "pad",  # pads (6), mode, value
    "instance_norm",  # scale, bias, epsilon
    "group_norm",  # groups, scale, bias, epsilon
    "batch_norm",  # scale, bias, mean, var, epsilon
    "relu",
    "leaky_relu",  # alpha
    "prelu",  # slope
    "elu",  # alpha
    "selu",  # alpha, gamma
    "sigmoid",
    "tanh",
    "softmax",  # over channels
    "clip",  # min|None, max|None
    "identity",
)


@dataclass(frozen=True, eq=False)
class Node:
    """One layer: `op` over input tensors, producing output tensors."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.op not in NODE_OPS:
            raise ValueError(f"node {self.name!r}: unknown op {self.op!r}")


@dataclass(frozen=True, eq=False)
class Graph:
    """A network DAG with one 5D input (N, C, Z, Y, X) and one output, for one window shape."""

    name: str
    input: str
    in_channels: int
    window: tuple[int, int, int]  # the spatial input shape the graph was resolved for
    nodes: tuple[Node, ...]  # topological order
    output: str
    out_channels: int
    out_window: tuple[int, int, int]  # spatial output shape for `window`
    digest: str  # of the model file(s); the ledger's fingerprint uses it
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # tensor -> shape

    def __post_init__(self) -> None:
        known = {self.input}
        for node in self.nodes:
            missing = [t for t in node.inputs if t not in known]
            if missing:
                raise ValueError(
                    f"node {node.name!r} reads {missing} before any node writes it "
                    "(the nodes are not in a topological order)"
                )
            known.update(node.outputs)
        if self.output not in known:
            raise ValueError(f"graph output {self.output!r} is not produced by any node")

    def last_use(self) -> dict[str, int]:
        """Tensor -> index of the last node that reads it (the output lives to the end)."""
        last: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            for t in node.inputs:
                last[t] = i
        last[self.output] = len(self.nodes)
        return last

    def peak_tensor_bytes(
        self, batch: int = 1, itemsize: int = 4, unbuilt: frozenset[str] = frozenset(),
        calls: Mapping[int, int] | None = None,
    ) -> int:
        """Most bytes of buffers alive at once as the host executor runs the nodes in order
        (engine.graph_forward; node workspaces not included): the largest of
        `live_tensor_bytes`, or the input's bytes where there are no nodes."""
        if not self.nodes:
            return batch * int(np.prod(self.shapes[self.input][1:])) * itemsize
        return max(self.live_tensor_bytes(batch, itemsize, unbuilt, calls))

    def live_tensor_bytes(
        self, batch: int = 1, itemsize: int = 4, unbuilt: frozenset[str] = frozenset(),
        calls: Mapping[int, int] | None = None,
    ) -> list[int]:
        """Per node, the bytes of buffers alive while it runs (its outputs allocated, before
        any frees), as the host executor holds them (engine.graph_forward): a buffer is freed
        after the last reader of every tensor it holds, but the input's lives through the
        pass (run_graph's `source` and the caller hold it); an activation fused into the
        node before it, an in-place op on a dying tensor, and views (slices, identities,
        zero pads) hold their input's buffer instead of a new one. `unbuilt`: concats the
        conv right after reads part by part (Winograd): no buffer; their inputs live on to
        that conv (ChannelParts holds them) and are freed after it. `calls`: first node ->
        last node of nodes run in one call (openvino_chains): the tensors between them get
        no buffer, and the first node's inputs live until the call ends."""
        if not self.shapes:
            raise ValueError(f"graph {self.name!r} carries no tensor shapes")
        last, readers = self.last_use(), reader_counts(self)
        for first, end in (calls or {}).items():
            last.update({t: max(last[t], end) for t in self.nodes[first].inputs})
            unbuilt = unbuilt | {self.nodes[j].outputs[0] for j in range(first, end)}
        for i, node in enumerate(self.nodes):
            if node.outputs[0] in unbuilt:
                last.update({t: max(last[t], i + 1) for t in node.inputs})
        dying: dict[int, set[str]] = {}  # node index -> tensors whose last reader it is
        for t, i in last.items():
            if t not in (self.output, self.input):
                dying.setdefault(i, set()).add(t)

        def size(t: str) -> int:
            return 0 if t in unbuilt else batch * int(np.prod(self.shapes[t][1:])) * itemsize

        owner = {self.input: self.input}  # tensor -> the buffer (first tensor) holding it
        holders = {self.input: {self.input}}  # buffer -> its live tensors
        live = size(self.input)
        per_node = []
        views: set[str] = set()  # tensors that are strided views: never overwritten in place
        for i, node in enumerate(self.nodes):
            shared = self._shared_buffer(i, node, last, readers, owner, holders, views)
            for j, t in enumerate(node.outputs):
                b = shared if j == 0 and shared is not None else t
                if b == t:
                    holders[t] = set()
                    live += size(t)
                owner[t] = b
                holders[b].add(t)
            if shared is not None and node.op == "slice":
                views.add(node.outputs[0])
            per_node.append(live)
            for t in dying.get(i, ()):
                held = holders[owner[t]]
                held.discard(t)
                if not held:
                    live -= size(owner[t])
        return per_node

    def _shared_buffer(self, i: int, node: Node, last: dict[str, int],
                       readers: dict[str, int], owner: dict[str, str],
                       holders: dict[str, set[str]], views: set[str]) -> str | None:
        """The buffer node i's output lives in when it is its input's (see peak_tensor_bytes)."""
        if not node.inputs or node.inputs[0] not in owner:
            return None
        src = node.inputs[0]
        b = owner[src]
        if node.op in VIEW_OPS or (node.op == "pad" and not any(node.params["pads"])):
            return b
        if i > 0 and absorbs_next_activation(self, i - 1, readers):
            return b  # written by the conv or norm before it, in its own output pass
        dies = last.get(src, -1) == i and holders[b] == {src} and b != self.input
        if node.op in IN_PLACE_OPS and dies and src not in views:
            return b
        return None


VIEW_OPS = ("slice", "identity")  # the executor returns a view of its input
# ops the host executor runs in place when their input dies at them (engine.graph_forward)
IN_PLACE_OPS = ("relu", "leaky_relu", "sigmoid", "tanh", "instance_norm", "group_norm")


FUSABLE_ACTIVATIONS = ("relu", "sigmoid", "tanh", "leaky_relu")
HOST_NORMS = ("instance_norm", "group_norm")  # apply a following activation in their pass


def stride_one_conv(node: Node) -> bool:
    """A conv the fast primitives run: stride 1, no dilation, one group."""
    if node.op != "conv":
        return False
    p = node.params
    return p["strides"] == (1, 1, 1) and p["dilations"] == (1, 1, 1) and p["group"] == 1


# conv primitives that read a concat's parts (primitives/cpu: Winograd F(4,3), F(6,3))
PARTS_READERS = ("winograd", "winograd6", "openvino")


def concat_read_in_parts(
    graph: Graph, i: int, readers: dict[str, int], next_primitive: str | None
) -> bool:
    """Node i is a concat whose one reader is the fast conv right after it, and that conv
    runs with `next_primitive` Winograd or OpenVINO, which read the concat's inputs part
    by part: the concat is never built (engine.graph_forward.ChannelParts)."""
    node = graph.nodes[i]
    if node.op != "concat" or next_primitive not in PARTS_READERS or i + 1 >= len(graph.nodes):
        return False
    out, conv = node.outputs[0], graph.nodes[i + 1]
    return readers.get(out) == 1 and stride_one_conv(conv) and conv.inputs[0] == out


def reader_counts(graph: Graph) -> dict[str, int]:
    """Tensor -> how many node inputs read it."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        for t in node.inputs:
            counts[t] = counts.get(t, 0) + 1
    return counts


def absorbs_next_activation(
    graph: Graph, i: int, readers: dict[str, int], on_host: bool = True
) -> bool:
    """Whether node i (a fast-path conv, or a normalisation on the host) applies the
    activation node right after it in its own output pass: that node alone reads it."""
    nodes = graph.nodes
    node = nodes[i]
    fuses = stride_one_conv(node) if node.op == "conv" else on_host and node.op in HOST_NORMS
    if not fuses or i + 1 >= len(nodes):
        return False
    nxt = nodes[i + 1]
    return (nxt.op in FUSABLE_ACTIVATIONS and nxt.inputs == node.outputs
            and readers[node.outputs[0]] == 1)


def digest_arrays(parts: list[bytes], arrays: list[np.ndarray]) -> str:
    """sha256 over byte strings and arrays (dtype, shape and data)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    for a in arrays:
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def graph_from_network(network: Network, window: tuple[int, int, int]) -> Graph:
    """A sequential spec as a chain graph: valid convs, strided max-pools, activations.

    This is the window (not the MPF) reading of the network: its output for a
    window of `window` voxels is one strided patch, as PyTorch's nn.Sequential gives.
    """
    nodes: list[Node] = []
    size = list(window)
    channels = network.in_channels
    prev = "input"
    for i, op in enumerate(network.ops):
        out = f"t{i}"
        if isinstance(op, Conv):
            params = {
                "weight": op.weight,
                "bias": op.bias,
                "strides": (1, 1, 1),
                "pads": (0,) * 6,
                "dilations": (1, 1, 1),
                "group": 1,
            }
            nodes.append(Node(f"{i}.conv", "conv", (prev,), (out,), params))
            size = [n - k + 1 for n, k in zip(size, op.kernel, strict=True)]
            channels = op.out_channels
        elif isinstance(op, Pool):
            params = {
                "kernel": op.window,
                "strides": op.window,
                "pads": (0,) * 6,
                "dilations": (1, 1, 1),
                "ceil_mode": False,
            }
            nodes.append(Node(f"{i}.maxpool", "maxpool", (prev,), (out,), params))
            size = [n // p for n, p in zip(size, op.window, strict=True)]
        else:
            nodes.append(_activation_node(i, op, prev, out))
        prev = out
    if min(size) < 1:
        raise ValueError(f"window {window} is smaller than network {network.name!r} needs")
    return Graph(
        name=network.name,
        input="input",
        in_channels=network.in_channels,
        window=window,
        nodes=tuple(nodes),
        output=prev,
        out_channels=channels,
        out_window=(size[0], size[1], size[2]),
        digest=network.digest,
    )


def _activation_node(i: int, act: Activation, prev: str, out: str) -> Node:
    if act.kind == "linear":
        return Node(f"{i}.identity", "identity", (prev,), (out,))
    if act.kind == "leaky_relu":
        return Node(f"{i}.leaky_relu", "leaky_relu", (prev,), (out,), {"alpha": act.slope})
    if act.kind == "elu":
        return Node(f"{i}.elu", "elu", (prev,), (out,), {"alpha": 1.0})
    return Node(f"{i}.{act.kind}", act.kind, (prev,), (out,))


WINDOW_DEPENDENT_OPS = ("instance_norm", "group_norm")  # statistics over the whole window


def window_dependence(graph: Graph) -> str | None:
    """Why the graph's output depends on where its window sits (the first such node), or
    None for a window-independent graph (valid convs and pools, crops, upsampling, merges)."""
    for node in graph.nodes:
        if node.op in WINDOW_DEPENDENT_OPS:
            return f"node {node.name!r} ({node.op}) normalises over the whole window"
        pads = node.params.get("pads")
        if pads is not None and any(p > 0 for p in pads):
            return f"node {node.name!r} ({node.op}) pads its input by {tuple(pads)}"
    return None


STRIDED_OPS = ("conv", "maxpool", "avgpool")


def downsampling(graph: Graph) -> tuple[int, int, int]:
    """The total downsampling factor per axis: the coarsest tensor's voxel size in input
    voxels (strides multiply it, transposed-conv strides and upsampling divide it)."""
    scale: dict[str, list[Fraction]] = {graph.input: [Fraction(1)] * 3}
    for node in graph.nodes:
        ins = [scale[t] for t in node.inputs if t in scale]
        here = [max(s[a] for s in ins) for a in range(3)] if ins else [Fraction(1)] * 3
        if node.op in STRIDED_OPS:
            here = [here[a] * node.params["strides"][a] for a in range(3)]
        elif node.op in ("conv_transpose", "resize"):
            n_in, n_out = graph.shapes[node.inputs[0]][2:], graph.shapes[node.outputs[0]][2:]
            here = [here[a] * Fraction(n_in[a], n_out[a]) for a in range(3)]
        for t in node.outputs:
            scale[t] = here
    worst = [max(s[a] for s in scale.values()) for a in range(3)]
    return (max(1, round(worst[0])), max(1, round(worst[1])), max(1, round(worst[2])))


def aligned_axes(graph: Graph) -> tuple[bool, bool, bool]:
    """Per axis: no strided op drops voxels (every window fits its input exactly) and
    every resize maps whole voxels, so the graph is translation-equivariant on its grid."""
    ok = [True, True, True]
    for node in graph.nodes:
        n_in = graph.shapes[node.inputs[0]][2:]
        p = node.params
        for a in range(3):
            if node.op in STRIDED_OPS:
                k = p["weight"].shape[2 + a] if node.op == "conv" else p["kernel"][a]
                d = p.get("dilations", (1, 1, 1))[a]
                span = n_in[a] + p["pads"][a] + p["pads"][a + 3] - d * (k - 1) - 1
                ok[a] = ok[a] and span % p["strides"][a] == 0
            elif node.op == "resize":
                n_out = graph.shapes[node.outputs[0]][2 + a]
                ok[a] = ok[a] and (n_out % n_in[a] == 0 or n_in[a] % n_out == 0)
    return (ok[0], ok[1], ok[2])
