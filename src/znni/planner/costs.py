"""Time per primitive and layer shape: counted work divided by calibrated rates.

Work is counted analytically (ZNNi, SC16, section "Primitives"); the rates
come from a MachineProfile (calibrate.py measures them on this machine).
Every quantity carries its unit: _flops, _bytes, _s. n is a padded FFT
size, N = nz*ny*nx real points, Nc = nz*ny*(nx//2+1) complex points.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from math import log2, prod

from znni.model.network import LayerShape
from znni.planner.machine import GpuProfile, MachineProfile
from znni.planner.tiles import fft_tiles, recompute_width, tiled_layer
from znni.primitives.cpu.direct_conv import block_shape, column_layout, computed_columns
from znni.primitives.fft_sizes import padded_shape, spectrum_points
from znni.triple import Triple

# A fresh process's first pass over a window or patch pays once for what later passes
# reuse: the page faults (and transparent huge-page compaction) of the pass's peak, and
# the kernel transforms (planner.graph.search.first_pass_seconds; per region for
# sequential networks, planner.search.region_voxels_per_second). BasicUNet first minus
# second pass over one window, over the planned peak
# (fresh processes, CI kind, 2026-11-23): 1.3-2.2 ns/byte at 128^3 (446 MiB), 0.5-1.5 at
# 160^3 (820 MiB), 1.3-2.4 at 192^3 (1.3 GiB), 0.3-1.8 at 256^3 (3.1 GiB). 0.5 had been
# taken, when the valid U-Net's one 168^3 tile over 128^3 ran faster than 8 of 104^3; with
# OpenVINO chains and channels-last hand-ons the 104^3 tiles ran 2.48-3.04 s end to end
# against 3.47-3.85 s for the one tile (Winograd and direct; 4 alternated pairs,
# 2026-11-24), that tile's first pass 1.5-2.4 ns per peak byte over its later ones; at 0.5
# the planner chose it. The middle of both ranges. Sequential networks (znni demo's,
# one patch, fresh backend, 2026-11-24): 0.25-1.5 ns/byte from 74 to 704 MiB; over a
# 200x700x700 region the patch this picks (100^3) and those 0.5 and 0 would pick ran
# within the runs' noise of each other (4.5-5.3 s), all faster than the per-patch choice
FIRST_PASS_S_PER_PEAK_BYTE = 2.0e-9

FFT_C = 2.5  # ZNNi: an FFT of N points costs about C*N*log2(N) flops, C ~ 2.5
COMPLEX_BYTES = 8  # complex64
FLOAT_BYTES = 4
WORK_BYTES = 2**29  # fft_conv3d work_bytes: samples per chunk of transforms
RECOMPUTE_BYTES = 2**27  # fft_conv3d recompute_bytes and kernel_spectra chunk
SLAB_BYTES = 2**23  # direct_conv3d slab_bytes: column buffer per block
DIRECT_WORKERS = 2  # block shapes halve z-blocks for >= 2 per worker; the count barely matters
# BLAS runs the direct conv's (Cout, rows) @ (rows, L) GEMMs in register tiles of whole row
# blocks, so Cout is paid rounded up to them: calibration's output-layer shapes (S=64,
# f=80, f'=3) ran 2.8-3.2x their f'=3 flops' time and n337's f'=3 layer 2.0x, while f'=24
# and 80 ran at the model's rate (OpenBLAS Haswell kernels, 2-core AMD EPYC, 2026-11-27)
GEMM_ROW_TILE = 8

CPU_CONV_PRIMITIVES = ("direct", "fft-keep", "fft-recompute")
GPU_CONV_PRIMITIVES = ("gpu-direct", "gpu-fft")


def transform_flops(padded: Triple) -> float:
    """One full 3D transform: C*N*log2(N) (ZNNi: 3C*n^3*log n for a cube)."""
    n = prod(padded)
    return FFT_C * n * log2(max(2, n))


def pruned_kernel_flops(kernel: Triple, padded: Triple) -> float:
    """A k^3 kernel zero-padded to n^3 needs k^2 lines on axis x, k*n on y, n^2 on z
    (ZNNi pruned FFT: C*n*log n*(k^2 + k*n + n^2) for a cube); each line C*L*log2(L)."""
    kz, ky, _ = kernel
    nz, ny, nx = padded
    nxc = nx // 2 + 1
    lines = (
        (kz * ky, nx),  # r2c along x for the k^2 nonzero lines
        (kz * nxc, ny),  # along y for the k planes of complex lines
        (ny * nxc, nz),  # along z for everything
    )
    return sum(FFT_C * count * length * log2(max(2, length)) for count, length in lines)


@dataclass(frozen=True)
class Work:
    """Counted work of one layer call; time = sum of each term over its rate."""

    fft_flops: float = 0.0  # image transforms (forward inputs, inverse outputs)
    kernel_fft_flops: float = 0.0  # pruned kernel transforms
    madd_flops: float = 0.0  # frequency-domain multiply-add, 8 flops per complex madd
    madd_bytes: float = 0.0  # bytes that multiply-add streams (spectra read once per call)
    products: float = 0.0  # per-frequency matrix products (numpy runs one small GEMM each)
    pack_bytes: float = 0.0  # input spectra each output-channel chunk's products gather again
    direct_flops: float = 0.0  # 2 flops per real multiply-add
    gather_bytes: float = 0.0  # direct conv: column buffers written, then read by the GEMM
    memory_bytes: float = 0.0  # element-wise traffic: crop, bias, activation, MPF, copies
    calls: int = 1

    def __add__(self, other: Work) -> Work:
        return Work(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Work)))


def conv_work(layer: LayerShape, primitive: str) -> Work:
    """Work of a conv layer under `primitive` (CPU or GPU name; same counting)."""
    s, f, g = layer.batch_in, layer.channels_in, layer.channels_out
    n_in, n_out = prod(layer.size_in), prod(layer.size_out)
    elementwise_bytes = float(s * g * n_out * FLOAT_BYTES * 3)  # bias + activation + store
    if primitive == "gpu-direct":  # ZNNi direct conv: S*f'*f*n'^3*k^3 multiply-adds
        return Work(direct_flops=2.0 * s * g * f * n_out * prod(layer.kernel),
                    memory_bytes=elementwise_bytes + s * f * n_in * FLOAT_BYTES)
    if primitive == "direct":
        return _cpu_direct_work(layer, elementwise_bytes)
    padded = padded_shape(layer.size_in)
    nc = spectrum_points(padded)
    # ZNNi FFT conv: S*3C*n^3*log n*(f+f') image transforms + 4S*f'*f*n^3 multiply-adds
    image_fft_flops = s * (f + g) * transform_flops(padded)
    madd_flops = 8.0 * s * f * g * nc
    madd_bytes = float((f * g + s * (f + g)) * nc * COMPLEX_BYTES)
    kernel_flops = 0.0
    if primitive in ("fft-recompute", "gpu-fft"):
        # + f*f'*C*n*log n*(k^2+kn+n^2) pruned kernel transforms per call
        kernel_flops = f * g * pruned_kernel_flops(layer.kernel, padded)
    pad_bytes = s * (f * prod(padded) + g * prod(padded)) * FLOAT_BYTES
    return Work(
        fft_flops=image_fft_flops,
        kernel_fft_flops=kernel_flops,
        madd_flops=madd_flops,
        madd_bytes=madd_bytes,
        memory_bytes=elementwise_bytes + pad_bytes,
    )


def _cpu_direct_work(layer: LayerShape, elementwise_bytes: float) -> Work:
    """primitives/cpu/direct_conv.py: S*f'*f*n'^3*k^3 multiply-adds (ZNNi direct conv) as
    GEMMs over column buffers, each written once and read once; a 1x1x1 kernel uses the
    input as is. The GEMMs run over flat runs of positions, so they also compute the
    dropped x >= ox, y >= oy between valid outputs (computed_columns). Deep layers gather
    f*kz*kx rows over each block's L + (ky-1)*X positions and run ky GEMMs, each after the
    first added into the result (read, read, write)."""
    s, f, g = layer.batch_in, layer.channels_in, layer.channels_out
    n_in = prod(layer.size_in)
    rows, gemms = column_layout(f, layer.kernel)
    zb, yb = block_shape(s, layer.size_out, layer.size_in, rows * gemms, SLAB_BYTES,
                         DIRECT_WORKERS)
    computed, blocks = computed_columns(s, layer.size_out, layer.size_in, zb, yb)
    gathered = rows * (computed + blocks * (gemms - 1) * layer.size_in[2])
    columns = 0.0 if prod(layer.kernel) == 1 else float(gathered)
    accumulate_bytes = 3.0 * (gemms - 1) * g * computed * FLOAT_BYTES
    g_tiled = -(-g // GEMM_ROW_TILE) * GEMM_ROW_TILE  # GEMM_ROW_TILE's rounding
    return Work(
        direct_flops=2.0 * g_tiled * f * computed * prod(layer.kernel),
        gather_bytes=2.0 * columns * FLOAT_BYTES,
        memory_bytes=elementwise_bytes + s * f * n_in * FLOAT_BYTES + accumulate_bytes,
    )


def sample_chunks(layer: LayerShape) -> int:
    """How many sample chunks fft_conv3d splits the batch into (its `sc` arithmetic)."""
    nc = spectrum_points(padded_shape(layer.size_in))
    per_sample_bytes = (layer.channels_in + layer.channels_out) * nc * COMPLEX_BYTES
    chunk = max(1, min(layer.batch_in, WORK_BYTES // per_sample_bytes))
    return -(-layer.batch_in // chunk)


def output_channel_chunks(layer: LayerShape, primitive: str) -> int:
    """fft_conv3d's output-channel chunks: kept spectra come whole; recomputed ones are made
    RECOMPUTE_BYTES of channels at a time (its `oc` arithmetic)."""
    if primitive != "fft-recompute":
        return 1
    f, g = layer.channels_in, layer.channels_out
    nc = spectrum_points(padded_shape(layer.size_in))
    oc = max(1, min(g, RECOMPUTE_BYTES // max(1, f * nc * COMPLEX_BYTES)))
    return -(-g // oc)


def cpu_madd_bytes(layer: LayerShape, primitive: str) -> float:
    """Bytes fft_conv3d's multiply-add streams, following its loops: per sample chunk the
    kernel spectra are read once (kept) or made RECOMPUTE_BYTES of output channels at a
    time (written, transformed in place, read); outputs pass twice (freq_product's
    transposing copy). The inputs' passes are pack_bytes (cpu_pack_bytes)."""
    f, g, s = layer.channels_in, layer.channels_out, layer.batch_in
    nc = spectrum_points(padded_shape(layer.size_in))
    spectra = sample_chunks(layer) * f * g * (1 if primitive == "fft-keep" else 2)
    return float((spectra + 2 * s * g) * nc * COMPLEX_BYTES)


