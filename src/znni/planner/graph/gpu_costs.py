"""What a graph node costs on a GPU: each GPU conv primitive's time, workspace and kept
bytes, and the other nodes' element-wise time (gpu_search.py chooses with them).

The primitives, by the names primitives/gpu/conv_dispatch runs them:
- "cudnn": cuDNN's conv: any stride, dilation and groups, transposed too; bias and
  activation fused. Planned only where the GpuProfile says cuDNN is installed.
- "cufft-keep" / "cufft": ZNNi's FFT conv, the kernel spectra kept on the device between
  windows or recomputed (pruned) per call; stride 1, dilation 1, one group, not transposed.
- "gemm-loop": one GEMM per kernel offset over a shifted copy of the input; runs every conv
  (the fallback where cuDNN is not installed).

Every stage is a roofline (Williams, Waterman, Patterson, "Roofline", CACM 2009): the larger
of its flops over the compute rate and its bytes over the memory bandwidth, plus a launch
cost per call (GpuProfile.layer_overhead_s). FFT convs transform in fp32 (complex64) at
every precision: cuFFT's half-precision transforms take power-of-two sizes only; the casts
in and out are counted as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from znni.model.graph import FUSABLE_ACTIVATIONS, Graph, Node, reader_counts, stride_one_conv
from znni.planner.costs import pruned_kernel_flops, transform_flops
from znni.planner.machine import GpuProfile
from znni.primitives.fft_sizes import CUFFT_EXTRA_FACTORS, padded_shape, spectrum_points
from znni.primitives.gpu.conv_spec import conv_spec
from znni.primitives.gpu.fft_conv import fft_workspace_bytes
from znni.primitives.gpu.gemm_loop import gemm_loop_workspace_bytes
from znni.primitives.gpu.graph_split import workspace_bytes as kernel_workspace_bytes
from znni.primitives.precision import storage_bytes

GPU_CONV_PRIMITIVES: tuple[str, ...] = ("cudnn", "cufft-keep", "cufft", "gemm-loop")
GPU_CONV_OPS = ("conv", "conv_transpose")
FP32_BYTES = 4
COMPLEX_BYTES = 8  # complex64
# ASSUMED (no device measured yet): the work area of the algorithm cuDNN picks, as a
# fraction of the conv's input + output bytes (implicit-GEMM kernels need little; FFT and
# Winograd algorithms more), and at least CUDNN_MIN_WORKSPACE_BYTES
CUDNN_WORKSPACE_FRACTION = 0.5
CUDNN_MIN_WORKSPACE_BYTES = 16 * 2**20
CUDNN_MAX_WORKSPACE_BYTES = 2**30  # primitives/gpu/cudnn_conv.MAX_WORKSPACE_BYTES: larger
# plans are deselected
FFT_BATCH_BYTES = 2**26  # primitives/gpu/cufft_conv.FFT_BATCH_BYTES: one transform batch
# cuFFT's plan cache: its byte bound is reserved on the device once where any FFT conv runs
# (primitives/gpu/cufft_conv.plan_cache_bytes: 256 MiB, at most 1/16 of the device cap)
PLAN_CACHE_BYTES, PLAN_CACHE_CAP_SHARE = 2**28, 16
# a 3D transform is three passes of 1D transforms (one per axis), each reading and writing
# the batch's complex data: 6 complex values of traffic per spectrum point
FFT_PASSES_BYTES = 6 * COMPLEX_BYTES
FFT_CALLS = 6  # launches per FFT conv: forward, products, inverse, pad, crop, bias/activation
# ops that move no data on the device (views) and ops that read their input three times
# (two statistics passes and the normalising pass) and write once
GPU_VIEWS = ("identity", "dropout", "slice")
GPU_NORMS = ("instance_norm", "group_norm", "batch_norm")
# nodes the device executor applies the next activation in (engine/compute/graph_device's
# FUSES_NEXT): the activation gets no launch and no buffer of its own
GPU_FUSES_NEXT = ("conv", "conv_transpose", *GPU_NORMS)


@dataclass(frozen=True)
class ConvCost:
    """One primitive on one conv node, for `batch` windows: seconds, the temporaries of its
    call (workspace), the bytes it keeps between windows (kernel spectra)."""

    primitive: str
    seconds: float
    workspace_bytes: int
    kept_bytes: int = 0

    @property
    def uses_fft(self) -> bool:
        return self.primitive.startswith("cufft")


def fft_plan_bytes(cap_bytes: int) -> int:
    """The cuFFT plan cache's reserved bytes (PLAN_CACHE_BYTES within the cap's share)."""
    return min(PLAN_CACHE_BYTES, cap_bytes // PLAN_CACHE_CAP_SHARE)


def roofline_s(flops: float, flops_per_s: float, nbytes: float, gpu: GpuProfile) -> float:
    """max(flops / rate, bytes / bandwidth) (the roofline model)."""
    return max(flops / flops_per_s, nbytes / gpu.memory_bytes_per_s)


def gpu_conv_primitives(node: Node, gpu: GpuProfile) -> tuple[str, ...]:
    """The primitives that can run `node` on `gpu`: cuDNN where installed, cuFFT for
    stride-1, undilated, ungrouped convs, the GEMM loop for every conv."""
    if node.op not in GPU_CONV_OPS:
        return ()
    fft = ("cufft-keep", "cufft") if stride_one_conv(node) else ()
    return (*(("cudnn",) if gpu.has_cudnn else ()), *fft, "gemm-loop")


def conv_flops(graph: Graph, node: Node) -> float:
    """2 flops per multiply-add, one window (ZNNi direct conv: 2*Cin*Cout*k^3*out^3; grouped
    convs 1/group of it; a transposed conv's multiply-adds run over its input positions)."""
    k3 = prod(node.params["weight"].shape[2:])
    w = node.params["weight"]
    if node.op == "conv_transpose":  # weight (Cin, Cout/group, k...)
        return 2.0 * prod(graph.shapes[node.inputs[0]][2:]) * w.shape[0] * w.shape[1] * k3
    return 2.0 * prod(graph.shapes[node.outputs[0]][2:]) * w.shape[0] * w.shape[1] * k3


def tensor_bytes(graph: Graph, name: str, itemsize: int) -> int:
    """One window's bytes of tensor `name` at `itemsize` bytes an element."""
    return prod(graph.shapes[name][1:]) * itemsize


def conv_costs(graph: Graph, node: Node, gpu: GpuProfile, precision: str,
               batch: int = 1) -> list[ConvCost]:
    """Every primitive that can run the conv node, costed for `batch` windows."""
    out = []
    for prim in gpu_conv_primitives(node, gpu):
        if prim == "cudnn":
            out.append(cudnn_cost(graph, node, gpu, precision, batch))
        elif prim == "gemm-loop":
            out.append(gemm_loop_cost(graph, node, gpu, precision, batch))
        else:
            out.append(cufft_cost(graph, node, gpu, precision, batch, keep=prim == "cufft-keep"))
    return out


def cudnn_cost(graph: Graph, node: Node, gpu: GpuProfile, precision: str,
               batch: int) -> ConvCost:
    """ZNNi's direct conv flops at cuDNN's rate for `precision`, against reading the input
    and writing the output once (bias and activation fused); one call."""
    sb = storage_bytes(precision)
    moved = batch * (tensor_bytes(graph, node.inputs[0], sb)
                     + tensor_bytes(graph, node.outputs[0], sb))
    seconds = roofline_s(batch * conv_flops(graph, node), gpu.conv_rate("cudnn", precision),
                         moved, gpu) + gpu.layer_overhead_s
    work = min(CUDNN_MAX_WORKSPACE_BYTES,
               max(CUDNN_MIN_WORKSPACE_BYTES, int(CUDNN_WORKSPACE_FRACTION * moved)))
    return ConvCost("cudnn", seconds, work)


def gemm_loop_cost(graph: Graph, node: Node, gpu: GpuProfile, precision: str,
                   batch: int) -> ConvCost:
    """Per kernel offset: a shifted copy of the input (read and write at storage bytes), a
    (Cout, Cin) @ (Cin, V) GEMM (2*Cin*Cout*V flops, fp32 product) added into the fp32
    accumulator (read, read, write); two launches. V: output positions (input positions
    for a transposed conv, scattered into its output)."""
    sb = storage_bytes(precision)
    w = node.params["weight"]
    k3 = prod(w.shape[2:])
    big = node.inputs[0] if node.op == "conv_transpose" else node.outputs[0]
    v = batch * prod(graph.shapes[big][2:])
    groups = int(node.params.get("group", 1))
    cin, cout = ((w.shape[0], w.shape[1] * groups) if node.op == "conv_transpose"
                 else (w.shape[1] * groups, w.shape[0]))
    shifted_bytes = v * cin * sb  # the offset's copy of the input
    product_bytes = v * cout * FP32_BYTES
    gemm_s = roofline_s(2.0 * v * w.shape[0] * w.shape[1], gpu.conv_rate("gemm", precision),
                        shifted_bytes + product_bytes, gpu)
    per_offset_s = gemm_s + (2 * shifted_bytes + 3 * product_bytes) / gpu.memory_bytes_per_s
    seconds = k3 * (per_offset_s + 2 * gpu.layer_overhead_s)
    return ConvCost("gemm-loop", seconds, gemm_loop_workspace_bytes(
        conv_spec((batch, *graph.shapes[node.inputs[0]][1:]), node.params, activation=None,
                  precision=precision, transposed=node.op == "conv_transpose")))


def fft_shape(graph: Graph, node: Node) -> tuple[int, int, int]:
    """cuFFT's transform shape for the node's zero-padded input (primitives/fft_sizes)."""
    size = graph.shapes[node.inputs[0]][2:]
    pads = node.params["pads"]
    padded = tuple(int(size[a]) + pads[a] + pads[a + 3] for a in range(3))
    return padded_shape(padded, CUFFT_EXTRA_FACTORS)


def cufft_cost(graph: Graph, node: Node, gpu: GpuProfile, precision: str, batch: int, *,
               keep: bool) -> ConvCost:
    """ZNNi's FFT conv: batch*(Cin+Cout) image transforms of C*N*log2(N) flops, 8*Cin*Cout
    flops per spectrum point and window of products, and without `keep` Cin*Cout pruned
    kernel transforms per call (costs.pruned_kernel_flops); padding the input into fp32 and
    cropping, casting and biasing the output stream their bytes."""
    w = node.params["weight"]
    cout, cin = int(w.shape[0]), int(w.shape[1])
    shape = fft_shape(graph, node)
    n, nc = prod(shape), spectrum_points(shape)
    images = batch * (cin + cout)
    seconds = roofline_s(images * transform_flops(shape), gpu.fft_flops_per_s,
                         images * nc * FFT_PASSES_BYTES, gpu)
    kernel_bytes = cin * cout * nc * COMPLEX_BYTES
    seconds += roofline_s(8.0 * batch * cin * cout * nc, gpu.madd_flops_per_s,
                          kernel_bytes + images * nc * COMPLEX_BYTES, gpu)
    sb = storage_bytes(precision)
    moved = images * n * FP32_BYTES + batch * (tensor_bytes(graph, node.inputs[0], sb)
                                               + 2 * tensor_bytes(graph, node.outputs[0], sb))
    seconds += moved / gpu.memory_bytes_per_s + FFT_CALLS * gpu.layer_overhead_s
    # the executor's own bound of its temporaries (spectra, transform batches, the kernel
    # spectra of a group of output channels when recomputed), plus its fp32 copies of the
    # padded input, weight, output and bias (primitives/gpu/cufft_conv)
    size = graph.shapes[node.inputs[0]][2:]
    pads = node.params["pads"]
    padded = tuple(int(size[a]) + pads[a] + pads[a + 3] for a in range(3))
    copies = (batch * cin * prod(padded) + w.size
              + batch * tensor_bytes(graph, node.outputs[0], 1) + cout) * FP32_BYTES
    work = fft_workspace_bytes(batch, cin, cout, padded, keep, FFT_BATCH_BYTES) + copies
    if keep:
        return ConvCost("cufft-keep", seconds, work, kept_bytes=kernel_bytes)
    seconds += roofline_s(cin * cout * pruned_kernel_flops(tuple(w.shape[2:]), shape),
                          gpu.fft_flops_per_s, 2 * kernel_bytes, gpu)
    return ConvCost("cufft", seconds, work)


def other_gpu_seconds(graph: Graph, i: int, gpu: GpuProfile, precision: str, batch: int,
                      readers: dict[str, int]) -> float:
    """A node that is not a conv: its inputs read and outputs written once at storage bytes
    over the device bandwidth (norms read theirs three times), plus one launch; views move
    nothing, and an activation the conv before it fuses costs nothing."""
    node = graph.nodes[i]
    if node.op in GPU_VIEWS or (node.op == "pad" and not any(node.params["pads"])):
        return 0.0
    if i > 0 and fuses_next_activation(graph, i - 1, readers):
        return 0.0
    sb = storage_bytes(precision)
    reads = 3 if node.op in GPU_NORMS else 1
    moved = batch * (reads * sum(tensor_bytes(graph, t, sb) for t in node.inputs)
                     + sum(tensor_bytes(graph, t, sb) for t in node.outputs))
    return moved / gpu.memory_bytes_per_s + gpu.layer_overhead_s


def other_workspace_bytes(graph: Graph, i: int, precision: str, batch: int,
                          readers: dict[str, int]) -> int:
    """The temporaries the device executor reserves around node i, not a conv (its xp
    kernel's bound, primitives/gpu/graph_split.workspace_bytes, in fp32, plus fp32 copies
    in and out at 2-byte storage); 0 for an activation fused into the node before it."""
    node = graph.nodes[i]
    if i > 0 and fuses_next_activation(graph, i - 1, readers):
        return 0
    shapes = [(batch, *graph.shapes[t][1:]) for t in node.inputs]
    out = (batch, *graph.shapes[node.outputs[0]][1:])
    in_f32 = sum(prod(s) for s in shapes) * FP32_BYTES
    work = kernel_workspace_bytes(node.op, dict(node.params), in_f32, out, shapes)
    if storage_bytes(precision) != FP32_BYTES:
        work += in_f32 + prod(out) * FP32_BYTES
    return int(work)


def fuses_next_activation(graph: Graph, i: int, readers: dict[str, int]) -> bool:
    """Whether the device executor applies node i + 1, an activation that alone reads node
    i's output (not the graph's), in node i's call (engine/compute/graph_device)."""
    nodes = graph.nodes
    if nodes[i].op not in GPU_FUSES_NEXT or i + 1 >= len(nodes):
        return False
    nxt, out = nodes[i + 1], nodes[i].outputs[0]
    return (nxt.op in FUSABLE_ACTIVATIONS and nxt.inputs == nodes[i].outputs
            and readers.get(out) == 1 and out != graph.output)


def device_tensor_bytes(graph: Graph, batch: int, itemsize: int) -> int:
    """Most bytes of tensors alive at once as the device executor runs the nodes in order:
    every node writes a new array (a fused activation none of its own), a tensor is freed
    after its last reader, the input lives through the pass."""
    readers, last = reader_counts(graph), graph.last_use()
    size = {t: batch * prod(shape[1:]) * itemsize for t, shape in graph.shapes.items()}
    live = peak = size[graph.input]
    i = 0
    while i < len(graph.nodes):
        end = i + 1 if fuses_next_activation(graph, i, readers) else i
        live += sum(size[t] for t in graph.nodes[end].outputs)
        peak = max(peak, live)
        dying = {t for t in {*graph.nodes[i].inputs, *graph.nodes[end].inputs}
                 if last.get(t, -1) <= end and t not in (graph.input, graph.output)}
        live -= sum(size[t] for t in dying - set(graph.nodes[i].outputs))
        i = end + 1
    return peak


def weights_bytes(graph: Graph, precision: str) -> int:
    """Device bytes of the parameters: conv weights at storage bytes, the rest in fp32."""
    total = 0
    for node in graph.nodes:
        for key, value in node.params.items():
            size = getattr(value, "size", None)
            if size is None or not hasattr(value, "dtype"):
                continue
            conv_weight = node.op in GPU_CONV_OPS and key == "weight"
            total += int(size) * (storage_bytes(precision) if conv_weight else FP32_BYTES)
    return total
