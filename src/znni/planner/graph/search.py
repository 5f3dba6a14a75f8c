"""The planner for graph networks: per conv node a primitive, per window a time and a peak.

For each stride-1 conv the fastest CPU primitive (direct, FFT kept, FFT recomputed,
Winograd F(4,3) and F(6,3) for 3^3 kernels (winograd_costs.py), and OpenVINO's conv
where installed)
whose workspace fits beside the tensors alive in the window, costed with the same
calibrated model as sequential layers (costs.layer_seconds: ZNNi's FFT and direct
work counts over this machine's rates). Other nodes are costed by the element-wise
traffic they stream (as costs.other_work), plus the multiply-adds of the general and
transposed conv paths. Peak memory follows the executor's order and tensor lifetimes
(Graph.peak_tensor_bytes) plus the largest conv workspace (memory.conv_workspace_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import prod

from znni.model.graph import (
    Graph,
    Node,
    absorbs_next_activation,
    concat_read_in_parts,
    reader_counts,
    stride_one_conv,
)
from znni.model.network import FLOAT_BYTES
from znni.model.openvino_layers import (
    absorbs_next_norm,
)
from znni.planner.costs import (
    CPU_CONV_PRIMITIVES,
    FIRST_PASS_S_PER_PEAK_BYTE,
    Work,
    cpu_seconds,
    layer_seconds,
)
from znni.planner.graph.layers import conv_layer
from znni.planner.graph.op_costs import (
    phase_split_conv,
    scatter_transpose_bytes,
    scatter_transpose_work,
    strided_conv_bytes,
    strided_conv_work,
    upsample_transpose,
)
from znni.planner.graph.openvino_costs import (
    OPENVINO_IMPORT_S,
    OPENVINO_KEPT_PER_INPUT_BYTE,
    OPENVINO_KEPT_PER_NORMED_OUTPUT_BYTE,
    OPENVINO_RUNTIME_BYTES,
    chain_calls,
    chained,
    hand_on_channels_last,
    openvino_ready,
    openvino_seconds,
    paired,
)
from znni.planner.graph.winograd_costs import winograd_bytes, winograd_primitives, winograd_seconds
from znni.planner.machine import MachineProfile
from znni.planner.memory import conv_workspace_bytes, kernel_spectra_bytes

GEMM_OPS = ("conv", "conv_transpose")
# compiling a whole window's network on OpenVINO (network_costs.py, which cites it): 0.08-0.18 s
# for BasicUNet 64^3, begun while the first block is read
NETWORK_COMPILE_S = 0.15  # general convs run as GEMMs over kernel offsets
PASS_THROUGH = ("identity", "dropout", "slice")  # views (engine/graph_forward): no traffic
REFERENCE_WINDOW_VOXELS, LARGE_WINDOW_EXPONENT = 64**3, 0.06  # see large_window_factor
# op -> (passes over its inputs, over its outputs, split over the cores, seconds per call):
# how primitives/cpu/graph_ops moves memory (normalisations: statistics, then a fused
# scale/shift/activation in place). Unlisted ops: one read and one write, on one core.
# Fitted on BasicUNet and the valid U-Net windows (CI kind, 2026-11-23): concat, norms,
# maxpool within 30% per op type.
OP_TRAFFIC: dict[str, tuple[float, float, bool, float]] = {
    "concat": (1.0, 1.0, True, 0.0),
    "instance_norm": (3.0, 1.0, True, 3e-4),
    "group_norm": (3.0, 1.0, True, 3e-4),
    "maxpool": (3.0, 1.0, True, 0.0),
    "conv_transpose": (1.0, 1.0, True, 0.0),
}
# element-wise PRelu (max(x, slope x)) and Add streamed at ~3.5x the calibrated memory rate:
# 0.11 ms for 16 x 32^3 and 0.43 ms for 16 x 48^3 PRelu, 0.15 ms for a 16 x 32^3 Add (their
# 2-7 MB stay in cache; MONAI UNet 64^3/96^3 per-node timings, CI kind, 2026-11-23)
OP_TRAFFIC.update({"prelu": (0.3, 0.3, False, 0.0), "add": (0.3, 0.3, False, 0.0)})
NORM_OPS = ("instance_norm", "group_norm")
NODE_OVERHEAD_S = 5e-5  # Python dispatch and one allocation per node
# graph_ops' strided and transposed convs (GEMMs per kernel offset over strided views) ran at
# ~1/2.75 of the calibrated direct-conv GEMM rate (graph_gemm_flops_per_s since; MONAI
# UNet 64^3 per-op breakdown, this machine kind, 2026-11-23; see docs/benchmarks.md
# "Graph planner")
GENERAL_GEMM_SLOWDOWN = 2.75
@dataclass(frozen=True)
class NodePlan:
    """One node: its primitive (fast convs only), predicted seconds and workspace bytes."""

    name: str
    op: str
    primitive: str | None
    predicted_s: float
    workspace_bytes: int
    # GPU plans: every primitive that can run the conv, (name, predicted seconds, workspace
    # bytes), fastest first: why the chosen one was chosen
    candidates: tuple[tuple[str, float, int], ...] = ()


@dataclass(frozen=True)
class GraphPlan:
    """What one window (or exact tile) of a graph costs on a machine."""

    network: str
    window: tuple[int, int, int]
    nodes: tuple[NodePlan, ...]
    predicted_window_s: float
    peak_bytes: int  # live tensors at their peak, kept spectra and transforms, the largest
    # conv workspace
    spectra_bytes: int = 0  # kernel spectra the fft-keep convs keep (the backend's cache bound)
    openvino_bytes: int = 0  # of the peak, what OpenVINO's layers and runtime keep
    batch: int = 1  # windows per pass: node seconds and tensors are the batch's,
    # predicted_window_s one window's share
    device: str = "cpu"  # "gpu": planned by gpu_search.plan_graph_gpu, where peak_bytes is
    # the host's (the pinned window buffers) and device_peak_bytes the device's
    precision: str = "fp32"  # primitives/precision.PRECISIONS
    device_peak_bytes: int = 0  # GPU plans: predicted device peak (gpu_search.DevicePeak)
    compute_s: float = 0.0  # GPU plans: the batch's node seconds
    transfer_s: float = 0.0  # GPU plans: the batch's host<->device copies (overlapped)
    # "openvino-network": the whole window runs as one OpenVINO compiled network
    # (network_costs.py), else "" (our executor, node by node)
    compiled: str = ""
    alternative_s: float = 0.0  # compiled plans: the node-by-node plan's window seconds

    @property
    def primitives(self) -> dict[str, str]:
        """Node name -> chosen conv primitive, for the executor."""
        return {n.name: n.primitive for n in self.nodes if n.primitive is not None}


fast_conv = stride_one_conv  # a conv the fast primitives run (model.graph)


def other_seconds(graph: Graph, node: Node, machine: MachineProfile, batch: int = 1) -> float:
    """Memory traffic of the node's kernel (OP_TRAFFIC, over both cores where the kernel
    splits its tiles), plus GEMM flops of general convs, for `batch` windows; nodes that
    move nothing (zero pads, identities) cost their dispatch only, once per batch."""
    if node.op in PASS_THROUGH or (node.op == "pad" and not any(node.params["pads"])):
        return NODE_OVERHEAD_S
    reads, writes, parallel, call_s = OP_TRAFFIC.get(node.op, (1.0, 1.0, False, 0.0))
    read = sum(prod(graph.shapes[t][1:]) for t in node.inputs)
    written = sum(prod(graph.shapes[t][1:]) for t in node.outputs)
    moved_bytes = (reads * read + writes * written) * FLOAT_BYTES
    cores = machine.cores if parallel else 1
    if node.op in NORM_OPS:  # at their own calibrated rate (graph/calibrate.py)
        norm_s = moved_bytes / cores / machine.rate("norm_bytes_per_s")
        return batch * norm_s + call_s + NODE_OVERHEAD_S
    work = Work(memory_bytes=moved_bytes / cores, calls=0)
    if node.op == "conv" and phase_split_conv(node):
        work = work + strided_conv_work(graph, node)
    elif node.op == "conv_transpose" and not upsample_transpose(node):
        work = work + scatter_transpose_work(graph, node)
    elif node.op in GEMM_OPS:
        w = node.params["weight"]
        big = node.inputs[0] if node.op == "conv_transpose" else node.outputs[0]
        flops = 2.0 * prod(graph.shapes[big][2:]) * w.size * GENERAL_GEMM_SLOWDOWN
        work = work + Work(direct_flops=flops)
    # the general convs' work counts their GEMM flops as direct_flops, at graph_ops' rate
    seconds = cpu_seconds(_batched(work, batch), machine, gemm_rate="graph_gemm_flops_per_s")
    return seconds + call_s + NODE_OVERHEAD_S


def _batched(work: Work, batch: int) -> Work:
    """`work` of one window done for `batch` windows in one call."""
    return Work(*(getattr(work, f.name) * (1 if f.name == "calls" else batch)
                  for f in fields(Work)))


def _conv_options(
    graph: Graph, machine: MachineProfile, tensors: int, limit: int, *,
    passes: int | None = None, batch: int = 1,
) -> dict[int, list[tuple[float, int, int, str]]]:
    """Per fast conv node index: (seconds, workspace, kept bytes, primitive) of each
    primitive whose workspace fits beside the window's tensors, fastest first."""
    out = {}
    readers = reader_counts(graph)
    for i, node in enumerate(graph.nodes):
        if not fast_conv(node):
            continue
        layer = conv_layer(graph, i, node, batch)
        options = []
        for prim in CPU_CONV_PRIMITIVES:
            work = conv_workspace_bytes(layer, prim, machine.cores)
            spectra = kernel_spectra_bytes(layer) if prim == "fft-keep" else 0
            if tensors + spectra + work <= limit:
                options.append((layer_seconds(layer, prim, machine), work, spectra, prim))
        for prim in winograd_primitives(layer, node.params["weight"]):
            work, kept = winograd_bytes(layer, machine.cores, prim)
            if tensors + kept + work <= limit:
                options.append((winograd_seconds(layer, machine, prim), work, kept, prim))
        if openvino_ready():
            norm = absorbs_next_norm(graph, i, readers, "openvino")
            work = layer.out_bytes  # the batch's channels-last output beside our copy of it
            kept = int((OPENVINO_KEPT_PER_INPUT_BYTE * layer.in_bytes  # one window's (above)
                        + OPENVINO_KEPT_PER_NORMED_OUTPUT_BYTE * layer.out_bytes * norm) / batch)
            if tensors + kept + work <= limit:
                seconds = openvino_seconds(layer, machine, passes, norm)
                if norm:  # net of the norm node it makes free (see plan_graph)
                    seconds -= other_seconds(graph, graph.nodes[i + 1], machine, batch)
                options.append((seconds, work, kept, "openvino"))
        if not options:
            raise ValueError(f"no conv primitive for node {node.name!r} fits in {limit:,} bytes "
                             f"beside the window's {tensors:,} bytes of tensors")
        out[i] = sorted(options)
    return out




