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
from math import prod, sqrt

from znni.model.graph import (
    Graph,
    Node,
    absorbs_next_activation,
    concat_read_in_parts,
    reader_counts,
    stride_one_conv,
)
from znni.model.network import FLOAT_BYTES, LayerShape
from znni.model.openvino_layers import (
    absorbs_next_norm,
    channels_last_convs,
    openvino_chains,
    openvino_output_node,
)
from znni.planner.costs import CPU_CONV_PRIMITIVES, Work, cpu_seconds, layer_seconds
from znni.planner.graph_op_costs import (
    phase_split_conv,
    scatter_transpose_bytes,
    scatter_transpose_work,
    strided_conv_bytes,
    strided_conv_work,
    upsample_transpose,
)
from znni.planner.machine import MachineProfile
from znni.planner.memory import conv_workspace_bytes, kernel_spectra_bytes
from znni.planner.winograd_costs import winograd_bytes, winograd_primitives, winograd_seconds

GEMM_OPS = ("conv", "conv_transpose")  # general convs run as GEMMs over kernel offsets
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
# openvino_seconds' terms. Each layer is compiled for one window and writes channels-last
# (primitives/cpu/openvino_conv): 16 -> 16 at 64^3 with its norm spent 2.5 ms reordering
# its input into the plugin's layout, 2.5-3.0 ms in MVN and 2.3 ms in our transpose of
# its output (8.3 ms in MVN at 96^3; Intel host of the CI kind, 2026-11-24): 0.8 passes
# over input and output at the calibrated memory rate, the norm 1.3 over its output.
# A call costs 0.5 ms besides (binding the shared input and output, waking its threads).
# Whole BasicUNet segments (64^3 windows, overlap 0.25, 8 GiB) with the planner charging
# 2.3 ms a call, as it did for the dynamic-batch layers before (their 256^3 segments had
# run 1.8 ms a call slower than their windows alone), put 8 of the 19 convs on OpenVINO
# and took 24.4-26.2 s at 256^3 and 7.1-7.5 s at 128^3; charging 0.5 ms it put 17 there,
# 22.0-23.6 s and 6.0-7.1 s (alternated, same host and day). The calibration fits the rate
# with these terms fixed (calibrate_graph.py)
OPENVINO_COPY_PASSES = 0.8
OPENVINO_NORM_PASSES = 1.3
OPENVINO_CALL_S = 0.5e-3
# its JIT kernels work on blocks of 16 channels (AVX-512 here); fewer input channels leave
# lanes idle: 18-31 GFLOP/s at Cin 1, 59 at 4, 100-113 at 12, 117-162 at 16-48 measured
# (3^3 convs, 64^3-166^3 outputs, CI kind, 2026-11-23): rate x sqrt(min(1, Cin / 16))
OPENVINO_CHANNEL_BLOCK = 16
# the first call of a compiled layer (compile, JIT, first-touch of its buffers) took 25-34 ms
# more than later ones at 4^3-16^3, growing with its tensors: a fixed part plus a part per
# tensor byte, shared by the windows of a run. Per byte of the convs' inputs and outputs,
# beyond the compile, in a whole BasicUNet pass with its convs chained (fresh processes,
# Intel host of the CI kind, 2026-11-24): 0-0.7 ns at 64^3, 0.2-1.3 ns at 128^3 (the
# process's first layer the most; 0.56 over all its layers). 2.2 ns had been fitted on the
# earlier dynamic-batch layers, and with it the planner left the middle layers of
# 27-window runs off OpenVINO (5.24-5.89 s for a 128^3 segment in 64^3 windows against
# 4.44-4.94 s with all on it, alternated). At 0.5 ns it put the first convs of one 128^3
# window on OpenVINO: 4.24 s against 3.35 s for none there (one run each); 1.0 keeps both.
# a compiled layer keeps its own buffers between calls: its blocked copy of the input and,
# with the norm after it, the conv's output before the norm (without one the conv writes
# our channels-last buffer itself). Compiled for one window and writing channels-last
# (openvino_conv), the first pass's resident peak less the rest of the model was, on the
# six benchmarks/graph_planner.py windows (3-14 OpenVINO layers each; Intel host of the CI
# kind, 2026-11-24), 60 MiB of runtime (plugin, thread pool, JIT code) + 1.2-1.5x the
# layers' one-window input bytes + 1.1-1.3x the output bytes of those with a norm + the
# largest workspace (the batch's channels-last output, beside the copy we make of it).
# Earlier, compiled for any batch and writing channels-first, 1.4-2.7x input + output had
# been kept; not calibrated per machine: the amount does not add up over layers alone
OPENVINO_KEPT_PER_INPUT_BYTE = 1.4
# ... 0.8x where the input comes channels-last from another OpenVINO layer (no reorder runs;
# the same six windows with that hand-on: resident peaks fell 0-35 MiB at 64^3-96^3 and
# 112 MiB at 132^3; 0.42-0.87x their input bytes less kept, fitted 0.6 less)
OPENVINO_KEPT_PER_CHANNELS_LAST_INPUT_BYTE = 0.8
OPENVINO_KEPT_PER_NORMED_OUTPUT_BYTE = 1.15
OPENVINO_RUNTIME_BYTES = 60 * 2**20
OPENVINO_FIRST_CALL_S = 0.03
# and once per run, the import of openvino itself: 0.20-0.27 s (fresh processes, 2026-11-24)
OPENVINO_IMPORT_S = 0.25
OPENVINO_FIRST_CALL_S_PER_BYTE = 1.0e-9
# convs chained in one layer (model.openvino_layers.openvino_chains) save, per link, a call and the
# first call's fixed part (one compile: a 1 -> 16 -> 16 pair at 64^3 compiled in 37 ms
# against 61-67 for its two layers), and over the tensor between them what the layer
# does to hand it out and take it back in: the pair ran 27.5-28 ms against 32-33 ms handed
# on channels-last at 64^3, 227 against 262 ms at 128^3 (0.27-0.3 ns per byte of it: 2.9
# passes at the calibrated memory rate; Intel host of the CI kind, 2026-11-24)
OPENVINO_CHAIN_PASSES = 2.9
# The tensor between chained convs is no buffer of ours (Graph.live_tensor_bytes' calls)
# but the layer's own: resident peaks of the six benchmarks/graph_planner.py windows less
# the model's without this term, over the tensors between: +0.9 and +1.5x them where no
# norm follows the conv (valid U-Net 92^3, 132^3), -0.96 and +0.3x where one does (it
# already kept the conv's output before the norm; BasicUNet 64^3, 96^3; Intel host of the
# CI kind, 2026-11-24). Fitted: 1.0 and -0.4
OPENVINO_KEPT_PER_CHAINED_BYTE = 1.0
OPENVINO_KEPT_PER_CHAINED_NORMED_BYTE = -0.4


