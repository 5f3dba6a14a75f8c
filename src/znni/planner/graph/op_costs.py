"""Costs of the general conv kernels graph_ops runs for graph networks (planner.graph.search):
the phase-split strided conv and the scatter transposed conv, as counted work over this
machine's calibrated rates, and the strided conv's temporaries."""

from __future__ import annotations

from math import prod

from znni.model.graph import Graph, Node
from znni.model.network import FLOAT_BYTES
from znni.planner.costs import Work
from znni.primitives.cpu.graph_ops._parallel import PARALLEL_BYTES
from znni.primitives.cpu.graph_ops.conv_strided import COLUMN_BYTES
from znni.primitives.cpu.graph_ops.conv_transpose import scatter_slab_planes

# graph_ops.conv_strided (phase split, column gather, one GEMM per block): least squares over
# MONAI UNet's six stride-2 3^3 convs (1->16, 16->32, 32->64) in 64^3, 80^3 and 96^3 windows,
# 3 fresh processes each (CI kind, 2026-11-24; 54 nodes, relative error, rms log 0.12,
# 0.72-1.18 of measured; an earlier set of 3 gave 1.41): its GEMMs (Cout 16-64) run at
# 1/1.5 of the calibrated direct-conv rate (graph_gemm_flops_per_s since, calibrated on
# these convs themselves: graph/calibrate.py), and the split costs one pass over the phases
# it writes. (The 2026-11-23 fit, 2.2 and 4 passes, predicted these nodes at 1.1-1.8x
# their time: rms log 0.42.)
STRIDED_GEMM_SLOWDOWN = 1.5
SPLIT_PASSES = 1.0
# graph_ops' scatter transposed conv (k != s or pads: per slab of z planes one GEMM for all
# K kernel offsets, each offset's rows then added into a strided view of the output): least
# squares over MONAI UNet's three k=3, s=2 upsamplings (192->32, 64->16, 32->2) in 64^3,
# 80^3 and 96^3 windows, 3 fresh processes each (CI kind, 2026-11-24; 27 nodes, 2.5-12 ms,
# rms log 0.17, 0.77-1.44 of measured): GEMMs at 1/2 of the direct rate
# (graph_gemm_flops_per_s since), and 2 passes over the offsets' products at the memory
# rate (written, read, added into the output: 4 on each of the 2 cores' halves)
SCATTER_GEMM_SLOWDOWN = 2.0
SCATTER_PASSES = 2.0


def scatter_transpose_work(graph: Graph, node: Node) -> Work:
    """graph_ops.conv_transpose's scatter path: one (K*Cout, Cin) @ (Cin, N) GEMM over the
    input, and the K offsets' (Cout, N) products added into strided views of the output
    (each product written, read, and the output read and written)."""
    w = node.params["weight"]
    n_in = prod(graph.shapes[node.inputs[0]][2:])
    cout = w.shape[1] * node.params["group"]
    offsets = prod(w.shape[2:])
    return Work(direct_flops=2.0 * n_in * w.size * SCATTER_GEMM_SLOWDOWN,
                memory_bytes=SCATTER_PASSES * offsets * cout * n_in * FLOAT_BYTES)


def scatter_transpose_bytes(graph: Graph, node: Node, cores: int) -> int:
    """Workspace of graph_ops.conv_transpose's scatter path: the uncropped output it adds
    into (cropped into the node's output at the end) and a slab product per worker (the K
    offsets' rows of at least one z plane, or of the planes a slab's writes reach)."""
    w, s, d = node.params["weight"], node.params["strides"], node.params["dilations"]
    n, cin, *size = graph.shapes[node.inputs[0]]
    cout = w.shape[1] * node.params["group"]
    full = prod((size[i] - 1) * s[i] + d[i] * (int(w.shape[2 + i]) - 1) + 1 for i in range(3))
    plane_bytes = prod(w.shape[1:]) * size[1] * size[2] * FLOAT_BYTES  # K*Cout/g rows
    planes = min(size[0], scatter_slab_planes(int(w.shape[2]), s[0], d[0], plane_bytes))
    acc_bytes = n * cout * full * FLOAT_BYTES
    workers = cores if acc_bytes >= PARALLEL_BYTES else 1  # as run_tiles splits them
    return acc_bytes + workers * planes * plane_bytes


def phase_split_conv(node: Node) -> bool:
    """A conv graph_ops runs on phase-split input (graph_ops.conv_strided): strided,
    undilated, with more than one input channel per group or a single group."""
    p = node.params
    depthwise = p["weight"].shape[1] == 1 and p["group"] > 1
    return p["strides"] != (1, 1, 1) and p["dilations"] == (1, 1, 1) and not depthwise


def upsample_transpose(node: Node) -> bool:
    """A transposed conv on graph_ops' k == s GEMM path (disjoint output blocks)."""
    p = node.params
    return (tuple(p["weight"].shape[2:]) == tuple(p["strides"]) and not any(p["pads"])
            and not any(p["output_padding"]) and p["dilations"] == (1, 1, 1))


def strided_geometry(graph: Graph, node: Node) -> tuple[int, int, int]:
    """(phase-split input, flat output grid, column rows) counts of graph_ops.conv_strided:
    phases of L = out + ceil(k / s) - 1 (+1 z plane) voxels per axis, min(s, k) per axis;
    the grid is out_z planes of L_y * L_x; K = Cin * kz*ky*kx rows."""
    w, s = node.params["weight"], node.params["strides"]
    cin = graph.shapes[node.inputs[0]][1]
    out = graph.shapes[node.outputs[0]][2:]
    length = [out[a] + -(-int(w.shape[2 + a]) // s[a]) - 1 for a in range(3)]
    phases = prod(min(s[a], int(w.shape[2 + a])) for a in range(3))
    split = cin * phases * (length[0] + 1) * length[1] * length[2]
    return split, out[0] * length[1] * length[2], cin * prod(w.shape[2:])


def strided_conv_work(graph: Graph, node: Node) -> Work:
    """graph_ops.conv_strided: the phase split (written once, its input read at strided
    cost), the column gather and the GEMM over the flat grid (y and x past the output
    are computed and cropped), and the crop copy."""
    split, grid, rows = strided_geometry(graph, node)
    w = node.params["weight"]
    out_voxels = prod(graph.shapes[node.outputs[0]][1:])
    return Work(
        direct_flops=2.0 * w.shape[0] * (rows // node.params["group"]) * grid
        * STRIDED_GEMM_SLOWDOWN,
        gather_bytes=float(rows * grid * FLOAT_BYTES),
        memory_bytes=float((SPLIT_PASSES * split + 2 * out_voxels) * FLOAT_BYTES),
    )


def strided_conv_bytes(graph: Graph, node: Node, cores: int) -> int:
    """Workspace of graph_ops.conv_strided: the phase-split input, the flat output grid
    before its crop, and a column block per worker (conv_strided.COLUMN_BYTES at most)."""
    split, grid, rows = strided_geometry(graph, node)
    cout = node.params["weight"].shape[0]
    return (split + cout * grid) * FLOAT_BYTES + cores * min(COLUMN_BYTES,
                                                             rows * grid * FLOAT_BYTES)