def first_pass_seconds(plan: GraphPlan) -> float:
    """What a run's first pass costs beyond the steady-state prediction (once per run):
    the pages of its peak but OpenVINO's (each layer's first call pays for its own,
    openvino_costs.openvino_terms), and the import of openvino where a conv runs on it."""
    if plan.compiled:  # openvino's import and the network's compile (network_costs.py)
        return OPENVINO_IMPORT_S + NETWORK_COMPILE_S
    uses_openvino = any(n.primitive == "openvino" for n in plan.nodes)
    own_bytes = plan.peak_bytes - plan.openvino_bytes
    return FIRST_PASS_S_PER_PEAK_BYTE * own_bytes + OPENVINO_IMPORT_S * uses_openvino


def large_window_factor(graph: Graph) -> float:
    """Per-voxel slowdown of windows larger than the 64^3 the rates were fitted on: inside
    a window the convs ran 1.2-1.3x slower than alone at BasicUNet 96^3 (its norms and
    pools evict what the next conv reads), the valid U-Net's not at all at 92^3-132^3.
    Measured/node-sum on this machine kind (2026-11-23, with the heap kept: fresh pages
    no longer cost, which the exponent 0.22 fitted before had to stand for): 1.05 at 64^3,
    1.06 and 1.24 at 92^3-96^3, 0.93 at 132^3: (voxels / 64^3) ** 0.06."""
    voxels = prod(graph.window)
    return max(1.0, voxels / REFERENCE_WINDOW_VOXELS) ** LARGE_WINDOW_EXPONENT


