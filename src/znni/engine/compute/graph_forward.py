"""Running a `Graph` on a batch of windows, freeing each tensor after its last reader.

Convolutions with stride 1, no dilation and one group (nearly all of a U-Net's
work) run on the backend's fast primitives (direct, FFT kept, FFT recomputed,
chosen per layer by the backend) after explicit zero padding, except Winograd and
OpenVINO, which read their zero pads and a concat's parts (ChannelParts) where they lie;
an OpenVINO conv also applies the instance norm after it (model.openvino_layers.absorbs_next_norm),
and hands its output on channels-last where only OpenVINO convs read it
(model.openvino_layers.channels_last_convs). Other convs and the
graph-only kernels (transposed conv, interpolation, normalisations, pad) run on
`primitives.cpu.graph_ops` through the kernel table (engine.graph_kernels). A GPU
backend runs the whole graph on the device instead (graph_device.run_graph_device). A
following ReLU-family activation is fused into the conv's call where the backend
supports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np

from znni.engine.compute.graph_kernels import INPLACE, KERNELS
from znni.model.graph import (
    HOST_NORMS,
    PARTS_READERS,
    Graph,
    Node,
    absorbs_next_activation,
    concat_read_in_parts,
    reader_counts,
    stride_one_conv,
)
from znni.model.openvino_layers import (
    absorbs_next_norm,
    channels_last_convs,
    openvino_chains,
    openvino_output_node,
)
from znni.primitives.base import Activation, Backend, ConvStep, InstanceNorm


class ChainBackend(Protocol):
    """A backend that runs a chain of convs in one call (CpuBackend, through OpenVINO)."""

    def conv3d_chain(self, parts: Sequence[np.ndarray], steps: Sequence[ConvStep],
                     channels_last: bool = False) -> np.ndarray: ...


def run_graph(
    graph: Graph,
    x: np.ndarray,
    backend: Backend,
    primitives: Mapping[str, str] | None = None,
) -> np.ndarray:
    """(N, C, *graph.window) -> (N, graph.out_channels, *graph.out_window), float32.

    `primitives`: conv node name -> CPU primitive the planner chose (planner.graph.search);
    used on the CPU backend, where a conv without one is left to the backend's choice."""
    device = getattr(backend, "device", None)
    if device is not None:  # a GPU: every node on the device
        from znni.engine.compute.graph_device import run_graph_on_device

        return run_graph_on_device(graph, x, device, primitives)
    chosen = primitives if primitives is not None and backend.name == "cpu" else {}
    if x.ndim != 5 or x.shape[1] != graph.in_channels or tuple(x.shape[2:]) != graph.window:
        raise ValueError(
            f"graph {graph.name!r} runs on (N, {graph.in_channels}, {graph.window}) windows, "
            f"got an array of shape {x.shape}"
        )
    run = _GraphPass(graph, backend, chosen, np.asarray(x, np.float32))
    i = 0
    while i < len(graph.nodes):
        i = run.chain(i) if i in run.chains else run.node(i)
    return run.env[graph.output]


