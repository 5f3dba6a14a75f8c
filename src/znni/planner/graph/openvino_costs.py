"""The cost and memory model of the OpenVINO conv primitive (primitives/cpu/openvino_conv):
a layer's seconds, the copies a channels-last hand-on saves, and what convs chained in one
layer save and keep (model.openvino_layers). Plain arithmetic; each constant cites the
measurements it comes from."""

from __future__ import annotations

from math import prod, sqrt

from znni.model.graph import Graph, reader_counts
from znni.model.network import LayerShape
from znni.model.openvino_layers import (
    absorbs_next_norm,
    channels_last_convs,
    openvino_chains,
    openvino_output_node,
)
from znni.planner.graph.layers import conv_layer
from znni.planner.machine import MachineProfile
from znni.primitives.cpu.openvino_conv import openvino_available

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
# with these terms fixed (graph/calibrate.py)
OPENVINO_COPY_PASSES = 0.8
OPENVINO_NORM_PASSES = 1.3
OPENVINO_CALL_S = 0.5e-3
# its JIT kernels work on blocks of 16 channels (AVX-512 here); fewer input channels leave
# lanes idle: 18-31 GFLOP/s at Cin 1, 59 at 4, 100-113 at 12, 117-162 at 16-48 measured
# (3^3 convs, 64^3-166^3 outputs, CI kind, 2026-11-23): rate x sqrt(min(1, Cin / 16)).
# Output channels are computed a whole block at a time: 16 -> 8, 16 -> 12 and 16 -> 16 took
# 15.8, 15.9 and 17.8 ms at 64^3, 16 -> 20 37.2 ms (two blocks), 12 -> 12 and 12 -> 16 12.1
# and 11.2 ms (at 96^3: 62.0, 68.3, 74.8, 130.3; 45.7, 53.2 ms; one layer each, channels-
# last in and out, CI kind, 2026-11-24): rate x Cout / 16 below one block. The valid
# U-Net's 12-channel layers had run 1.2-1.35x their prediction without it; the
# calibration's shapes are whole blocks, so its fitted rate means the same. Wider layers
# are left to that one fitted rate: 24 -> 24 ran at 0.94 and 0.82 of 16 -> 16's rate
# (192 and 133 GFLOP/s), and charging it as 32 channels put the valid U-Net's 48 -> 24 ->
# 24 pair on Winograd and direct at 104^3 (48.5 ms against 18-25 ms chained). Not where each
# output voxel reads fewer than half a block's worth of 3^3 inputs (Cin x kernel voxels),
# where writing the output bounds the layer: 1 -> 8, 12, 16 took 3.1, 4.1, 5.2 ms at 64^3,
# 4 -> 12, 16 5.7 and 7.1 ms, and 1^3 12 -> 2, 16 -> 2, 16 -> 16 0.8, 1.1, 4.8 ms (same runs)
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
OPENVINO_FIRST_CALL_S_PER_BYTE = 1.0e-9
# and once per run, the import of openvino itself: 0.20-0.27 s (fresh processes, 2026-11-24)
OPENVINO_IMPORT_S = 0.25
# convs chained in one layer (model.openvino_layers.openvino_chains) save, per link, a
# call and the first call's fixed part (one compile: a 1 -> 16 -> 16 pair at 64^3 compiled in 37 ms
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


def openvino_ready() -> bool:
    """The optional OpenVINO conv primitive can run in this environment."""
    return openvino_available()


def openvino_terms(
    layer: LayerShape, machine: MachineProfile, passes: int | None = None, norm: bool = False
) -> tuple[float, float]:
    """(multiply-add seconds, the rest) of `openvino_seconds`: the calibration
    (graph/calibrate.py) fits the rate by the first."""
    rate = machine.rate("openvino_flops_per_s")
    rate *= sqrt(min(1.0, layer.channels_in / OPENVINO_CHANNEL_BLOCK))
    if 2 * layer.channels_in * prod(layer.kernel) >= 27 * OPENVINO_CHANNEL_BLOCK:  # bound by
        # its multiply-adds: a whole block of output channels
        rate *= min(1.0, layer.channels_out / OPENVINO_CHANNEL_BLOCK)
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
    channel block, and by the idle lanes of fewer output channels than one), the copies of
    input into its blocked layout and of its channels-last output to ours (read and
    written: few-channel layers are bound by them), a fixed cost per call (one a window),
    with `norm` the instance norm it applies (one pass over its blocked output), and,
    for a run of `passes` windows, its share of the layer's first call (None: steady state)."""
    return sum(openvino_terms(layer, machine, passes, norm))