def _peak(tensors: int, picks: dict[int, tuple[float, int, int, str]], other: int = 0) -> int:
    """Kept spectra and kernel transforms stay across windows, so every conv's workspace
    (`other`: the largest of the graph_ops convs') meets all of them. The largest workspace
    adds to the tensors' peak even where the two fall on different nodes: glibc keeps freed
    workspace pages in its arenas. The six benchmarks/graph_planner.py windows (CI kind,
    2026-11-23, ZNNI_KEEP_HEAP=0): a first pass's resident peak ran from 7 MiB below numpy's
    own peak (tracemalloc; free heap the process held before the pass, reused unseen) to
    31 MiB above it (freed pages kept), and 0.81-1.10 of this sum."""
    kept = sum(p[2] for p in picks.values())
    if any(p[3] == "openvino" for p in picks.values()):
        kept += OPENVINO_RUNTIME_BYTES
    return tensors + kept + max([other, *(p[1] for p in picks.values())])


def unbuilt_concats(graph: Graph, picks: dict[int, tuple[float, int, int, str]]) -> frozenset[str]:
    """Concats the executor never builds (model.graph.concat_read_in_parts)."""
    readers = reader_counts(graph)
    return frozenset(
        node.outputs[0] for i, node in enumerate(graph.nodes)
        if concat_read_in_parts(graph, i, readers, picks[i + 1][3] if i + 1 in picks else None)
    )