@dataclass(frozen=True)
class NodePlan:
    """One node: its primitive (fast convs only), predicted seconds and workspace bytes."""

    name: str
    op: str
    primitive: str | None
    predicted_s: float
    workspace_bytes: int


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
    batch: int = 1  # windows per pass: node seconds and tensors are the batch's,
    # predicted_window_s one window's share

    @property
    def primitives(self) -> dict[str, str]:
        """Node name -> chosen conv primitive, for the executor."""
        return {n.name: n.primitive for n in self.nodes if n.primitive is not None}


fast_conv = stride_one_conv  # a conv the fast primitives run (model.graph)


def conv_layer(graph: Graph, i: int, node: Node, batch: int = 1) -> LayerShape:
    """The conv node as a sequential layer shape: padded input -> output, `batch` windows."""
    _, cin, *size = graph.shapes[node.inputs[0]]
    pads = node.params["pads"]
    padded = (size[0] + pads[0] + pads[3], size[1] + pads[1] + pads[4], size[2] + pads[2] + pads[5])
    _, cout, *out = graph.shapes[node.outputs[0]]
    w = node.params["weight"].shape
    return LayerShape(i, "conv", batch, cin, padded, batch, cout, (out[0], out[1], out[2]),
                      (int(w[2]), int(w[3]), int(w[4])))


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
    if node.op in NORM_OPS:  # at their own calibrated rate (calibrate_graph.py)
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
    graph: Graph, machine: MachineProfile, tensors: int, limit: int, passes: int | None = None,
    batch: int = 1,
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


def openvino_ready() -> bool:
    """The optional OpenVINO conv primitive can run in this environment."""
    from znni.primitives.cpu.openvino_conv import openvino_available

    return openvino_available()


def openvino_terms(
    layer: LayerShape, machine: MachineProfile, passes: int | None = None, norm: bool = False
) -> tuple[float, float]:
    """(multiply-add seconds, the rest) of `openvino_seconds`: the calibration
    (calibrate_graph.py) fits the rate by the first."""
    rate = machine.rate("openvino_flops_per_s")
    rate *= sqrt(min(1.0, layer.channels_in / OPENVINO_CHANNEL_BLOCK))
    copies_bytes = (OPENVINO_COPY_PASSES * 2 * (layer.in_bytes + layer.out_bytes)
                    + (OPENVINO_NORM_PASSES * layer.out_bytes if norm else 0))
    calls_s = OPENVINO_CALL_S * layer.batch_in  # one call a window
    first_s = 0.0
    if passes is not None:  # the batch's share of a first call: a compile, a window's tensors
        tensor_bytes = layer.in_bytes + layer.out_bytes  # the batch's
        first_s = (OPENVINO_FIRST_CALL_S * layer.batch_in
                   + OPENVINO_FIRST_CALL_S_PER_BYTE * tensor_bytes) / max(1, passes)
    return (layer.direct_flops / rate,
            copies_bytes / machine.rate("memory_bytes_per_s") + calls_s + first_s)