def cpu_pack_bytes(layer: LayerShape, primitive: str) -> float:
    """Input spectra the multiply-add gathers: freq_product transposes every input spectrum
    of a sample chunk into (F, Cin, S) blocks once per output-channel chunk, and BLAS packs
    them again per product. This cost adds to the products' flops instead of overlapping
    them: recomputed spectra with few output channels per chunk (n926's 9^3 layer: 10
    chunks of 8) ran 2.8x slower than one chunk of 80, at the same flops."""
    nc = spectrum_points(padded_shape(layer.size_in))
    chunks = output_channel_chunks(layer, primitive)
    return float(chunks * layer.batch_in * layer.channels_in * nc * COMPLEX_BYTES)


def cpu_products(layer: LayerShape, primitive: str) -> float:
    """Small matrix products fft_conv3d's multiply-add dispatches: one per frequency, per
    sample chunk and per output-channel chunk. With few channels per chunk their fixed cost
    outweighs the flops (n926's 9^3 layer at 85^3: 15 M products of (3, 80) @ (80, 7))."""
    nc = spectrum_points(padded_shape(layer.size_in))
    return float(sample_chunks(layer) * output_channel_chunks(layer, primitive) * nc)


def cpu_conv_work(layer: LayerShape, primitive: str, spectra_budget: int | None = None) -> Work:
    """Work of a conv on CpuBackend: FFT primitives run over the overlap-save tiles the
    backend picks (tiles.py), plus the gather and scatter copies. `spectra_budget`: the
    backend's spectra cache bound for fft-keep (None: the layer's own untiled spectra)."""
    if primitive not in ("fft-keep", "fft-recompute"):
        return conv_work(layer, primitive)
    if spectra_budget is None:
        nc = spectrum_points(padded_shape(layer.size_in))
        spectra_budget = layer.channels_in * layer.channels_out * nc * COMPLEX_BYTES
    m = fft_tiles(layer, primitive, spectra_budget)
    tiled = tiled_layer(layer, m)
    if tiled is not layer and primitive == "fft-recompute":
        return tiled_recompute_work(tiled)
    work = _fft_chunk_work(tiled, primitive)
    if primitive == "fft-recompute":
        # fft_conv3d transforms samples in chunks of WORK_BYTES of spectra and recomputes
        # every kernel spectrum once per chunk, not once per call
        extra = sample_chunks(tiled) - 1
        work = work + Work(kernel_fft_flops=extra * work.kernel_fft_flops, calls=0)
    if tiled is layer:
        return work
    return work + _tile_copies(tiled, 1)