def general_workspace_bytes(graph: Graph, node: Node, cores: int) -> int:
    """Temporaries of a node graph_ops runs beyond its output (the strided conv's phases,
    flat grid and columns; the scatter transposed conv's uncropped output and slab
    products; 0 for the others)."""
    if node.op == "conv" and not fast_conv(node) and phase_split_conv(node):
        return strided_conv_bytes(graph, node, cores)
    if node.op == "conv_transpose" and not upsample_transpose(node):
        return scatter_transpose_bytes(graph, node, cores)
    return 0


def plan_graph(
    graph: Graph,
    machine: MachineProfile,
    memory_limit_bytes: int | None = None,
    *,
    passes: int | None = None,
    batch: int = 1,
) -> GraphPlan:
    """Each fast conv's fastest primitive; while the steady-state peak (tensors, all kept
    spectra and transforms, the largest workspace) is over the limit, the kept bytes that
    cost least time per byte to give up are dropped. ValueError where nothing fits.
    `passes`: the windows of the run, which share one-off costs (None: steady state);
    `batch`: windows run together, which share each node's per-call cost."""
    tensors = graph.peak_tensor_bytes(batch)
    limit = memory_limit_bytes if memory_limit_bytes is not None else machine.memory_bytes
    options = _conv_options(graph, machine, tensors, limit, passes=passes, batch=batch)
    picks = paired({i: opts[0] for i, opts in options.items()}, options, graph, machine,
                   batch=batch, passes=passes)
    spaces = [batch * general_workspace_bytes(graph, n, machine.cores) for n in graph.nodes]
    _give_up_kept_bytes(graph, picks, options, tensors=tensors, space=max(spaces), limit=limit)
    readers, fused, free = reader_counts(graph), set(), {}
    for i in range(len(graph.nodes)):
        if absorbs_next_activation(graph, i, readers):
            fused.add(i + 1)  # applied in the conv's or the norm's output pass
        if i in picks and absorbs_next_norm(graph, i, readers, picks[i][3]):
            free[i + 1] = other_seconds(graph, graph.nodes[i + 1], machine, batch)
    picks, saved = hand_on_channels_last(graph, picks, readers, machine, batch=batch)
    picks, chain_saved = chained(graph, picks, readers, machine, batch=batch, passes=passes)
    saved = {i: saved.get(i, 0.0) + chain_saved.get(i, 0.0) for i in {*saved, *chain_saved}}
    seconds = [  # a conv that applies the norm after it also takes the norm's time
        picks[i][0] + free.get(i + 1, 0.0) - saved.get(i, 0.0) if i in picks
        else 0.0 if i in free  # applied in the conv's call: never dispatched
        else NODE_OVERHEAD_S if i in fused
        else other_seconds(graph, node, machine, batch)
        for i, node in enumerate(graph.nodes)
    ]
    plans = [
        NodePlan(node.name, node.op, picks[i][3] if i in picks else None, seconds[i],
                 picks[i][1] if i in picks else spaces[i])
        for i, node in enumerate(graph.nodes)
    ]
    return GraphPlan(
        network=graph.name, window=graph.window, nodes=tuple(plans),
        predicted_window_s=sum(n.predicted_s for n in plans) * large_window_factor(graph)
        / batch,
        peak_bytes=_peak(graph.peak_tensor_bytes(batch, unbuilt=unbuilt_concats(graph, picks),
                                                 calls=chain_calls(graph, picks)),
                         picks, max(spaces)),
        spectra_bytes=sum(p[2] for p in picks.values() if p[3] == "fft-keep"), batch=batch,
        openvino_bytes=_peak(0, {i: (0.0, 0, p[2], p[3]) for i, p in picks.items()
                                 if p[3] == "openvino"}),
    )


def _give_up_kept_bytes(graph: Graph, picks: dict[int, tuple[float, int, int, str]],
                        options: dict[int, list[tuple[float, int, int, str]]], *, tensors: int,
                        space: int, limit: int) -> None:
    """While the peak is over `limit`, the conv whose kept bytes cost least time per byte
    to give up moves to its best option that keeps none (in `picks`); ValueError where
    none is left to give up."""
    while _peak(tensors, picks, space) > limit:
        keeping = [i for i, p in picks.items()
                   if p[2] and any(not o[2] for o in options[i])]
        if not keeping:
            need = _peak(tensors, picks, space)
            raise ValueError(f"graph {graph.name!r} needs {need:,} bytes per window, more than "
                             f"{limit:,}")

        def loss(i: int) -> float:
            alt = next(o for o in options[i] if not o[2])
            return (alt[0] - picks[i][0]) / picks[i][2]

        i = min(keeping, key=loss)
        picks[i] = next(o for o in options[i] if not o[2])