def openvino_seconds(
    layer: LayerShape, machine: MachineProfile, passes: int | None = None, norm: bool = False
) -> float:
    """Multiply-adds at the OpenVINO conv rate (lower with fewer input channels than a
    channel block), the copies of input into its blocked layout and of its channels-last
    output to ours (read and written: few-channel layers are bound by them), a fixed cost
    per call (one a window),
    with `norm` the instance norm it applies (one pass over its blocked output), and,
    for a run of `passes` windows, its share of the layer's first call (None: steady state)."""
    return sum(openvino_terms(layer, machine, passes, norm))


# A fresh process's first pass over a window pays once for what later passes reuse: the
# page faults (and transparent huge-page compaction) of the pass's peak, and the kernel
# transforms. BasicUNet first minus second pass over one window, over the planned peak
# (fresh processes, CI kind, 2026-11-23): 1.3-2.2 ns/byte at 128^3 (446 MiB), 0.5-1.5 at
# 160^3 (820 MiB), 1.3-2.4 at 192^3 (1.3 GiB), 0.3-1.8 at 256^3 (3.1 GiB). The low end is
# taken: at 1.5 the planner chose 8 tiles of 104^3 for the valid U-Net over 128^3, which
# ran slower (2.36-3.07 s end to end) than its one 168^3 tile (2.08-2.52 s)
FIRST_PASS_S_PER_PEAK_BYTE = 0.5e-9


def first_pass_seconds(plan: GraphPlan) -> float:
    """What a run's first pass costs beyond the steady-state prediction (once per run):
    the pages of its peak, and the import of openvino where a conv runs on it."""
    uses_openvino = any(n.primitive == "openvino" for n in plan.nodes)
    return FIRST_PASS_S_PER_PEAK_BYTE * plan.peak_bytes + OPENVINO_IMPORT_S * uses_openvino


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


def _hand_on_channels_last(
    graph: Graph, picks: dict[int, tuple[float, int, int, str]], readers: dict[str, int],
    machine: MachineProfile, batch: int,
) -> tuple[dict[int, tuple[float, int, int, str]], dict[int, float]]:
    """(picks, seconds saved per conv) where OpenVINO convs hand their output on
    channels-last to OpenVINO readers (model.openvino_layers.channels_last_convs): the copies
    openvino_seconds charged that never run (its transpose of the output, each reader's
    reorder of it) are saved; the conv makes no copy of its output (no workspace) and its
    readers keep less of their input (OPENVINO_KEPT_PER_CHANNELS_LAST_INPUT_BYTE)."""
    chained = channels_last_convs(graph, readers, lambda j: picks[j][3] if j in picks else None)
    picks, saved = dict(picks), {}
    for i in chained:
        out = graph.nodes[openvino_output_node(graph, i, readers)].outputs[0]
        out_bytes = conv_layer(graph, i, graph.nodes[i], batch).out_bytes
        copies_bytes = OPENVINO_COPY_PASSES * 2 * out_bytes * (1 + readers[out])
        saved[i] = copies_bytes / machine.rate("memory_bytes_per_s")
        seconds, _, kept, prim = picks[i]
        picks[i] = (seconds, 0, kept, prim)
        for j, node in enumerate(graph.nodes):
            if node.inputs and node.inputs[0] == out:
                in_bytes = conv_layer(graph, j, node, batch).in_bytes
                seconds, work, kept, prim = picks[j]
                kept -= int((OPENVINO_KEPT_PER_INPUT_BYTE
                             - OPENVINO_KEPT_PER_CHANNELS_LAST_INPUT_BYTE) * in_bytes / batch)
                picks[j] = (seconds, work, max(0, kept), prim)
    return picks, saved