def hand_on_channels_last(
    graph: Graph, picks: dict[int, tuple[float, int, int, str]], readers: dict[str, int],
    machine: MachineProfile, *, batch: int,
) -> tuple[dict[int, tuple[float, int, int, str]], dict[int, float]]:
    """(picks, seconds saved per conv) where OpenVINO convs hand their output on
    channels-last (model.openvino_layers.channels_last_convs): the copies openvino_seconds
    charged that never run (its transpose of the output, each OpenVINO reader's reorder
    of it) are saved; the conv makes no copy of its output (no workspace) and its
    readers keep less of their input (OPENVINO_KEPT_PER_CHANNELS_LAST_INPUT_BYTE)."""
    chained = channels_last_convs(graph, readers, lambda j: picks[j][3] if j in picks else None)
    picks, saved = dict(picks), {}
    for i in chained:
        out = graph.nodes[openvino_output_node(graph, i, readers)].outputs[0]
        out_bytes = conv_layer(graph, i, graph.nodes[i], batch).out_bytes
        convs = [j for j, node in enumerate(graph.nodes)  # the OpenVINO convs reading it whole
                 if j in picks and node.inputs and node.inputs[0] == out]
        copies_bytes = OPENVINO_COPY_PASSES * 2 * out_bytes * (1 + len(convs))
        saved[i] = copies_bytes / machine.rate("memory_bytes_per_s")
        seconds, _, kept, prim = picks[i]
        picks[i] = (seconds, 0, kept, prim)
        for j in convs:
            in_bytes = conv_layer(graph, j, graph.nodes[j], batch).in_bytes
            seconds, work, kept, prim = picks[j]
            kept -= int((OPENVINO_KEPT_PER_INPUT_BYTE
                         - OPENVINO_KEPT_PER_CHANNELS_LAST_INPUT_BYTE) * in_bytes / batch)
            picks[j] = (seconds, work, max(0, kept), prim)
    return picks, saved


def chained(
    graph: Graph, picks: dict[int, tuple[float, int, int, str]], readers: dict[str, int],
    machine: MachineProfile, *, batch: int, passes: int | None,
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
            saved[i] = link_seconds(graph, i, machine, batch=batch, passes=passes)
            seconds, work, kept, prim = picks[i]
            per_byte = (OPENVINO_KEPT_PER_CHAINED_NORMED_BYTE if absorbs_next_norm(
                graph, i, readers, prim) else OPENVINO_KEPT_PER_CHAINED_BYTE)
            picks[i] = (seconds, work, max(0, kept + int(per_byte * between_bytes / batch)), prim)
    return picks, saved


def link_seconds(graph: Graph, i: int, machine: MachineProfile, *, batch: int,
                 passes: int | None) -> float:
    """What conv i saves where its output goes on to the next conv in one OpenVINO layer."""
    between_bytes = conv_layer(graph, i, graph.nodes[i], batch).out_bytes
    return (OPENVINO_CHAIN_PASSES * between_bytes / machine.rate("memory_bytes_per_s")
            + OPENVINO_CALL_S * batch
            + (0.0 if passes is None else OPENVINO_FIRST_CALL_S * batch / max(1, passes)))


def paired(
    picks: dict[int, tuple[float, int, int, str]],
    options: dict[int, list[tuple[float, int, int, str]]],
    graph: Graph, machine: MachineProfile, *, batch: int, passes: int | None,
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
            link_s = link_seconds(graph, a, machine, batch=batch, passes=passes)
            if ov_a[0] + ov_b[0] - link_s < apart_s:
                picks[a], picks[b] = ov_a, ov_b
    return picks


def chain_calls(graph: Graph, picks: dict[int, tuple[float, int, int, str]]) -> dict[int, int]:
    """First node -> last node of each chain of OpenVINO convs run in one call."""
    readers = reader_counts(graph)
    chains = openvino_chains(graph, readers, lambda j: picks[j][3] if j in picks else None)
    return {i: openvino_output_node(graph, chain[-1], readers) for i, chain in chains.items()}