def _fft_chunk_work(layer: LayerShape, primitive: str) -> Work:
    """conv_work with fft_conv3d's own multiply-add traffic, gathers and product count."""
    return replace(conv_work(layer, primitive), madd_bytes=cpu_madd_bytes(layer, primitive),
                   pack_bytes=cpu_pack_bytes(layer, primitive),
                   products=cpu_products(layer, primitive))


def _tile_copies(tiled: LayerShape, parts: int) -> Work:
    """CpuBackend gathers the input tiles once per part of the output channels (read +
    write) and scatters their results (read + write) into the output."""
    return Work(memory_bytes=float(2 * (parts * tiled.in_bytes + tiled.out_bytes)), calls=0)


def tiled_recompute_work(tiled: LayerShape) -> Work:
    """Tiled fft-recompute (CpuBackend._run_tiles): per part of RECOMPUTE_SPECTRA_BYTES of
    output channels, the part's spectra are made once (pruned kernel transforms, then
    conjugated into (F, part, Cin): two more passes) and every tile runs through them as
    through kept spectra, so the inputs are transformed and gathered once per part."""
    f, g = tiled.channels_in, tiled.channels_out
    padded = padded_shape(tiled.size_in)
    nc = spectrum_points(padded)
    width = recompute_width(tiled)
    work = Work(kernel_fft_flops=f * g * pruned_kernel_flops(tiled.kernel, padded),
                memory_bytes=float(2 * f * g * nc * COMPLEX_BYTES), calls=0)
    for o0 in range(0, g, width):
        part = replace(tiled, channels_out=min(width, g - o0))
        work = work + _fft_chunk_work(part, "fft-keep")
    return work + _tile_copies(tiled, -(-g // width))


def working_set_bytes(layer: LayerShape) -> int:
    """The layer's input plus output: what decides whether it runs from cache."""
    return layer.in_bytes + layer.out_bytes


def scaling_key(layer: LayerShape, primitive: str | None) -> str:
    """Which calibrated size scaling (MachineProfile.cpu_scaling) a CPU layer follows."""
    if layer.kind == "conv":
        return str(primitive)
    return "maxpool" if layer.kind == "maxpool" else "elementwise"


def other_work(layer: LayerShape) -> Work:
    """Pooling (MPF) and stand-alone activations: element-wise traffic only."""
    return Work(memory_bytes=float(layer.in_bytes + 2 * layer.out_bytes))


def cpu_seconds(work: Work, machine: MachineProfile,
                gemm_rate: str = "direct_flops_per_s") -> float:
    """Predicted seconds on the host CPU. Multiply-add is compute- or memory-bound,
    whichever is slower (measured on the CI kind: memory-bound at S = 1, a matmul at S > 1).
    `gemm_rate`: the rate of work.direct_flops (graph_ops' convs have their own)."""
    r = machine.rate
    madd_s = max(work.madd_flops / r("madd_flops_per_s"), work.madd_bytes / r("madd_bytes_per_s"))
    return (
        work.fft_flops / r("fft_flops_per_s")
        + work.kernel_fft_flops / r("kernel_fft_flops_per_s")
        + madd_s
        + work.direct_flops / r(gemm_rate)
        + work.gather_bytes / r("gather_bytes_per_s")
        + work.memory_bytes / r("memory_bytes_per_s")
        + work.pack_bytes / r("pack_bytes_per_s")
        + work.products * r("product_overhead_s")
        + work.calls * r("layer_overhead_s")
    )


def gpu_seconds(work: Work, gpu: GpuProfile) -> float:
    """Predicted seconds on a GPU from its profile (cuDNN-like direct, cuFFT-based FFT)."""
    madd_s = max(work.madd_flops / gpu.madd_flops_per_s, work.madd_bytes / gpu.memory_bytes_per_s)
    return (
        (work.fft_flops + work.kernel_fft_flops) / gpu.fft_flops_per_s
        + madd_s
        + work.direct_flops / gpu.direct_flops_per_s  # cuDNN: no column buffers (gather_bytes)
        + work.memory_bytes / gpu.memory_bytes_per_s
        + work.calls * gpu.layer_overhead_s
    )


def layer_seconds(
    layer: LayerShape,
    primitive: str | None,
    machine: MachineProfile,
    spectra_budget: int | None = None,
) -> float:
    """Seconds for one layer: conv by primitive (gpu-* on the machine's GPU), others on the
    device named by primitive ('gpu' or None for the CPU). `spectra_budget`: CpuBackend's
    spectra cache bound, which decides fft-keep's tiling (see cpu_conv_work)."""
    if layer.kind == "conv":
        if primitive is None:
            raise ValueError(f"conv layer {layer.index} needs a primitive to be costed")
        on_gpu = primitive.startswith("gpu")
        work = conv_work(layer, primitive) if on_gpu else cpu_conv_work(layer, primitive,
                                                                         spectra_budget)
    else:
        work = other_work(layer)
        on_gpu = primitive == "gpu"
    if on_gpu:
        if machine.gpu is None:
            raise ValueError(f"machine profile {machine.name!r} has no GPU to cost layer on")
        return gpu_seconds(work, machine.gpu)
    scale = machine.scaling(scaling_key(layer, primitive), working_set_bytes(layer))
    return cpu_seconds(work, machine) * scale


def transfer_seconds(nbytes: float, gpu: GpuProfile) -> float:
    """Host <-> device copy time over PCIe."""
    return nbytes / gpu.transfer_bytes_per_s
