"""Exact bytes of a dense pass, per layer and primitive (ZNNi Table II style).

A layer's live bytes are its input, its output and the primitive's
workspace (transforms, kernel spectra, padded buffers); kept kernel spectra
are persistent across patches. The pass peak adds the patch input the
caller holds, the process baseline and the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from znni.model.network import LayerShape
from znni.planner.costs import COMPLEX_BYTES, FLOAT_BYTES, RECOMPUTE_BYTES, WORK_BYTES
from znni.planner.hostsim import replay_pass
from znni.primitives.fft_sizes import padded_shape, spectrum_points


@dataclass(frozen=True)
class LayerMemory:
    """Bytes while one layer runs: `live` (freed after the layer) and `kept` (persistent)."""

    live_bytes: int
    kept_bytes: int = 0


def kernel_spectra_bytes(layer: LayerShape) -> int:
    """All kernel spectra of a conv layer: f*f'*Nc complex (ZNNi: 6.9 GB for 80x80 at 64^3)."""
    nc = spectrum_points(padded_shape(layer.size_in))
    return layer.channels_in * layer.channels_out * nc * COMPLEX_BYTES


def conv_workspace_bytes(layer: LayerShape, primitive: str, threads: int = 1) -> int:
    """Workspace of a conv primitive beyond its input and output arrays.

    CPU FFT (Table II, task-parallel: S*(f+f')*n~ + T*n~), as CpuBackend does it:
    samples in chunks of sc whose spectra fit WORK_BYTES, forward spectra
    sc*f*Nc and inverse spectra sc*f'*Nc plus their real buffers; fft-recompute
    adds pruned kernel spectra RECOMPUTE_BYTES of output channels at a time.
    Direct: one im2col slab per thread. GPU FFT adds the f' kernel spectra of one
    input map and the cuFFT work area (ZNNi's K).
    """
    s, f, g = layer.batch_in, layer.channels_in, layer.channels_out
    if primitive in ("direct", "gpu-direct"):
        return threads * (f * prod(layer.kernel) + g) * prod(layer.size_out[1:]) * FLOAT_BYTES
    padded = padded_shape(layer.size_in)
    nc = spectrum_points(padded)
    if primitive == "gpu-fft":
        spectra = s * (f + g) * nc * COMPLEX_BYTES
        # kernels transformed one input map at a time (f' spectra), plus cuFFT's work area
        return spectra + g * nc * COMPLEX_BYTES + s * max(f, g) * nc * COMPLEX_BYTES // 4
    sc = max(1, min(s, WORK_BYTES // ((f + g) * nc * COMPLEX_BYTES)))
    real = sc * (f * prod(layer.size_in[:2]) + g * prod(layer.size_out[:2])) * padded[2]
    work = sc * (f + g) * nc * COMPLEX_BYTES + real * FLOAT_BYTES
    if primitive == "fft-recompute":
        per_channel = f * nc * COMPLEX_BYTES
        oc = max(1, min(g, RECOMPUTE_BYTES // max(1, per_channel)))
        return work + 2 * oc * per_channel
    return work  # fft-keep; its kernel spectra are `kept`


def layer_memory(layer: LayerShape, primitive: str | None, threads: int = 1) -> LayerMemory:
    """Bytes of one layer: input + output + workspace live, kept spectra persistent."""
    io = layer.in_bytes + layer.out_bytes
    if layer.kind == "maxpool":
        return LayerMemory(io)
    if layer.kind != "conv":
        return LayerMemory(layer.in_bytes)  # activations work in place
    if primitive is None:
        raise ValueError(f"conv layer {layer.index} needs a primitive to size its memory")
    kept = kernel_spectra_bytes(layer) if primitive == "fft-keep" else 0
    return LayerMemory(io + conv_workspace_bytes(layer, primitive, threads), kept)


def pass_peak_bytes(
    layers: list[LayerShape],
    primitives: list[str | None],
    *,
    threads: int = 1,
    fixed_bytes: int = 0,
    workspace_bytes: int = 2**30,
) -> tuple[int, list[int]]:
    """(peak, per-layer peak) of dense passes over `layers` on CpuBackend, replayed exactly
    (hostsim.py): outputs, FFT workspaces and their bounded cache, kept spectra, MPF
    temporaries, the recombination copy. `fixed_bytes`: process baseline plus weights."""
    if not layers:
        return fixed_bytes, []
    replay = replay_pass(layers, primitives, threads=threads, base_bytes=fixed_bytes,
                         workspace_bytes=workspace_bytes)
    return replay.peak_bytes, replay.layer_peaks


def workspace_cache_bytes(host_bytes: int) -> int:
    """The FFT workspace cache a plan gives CpuBackend: 1 GiB, or an eighth of a small budget."""
    return max(0, min(2**30, host_bytes // 8))


def weights_bytes(layers: list[LayerShape]) -> int:
    """float32 weights and biases of the conv layers."""
    return sum(
        (sh.channels_out * sh.channels_in * prod(sh.kernel) + sh.channels_out) * FLOAT_BYTES
        for sh in layers
        if sh.kind == "conv"
    )
