"""The cost and memory model of a whole window's network compiled by OpenVINO
(primitives/cpu/openvino_network, the planner's "openvino-network"): plain arithmetic,
each constant citing what it was fitted on.

Compiled whole, every conv runs on OpenVINO's JIT kernels in its blocked layout (the
multiply-adds at the calibrated OpenVINO conv rate, as openvino_costs.openvino_terms
counts them, without the copies in and out of our layout that a single layer pays), and
the other nodes run fused into or beside them in that layout: their memory traffic at a
fraction of what our kernels move (NETWORK_OTHER_PASSES), with one call per window.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from znni.model.graph import Graph
from znni.model.network import FLOAT_BYTES
from znni.planner.graph.layers import conv_layer
from znni.planner.graph.openvino_costs import (
    OPENVINO_CALL_S,
    OPENVINO_RUNTIME_BYTES,
    openvino_ready,
    openvino_terms,
)
from znni.planner.graph.search import (
    GraphPlan,
    NodePlan,
    large_window_factor,
)
from znni.planner.machine import MachineProfile

NETWORK = "openvino-network"
# Non-conv nodes (norms, pools, concats, transposed convs, activations) in the compiled
# network: half a pass over their outputs at the calibrated memory rate (most are fused
# into the conv before them). Fitted on BasicUNet (16, 16, 32, 64, 128, 16) windows with
# this host's calibrated rates (OpenVINO conv 445 GFLOP/s, memory 12.5 GB/s; AMD EPYC
# Zen 4, 2 cores, 2026-11-27): measured 0.053, 0.18 and 0.64 s a window at 64^3, 96^3
# and 128^3 fp32 against 0.056, 0.20 and 0.52 s predicted
NETWORK_OTHER_PASSES = 0.5
# bf16 inference (INFERENCE_PRECISION_HINT) on a CPU with bf16 units: the same BasicUNet
# 64^3 window ran in 0.028 s against 0.053 s in fp32 (1.9x; AMD EPYC Zen 4 AVX512-BF16,
# 2026-11-27); the conv multiply-adds are charged at this multiple of the fp32 rate
BF16_CONV_SPEEDUP = 2.0
# int8 (NNCF's quantized network): the conv multiply-adds at the calibrated int8 speed-up
# of one OpenVINO conv (machine rate "openvino_int8_speedup", graph/calibrate.int8_rates);
# the other nodes as in fp32 (FakeQuantize's rounding fused into the convs beside them)
# its memory plan keeps about the network's peak of live tensors in its blocked layout,
# plus the runtime (openvino_costs) and the weights, which it copies once
NETWORK_KEPT_PER_TENSOR_BYTE = 1.5


def conv_speedup(machine: MachineProfile, precision: str) -> float:
    """How many times faster the compiled network's convs run at `precision` than in fp32
    on `machine` (bf16 only where the CPU has bf16 units: it runs in fp32 elsewhere)."""
    if precision == "int8":
        return machine.rate("openvino_int8_speedup")
    if precision == "bf16":
        from znni.primitives.cpu.openvino_network import cpu_has_bf16

        return BF16_CONV_SPEEDUP if cpu_has_bf16() else 1.0
    return 1.0


def network_window_seconds(graph: Graph, machine: MachineProfile, *, batch: int = 1,
                           precision: str = "fp32") -> float:
    """Predicted seconds of one pass of `batch` windows through the compiled network."""
    speedup = conv_speedup(machine, precision)
    conv_s = 0.0
    other_bytes = 0.0
    for i, node in enumerate(graph.nodes):
        if node.op == "conv":
            flops_s, _ = openvino_terms(conv_layer(graph, i, node, batch), machine)
            conv_s += flops_s / speedup
        else:
            other_bytes += sum(prod(graph.shapes[t][1:]) for t in node.outputs) * FLOAT_BYTES
    other_s = NETWORK_OTHER_PASSES * batch * other_bytes / machine.rate("memory_bytes_per_s")
    return (conv_s + other_s) * large_window_factor(graph) + OPENVINO_CALL_S


def network_peak_bytes(graph: Graph, batch: int = 1) -> int:
    """Host bytes the compiled network holds: its memory plan, runtime and weights."""
    weights = sum(int(v.nbytes) for n in graph.nodes for v in n.params.values()
                  if hasattr(v, "nbytes"))
    plan = NETWORK_KEPT_PER_TENSOR_BYTE * graph.peak_tensor_bytes(batch)
    return int(plan + OPENVINO_RUNTIME_BYTES + weights)


def openvino_network_plan(graph: Graph, machine: MachineProfile, node_plan: GraphPlan, *,
                          batch: int = 1, precision: str = "fp32") -> GraphPlan | None:
    """The whole window compiled by OpenVINO as a plan, beside `node_plan` (our executor's
    best, whose predicted time it records as the alternative); None where OpenVINO is not
    installed."""
    if not openvino_ready():
        return None
    seconds = network_window_seconds(graph, machine, batch=batch, precision=precision)
    nodes = tuple(NodePlan(n.name, n.op, NETWORK if n.op == "conv" else None, 0.0, 0)
                  for n in graph.nodes)
    return replace(node_plan, nodes=nodes, predicted_window_s=seconds / batch,
                   peak_bytes=network_peak_bytes(graph, batch), spectra_bytes=0,
                   openvino_bytes=network_peak_bytes(graph, batch), batch=batch,
                   precision=precision, compiled=NETWORK,
                   alternative_s=node_plan.predicted_window_s)