class _GraphPass:
    """One pass of `graph` over a batch: the live tensors (`env`) and what the planned
    primitives decide once for the whole graph (chains, channels-last hand-ons)."""

    def __init__(self, graph: Graph, backend: Backend, chosen: Mapping[str, str],
                 source: np.ndarray) -> None:
        self.graph, self.backend, self.chosen, self.source = graph, backend, chosen, source
        self.last = graph.last_use()
        self.readers = reader_counts(graph)
        self.padded: set[str] = set()  # tensors that already carry their reading conv's pads
        self.env: dict[str, Any] = {graph.input: source}
        self.on_host = True  # (run_graph hands a device backend's graphs to the device)
        self.reads_parts = self.on_host and hasattr(backend, "conv3d_parts")
        nodes = graph.nodes

        def pick(j: int) -> str | None:
            return chosen.get(nodes[j].name)

        # OpenVINO convs whose readers all are too; OpenVINO convs run in one layer
        self.last_layout = (channels_last_convs(graph, self.readers, pick)
                            if self.reads_parts else frozenset())
        self.chainer = (cast(ChainBackend, backend)  # hasattr: it has ChainBackend's method
                        if hasattr(backend, "conv3d_chain") else None)
        self.chains = (openvino_chains(graph, self.readers, pick)
                       if self.reads_parts and self.chainer is not None else {})

    def chain(self, i: int) -> int:
        """The chain of convs from node i in one call (the tensors between are not ours);
        the index after the last node it covers."""
        graph, node, chain = self.graph, self.graph.nodes[i], self.chains[i]
        end = openvino_output_node(graph, chain[-1], self.readers)
        steps = _chain_steps(graph, chain, self.readers, node.inputs[0] in self.padded)
        x = self.env[node.inputs[0]]
        assert self.chainer is not None  # self.chains is empty without one
        y = self.chainer.conv3d_chain(list(x) if isinstance(x, ChannelParts) else [x], steps,
                                      chain[-1] in self.last_layout)
        call = Node(node.name, node.op, node.inputs, graph.nodes[end].outputs, node.params)
        _store(self.env, y, call, end, self.last, graph)
        return end + 1

    def node(self, i: int) -> int:
        """Node i, with the norm and activation after it that its call absorbs; the index
        after the last node it covers."""
        graph, node, chosen = self.graph, self.graph.nodes[i], self.chosen
        norm = (_fused_norm(graph, i, self.readers, chosen.get(node.name))
                if self.reads_parts else None)
        absorbed = 0 if norm is None else 1  # nodes after node i it applies in its call
        fused = _fusable_activation(graph, i + absorbed, self.readers, self.on_host)
        if fused is not None and node.op in HOST_NORMS:  # the host norms take it as a parameter
            node = Node(
                node.name, node.op, node.inputs, node.outputs, {**node.params, "activation": fused}
            )
        absorbed += fused is not None
        y = self._compute(i, node, fused, norm)
        if absorbed:  # the last absorbed node's output is the conv's
            i += absorbed
            node = Node(node.name, node.op, node.inputs, graph.nodes[i].outputs, node.params)
        _store(self.env, y, node, i, self.last, graph)
        return i + 1

    def _compute(self, i: int, node: Node, fused: Activation | None,
                 norm: InstanceNorm | None) -> Any:
        graph, args = self.graph, [self.env[t] for t in node.inputs]
        pads = _pads_for_next_conv(graph, i, self.readers) if self.on_host else None
        if node.op == "concat" and self.reads_parts and \
                _read_in_place(graph, i, self.readers, self.chosen):
            return ChannelParts(args)  # the Winograd conv after it reads the parts themselves
        if pads is not None:  # the conv after it reads a zero border: write one at once
            from znni.primitives.cpu import graph_ops

            self.padded.add(node.outputs[0])
            return graph_ops.concat_channels(args, pads)
        if self.on_host and node.op in INPLACE and _dies_here(
            node.inputs[0], i, self.last, self.env, graph, self.source
        ):
            return INPLACE[node.op](node.params, args[0])
        prepadded = bool(node.inputs) and node.inputs[0] in self.padded
        return run_node(node, args, self.backend, fused, self.chosen.get(node.name), prepadded,
                        norm, i in self.last_layout)


def _store(env: dict[str, Any], y: Any, node: Node, i: int, last: dict[str, int],
           graph: Graph) -> None:
    """Node i's output `y` under its name (`node`: the node or the call that ended at i,
    with its first node's inputs); the inputs read for the last time are dropped."""
    env[node.outputs[0]] = y
    for t in set(graph.nodes[i].inputs) | set(node.inputs):
        if last.get(t, -1) <= i and t != graph.output:
            env.pop(t, None)


def _chain_steps(graph: Graph, chain: tuple[int, ...], readers: dict[str, int],
                 prepadded: bool) -> list[ConvStep]:
    """Each chained conv's pads, weights, norm and activation (model.openvino_layers.
    openvino_chains); the first conv's pads are zero where its input already carries them."""
    steps = []
    for k, c in enumerate(chain):
        p = graph.nodes[c].params
        norm = _fused_norm(graph, c, readers, "openvino")
        act = _fusable_activation(graph, c + (norm is not None), readers)
        bias = p["bias"] if p["bias"] is not None else np.zeros(p["weight"].shape[0], np.float32)
        pads = (0,) * 6 if k == 0 and prepadded else tuple(p["pads"])
        steps.append(ConvStep(pads, p["weight"], bias, act, norm))
    return steps


class ChannelParts(tuple[np.ndarray, ...]):
    """A concat's inputs, never joined: the Winograd conv right after it, its one reader,
    reads them in place with its zero pads (CpuBackend.conv3d_parts)."""


def _read_in_place(
    graph: Graph, i: int, readers: dict[str, int], chosen: Mapping[str, str]
) -> bool:
    """Node i is a concat the Winograd conv after it reads part by part (model.graph)."""
    nxt = graph.nodes[i + 1].name if i + 1 < len(graph.nodes) else ""
    return concat_read_in_parts(graph, i, readers, chosen.get(nxt))


def make_graph_backend(name: str, spectra_bytes: int = 0, device_bytes: int = 0) -> Backend:
    """A backend by name; the CPU one with a spectra cache sized for the planned fft-keep
    convs, a GPU one with its device memory cap (`device_bytes`; 0: the device's own)."""
    from znni.primitives.backends import make_backend

    if name == "cpu":
        return make_backend("cpu", spectra_cache_bytes=max(1, spectra_bytes))
    if name in ("gpu", "gpu-standin") and device_bytes > 0:
        return make_backend(name, memory_cap_bytes=int(device_bytes))
    return make_backend(name)


