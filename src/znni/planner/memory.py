"""Exact bytes of a dense pass, per layer and primitive (ZNNi Table II style).

A layer's live bytes are its input, its output and the primitive's
workspace (transforms, kernel spectra, padded buffers); kept kernel spectra
are persistent across patches. The pass peak adds the patch input the
caller holds, the process baseline and the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from znni.planner.costs import COMPLEX_BYTES, FLOAT_BYTES, fft_shape, spectrum_points
from znni.planner.network import LayerShape


@dataclass(frozen=True)
class LayerMemory:
    """Bytes while one layer runs: `live` (freed after the layer) and `kept` (persistent)."""

    live_bytes: int
    kept_bytes: int = 0


def kernel_spectra_bytes(layer: LayerShape) -> int:
    """All kernel spectra of a conv layer: f*f'*Nc complex (ANCHORS: 6.9 GB for 80x80 at 64^3)."""
    nc = spectrum_points(fft_shape(layer.size_in))
    return layer.channels_in * layer.channels_out * nc * COMPLEX_BYTES


def conv_workspace_bytes(layer: LayerShape, primitive: str, threads: int = 1) -> int:
    """Workspace of a conv primitive beyond its input and output arrays.

    FFT (Table II, CPU task-parallel: S*(f+f')*n~ + T*n~): input spectra
    S*f*Nc, output spectra S*f'*Nc, one padded real buffer per thread for the
    inverse transforms, and for fft-recompute the kernel spectra of one
    output channel per thread (pruned transforms, recomputed every call).
    Direct: one (S, f, n') window copy per kernel offset at a time.
    """
    s, f, g = layer.batch_in, layer.channels_in, layer.channels_out
    if primitive in ("direct", "gpu-direct"):
        return s * f * prod(layer.size_out) * FLOAT_BYTES
    padded = fft_shape(layer.size_in)
    nc = spectrum_points(padded)
    spectra = s * (f + g) * nc * COMPLEX_BYTES
    real_buffers = threads * prod(padded) * FLOAT_BYTES
    if primitive == "fft-recompute":
        return spectra + real_buffers + threads * f * nc * COMPLEX_BYTES
    if primitive == "gpu-fft":
        # kernels of all output channels on the device, plus a cuFFT work area the size
        # of the largest batch of lines (bounded by splitting, ZNNi: "K")
        return spectra + f * g * nc * COMPLEX_BYTES + s * max(f, g) * nc * COMPLEX_BYTES // 4
    return spectra + real_buffers  # fft-keep; its kernel spectra are `kept`


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
) -> tuple[int, list[int]]:
    """(peak, per-layer peak) of a dense pass over `layers` with the given primitives.

    The caller keeps the patch input alive for the whole pass; kept spectra of
    every layer stay resident; the dense output is built by one extra copy
    (MPF recombination). `fixed_bytes`: process baseline plus weights.
    """
    if not layers:
        return fixed_bytes, []
    kept = sum(layer_memory(sh, p, threads).kept_bytes for sh, p in zip(layers, primitives,
                                                                       strict=True))
    patch_in = layers[0].in_bytes
    base = fixed_bytes + kept
    per_layer = []
    for i, (shape, prim) in enumerate(zip(layers, primitives, strict=True)):
        mem = layer_memory(shape, prim, threads)
        held = patch_in if i > 0 else 0
        per_layer.append(base + held + mem.live_bytes)
    recombine = base + patch_in + 2 * layers[-1].out_bytes
    return max(max(per_layer), recombine), per_layer


def weights_bytes(layers: list[LayerShape]) -> int:
    """float32 weights and biases of the conv layers."""
    return sum(
        (sh.channels_out * sh.channels_in * prod(sh.kernel) + sh.channels_out) * FLOAT_BYTES
        for sh in layers
        if sh.kind == "conv"
    )