def _chained(
    graph: Graph, picks: dict[int, tuple[float, int, int, str]], readers: dict[str, int],
    machine: MachineProfile, batch: int, passes: int | None,
) -> tuple[dict[int, tuple[float, int, int, str]], dict[int, float]]:
    """(picks, seconds saved per conv) where a conv's output goes on to the next conv inside
    one OpenVINO layer (model.openvino_layers.openvino_chains): a call per window, the first call's
    fixed part (for a run of `passes` windows) and OPENVINO_CHAIN_PASSES over the tensor
    between are saved; the layer keeps that tensor (OPENVINO_KEPT_PER_CHAINED_BYTE)."""
    chains = openvino_chains(graph, readers, lambda j: picks[j][3] if j in picks else None)
    picks, saved = dict(picks), {}
    for chain in chains.values():
        for i in chain[:-1]:
            between_bytes = conv_layer(graph, i, graph.nodes[i], batch).out_bytes
            saved[i] = _link_seconds(graph, i, machine, batch, passes)
            seconds, work, kept, prim = picks[i]
            per_byte = (OPENVINO_KEPT_PER_CHAINED_NORMED_BYTE if absorbs_next_norm(
                graph, i, readers, prim) else OPENVINO_KEPT_PER_CHAINED_BYTE)
            picks[i] = (seconds, work, max(0, kept + int(per_byte * between_bytes / batch)), prim)
    return picks, saved


def _link_seconds(graph: Graph, i: int, machine: MachineProfile, batch: int,
                  passes: int | None) -> float:
    """What conv i saves where its output goes on to the next conv in one OpenVINO layer."""
    between_bytes = conv_layer(graph, i, graph.nodes[i], batch).out_bytes
    return (OPENVINO_CHAIN_PASSES * between_bytes / machine.rate("memory_bytes_per_s")
            + OPENVINO_CALL_S * batch
            + (0.0 if passes is None else OPENVINO_FIRST_CALL_S * batch / max(1, passes)))


def _paired(
    picks: dict[int, tuple[float, int, int, str]],
    options: dict[int, list[tuple[float, int, int, str]]],
    graph: Graph, machine: MachineProfile, batch: int, passes: int | None,
) -> dict[int, tuple[float, int, int, str]]:
    """Each conv takes its fastest option alone; two convs that would chain on OpenVINO
    (model.openvino_layers.openvino_chains) both move to it where the link saves more than that
    costs them (a small layer alone is faster on Winograd, say, than with its compile)."""
    openvino = {i: next((o for o in opts if o[3] == "openvino"), None)
                for i, opts in options.items()}
    readers = reader_counts(graph)
    chains = openvino_chains(graph, readers, lambda j: "openvino" if openvino.get(j) else None)
    picks = dict(picks)
    for chain in chains.values():
        for a, b in zip(chain, chain[1:], strict=False):
            ov_a, ov_b = openvino[a], openvino[b]
            assert ov_a is not None and ov_b is not None  # chained only where both can
            apart_s = picks[a][0] + picks[b][0]
            if ov_a[0] + ov_b[0] - _link_seconds(graph, a, machine, batch, passes) < apart_s:
                picks[a], picks[b] = ov_a, ov_b
    return picks


def chain_calls(graph: Graph, picks: dict[int, tuple[float, int, int, str]]) -> dict[int, int]:
    """First node -> last node of each chain of OpenVINO convs run in one call."""
    readers = reader_counts(graph)
    chains = openvino_chains(graph, readers, lambda j: picks[j][3] if j in picks else None)
    return {i: openvino_output_node(graph, chain[-1], readers) for i, chain in chains.items()}


def unbuilt_concats(graph: Graph, picks: dict[int, tuple[float, int, int, str]]) -> frozenset:
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
    options = _conv_options(graph, machine, tensors, limit, passes, batch)
    picks = _paired({i: opts[0] for i, opts in options.items()}, options, graph, machine,
                    batch, passes)
    spaces = [batch * general_workspace_bytes(graph, n, machine.cores) for n in graph.nodes]
    while _peak(tensors, picks, max(spaces)) > limit:
        keeping = [i for i, p in picks.items()
                   if p[2] and any(not o[2] for o in options[i])]
        if not keeping:
            need = _peak(tensors, picks, max(spaces))
            raise ValueError(f"graph {graph.name!r} needs {need:,} bytes per window, more than "
                             f"{limit:,}")

        def loss(i: int) -> float:
            alt = next(o for o in options[i] if not o[2])
            return (alt[0] - picks[i][0]) / picks[i][2]

        i = min(keeping, key=loss)
        picks[i] = next(o for o in options[i] if not o[2])
    readers, fused, free = reader_counts(graph), set(), {}
    for i in range(len(graph.nodes)):
        if absorbs_next_activation(graph, i, readers):
            fused.add(i + 1)  # applied in the conv's or the norm's output pass
        if i in picks and absorbs_next_norm(graph, i, readers, picks[i][3]):
            free[i + 1] = other_seconds(graph, graph.nodes[i + 1], machine, batch)
    picks, saved = _hand_on_channels_last(graph, picks, readers, machine, batch)
    picks, chain_saved = _chained(graph, picks, readers, machine, batch, passes)
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
    )