def _dies_here(
    t: str, i: int, last: dict[str, int], env: dict[str, np.ndarray], graph: Graph,
    source: np.ndarray,
) -> bool:
    """True when node i is the last reader of tensor t, no other live tensor shares its
    memory (identities, slices and crops are views), and t is not the caller's input: t may
    be overwritten."""
    if t == graph.input or last.get(t, -1) != i:
        return False
    arr = env[t]
    return (
        not np.may_share_memory(arr, source)
        and arr.flags.writeable
        and arr.flags.c_contiguous
        and arr.dtype == np.float32
        and not any(name != t and np.may_share_memory(v, arr)
                    for name, u in env.items() for v in _arrays(u))
    )


def _arrays(value: Any) -> tuple[np.ndarray, ...]:
    """The arrays a tensor of `run_graph`'s environment holds: itself, or a concat's parts."""
    return tuple(value) if isinstance(value, ChannelParts) else (value,)


def _pads_for_next_conv(graph: Graph, i: int, readers: dict[str, int]) -> tuple[int, ...] | None:
    """The zero pads of the fast conv right after concat node i, when that conv alone
    reads the concat (a U-Net's decoder: skip and upsampled, then a padded 3^3 conv)."""
    node = graph.nodes[i]
    if node.op != "concat" or i + 1 >= len(graph.nodes) or readers[node.outputs[0]] != 1:
        return None
    conv = graph.nodes[i + 1]
    if not stride_one_conv(conv) or conv.inputs[0] != node.outputs[0]:
        return None
    pads = tuple(conv.params["pads"])
    return pads if any(pads) else None


def _fusable_activation(
    graph: Graph, i: int, readers: dict[str, int], on_host: bool = True
) -> Activation | None:
    """The activation node i + 1 when node i applies it in its own pass (model.graph)."""
    if not absorbs_next_activation(graph, i, readers, on_host):
        return None
    nxt = graph.nodes[i + 1]
    return Activation(nxt.op, float(nxt.params.get("alpha", 0.01)))


def _fused_norm(
    graph: Graph, i: int, readers: dict[str, int], primitive: str | None
) -> InstanceNorm | None:
    """The instance norm node i + 1 when conv node i applies it in its call (model.graph)."""
    if not absorbs_next_norm(graph, i, readers, primitive):
        return None
    p = graph.nodes[i + 1].params
    return InstanceNorm(p["scale"], p["bias"], float(p["epsilon"]))


def run_node(
    node: Node,
    args: list[np.ndarray],
    backend: Backend,
    fused: Activation | None = None,
    primitive: str | None = None,
    prepadded: bool = False,
    norm: InstanceNorm | None = None,
    channels_last: bool = False,
) -> np.ndarray:
    """One node on its input arrays: fast convs on `backend.conv3d` (`prepadded`: the
    input already has the conv's zero pads; `norm`: the instance norm it applies before
    `fused`, and `channels_last`: its output may stay channels-last, OpenVINO only), the
    rest on the host kernels."""
    if node.op == "conv":
        return _conv(node, args[0], backend, fused, primitive, prepadded, norm, channels_last)
    run = KERNELS.get(node.op)
    if run is None:
        raise ValueError(f"node {node.name!r}: no kernel for op {node.op!r}")
    return _checked(node, lambda: run(node.params, *args))


def _checked(node: Node, call: Callable[[], np.ndarray]) -> np.ndarray:
    """call(), with a ValueError prefixed by the node's name and op."""
    try:
        return call()
    except ValueError as e:
        raise ValueError(f"node {node.name!r} ({node.op}): {e}") from e


def _conv(
    node: Node,
    x: np.ndarray,
    backend: Backend,
    fused: Activation | None,
    primitive: str | None,
    prepadded: bool = False,
    norm: InstanceNorm | None = None,
    channels_last: bool = False,
) -> np.ndarray:
    from znni.primitives.cpu import graph_ops

    p = node.params
    if not stride_one_conv(node):
        return graph_ops.conv3d(
            x,
            p["weight"],
            p["bias"],
            strides=p["strides"],
            pads=p["pads"],
            dilations=p["dilations"],
            groups=p["group"],
        )
    pads = p["pads"]
    bias = p["bias"] if p["bias"] is not None else np.zeros(p["weight"].shape[0], np.float32)
    conv_parts = getattr(backend, "conv3d_parts", None)
    if conv_parts is not None and (primitive in PARTS_READERS or isinstance(x, ChannelParts)):
        parts = list(x) if isinstance(x, ChannelParts) else [x]
        return conv_parts(parts, (0,) * 6 if prepadded else pads, p["weight"], bias, fused,
                          primitive, norm, channels_last)
    if any(pads) and not prepadded:
        x = graph_ops.pad_constant(x, pads)
    return backend.conv3d(np.ascontiguousarray(x), p["weight"], bias, fused, primitive)
