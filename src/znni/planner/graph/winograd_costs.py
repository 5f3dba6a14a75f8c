"""What the Winograd conv primitives cost (primitives/cpu/winograd.py): F(4,3) for every
3^3 conv with two or more input channels, F(6,3) where it measured faster and its rounding
on the layer's own weights stays within WINOGRAD6_MAX_TILE_ERROR."""

from __future__ import annotations

from math import ceil, prod

import numpy as np

from znni.model.network import FLOAT_BYTES, LayerShape
from znni.planner.machine import MachineProfile
from znni.primitives.cpu.winograd import PRIMITIVE_TILES, chunks
from znni.primitives.cpu.winograd_error import layer_tile_error
from znni.triple import as_triple

# Winograd F(4, 3) (primitives/cpu/winograd.py): tiles of 4^3 outputs from 6^3 inputs
WINOGRAD_M = 4
# its axis passes stream V and M about 1.1 times at the element-wise rate (least squares with
# winograd_flops_per_s on benchmarks/winograd.py's five U-Net layers with 4 MiB chunks, CI
# kind, 2026-11-23: 0.88-1.16 of measured; the 8 MiB chunks before streamed 2.7 times).
# On 17 layer shapes (12-128 channels, 4^3-96^3) measured 2026-11-24 it predicted
# 0.56-1.06 of measured (median 0.8) on a quiet host, and 0.29-0.81 an hour before, when
# the host's memory was slow: a shared machine moves this memory-bound primitive most.
WINOGRAD_PASSES = 1.08
# one input channel makes its 216 GEMMs (Cout, 1) @ (1, T): numpy's matmul runs depth-1
# products without BLAS, 13x slower than depth 2, and the 1 -> 16 conv of a 64^3 window
# took 17-20 ms by Winograd against 5.2 ms direct (one GEMM of depth 27); as a
# U-Net's first conv, direct made BasicUNet windows 7-12% faster (64^3, 64^3 in pairs,
# 96^3; CI kind, 2026-11-23)
WINOGRAD_MIN_CHANNELS_IN = 2
WINOGRAD_CHUNK_BYTES = 2**22  # V + M per chunk, one chunk per worker (winograd.CHUNK_BYTES)
# F(6,3), tiles of 6^3 outputs from 8^3 inputs, against F(4,3), one 3^3 conv with pads
# alone (2 workers, 4 MiB chunks, medians of 9 alternated, CI kind, 2026-11-24): 0.76x the
# time at 16 -> 16 96^3 (86.9 against 114.5 ms), 0.88x at 32 -> 16 96^3; equal at 16 -> 16
# 48^3 (8 x tiles); slower where a side is not a multiple of 6 (ragged edge tiles) and the
# x rows are short: 1.25x at 64^3, 1.13x at 128^3, 1.47x at 32^3. So it is offered only on
# whole tiles with at least WINOGRAD6_MIN_X_TILES per x row, where the
# F(4,3) model with alpha^3 = 512 predicted 0.70-0.71x against the measured 0.76-0.88x
# alone (a factor 1.15). Inside BasicUNet's 96^3 window its three convs ran 1.37-1.66x the
# bare model, F(4,3)'s big convs of a 128^3 window 1.11-1.22x theirs (CI kind, 2026-11-24):
# 1.15 let the planner pick 96^3 windows over 128^3 for a 512^3 volume (806 against 803
# thousand voxels/s predicted), which measured 221 against 184 s. Hence 1.3:
WINOGRAD6_TIME_FACTOR = 1.3
# rows of 12 or more x tiles take winograd.SHORT_ROW's per-window GEMMs; with them F(6,3)
# ran 0.81-0.95x F(4,3)'s time at 72^3 (12 x tiles; 16-32 channels) and 0.87x at 84^3,
# while 48^3 (8) stayed equal (medians of 9 alternated, CI kind, 2026-11-24)
WINOGRAD6_MIN_X_TILES = 12
# F(6,3) rounds ten times worse than F(4,3): on 2 tiles per axis with the layer's weights
# (winograd_error.tile_error), 2.0-3.9e-5 for each of BasicUNet's 3^3 convs against
# 2.2-4.3e-6; a whole 96^3 window with F(6,3) on every conv was within 5.4e-5 of
# onnxruntime (F(4,3): 1.2e-5). A layer above this bound keeps F(4,3), leaving the output
# within the 1e-4 of docs/design.md
WINOGRAD6_MAX_TILE_ERROR = 5e-5


def winograd_primitives(layer: LayerShape, weight: np.ndarray) -> list[str]:
    """The Winograd primitives the planner may weigh for this conv."""
    if tuple(weight.shape[2:]) != (3, 3, 3) or layer.channels_in < WINOGRAD_MIN_CHANNELS_IN:
        return []
    if any(o % 6 for o in layer.size_out) or layer.size_out[2] // 6 < WINOGRAD6_MIN_X_TILES:
        return ["winograd"]
    return ["winograd", "winograd6"] if (
        layer_tile_error(weight, 6) <= WINOGRAD6_MAX_TILE_ERROR) else ["winograd"]


def _tile(primitive: str) -> int:
    """The primitive's tile size m, as the primitive defines it."""
    return PRIMITIVE_TILES[primitive]


def winograd_tiles(layer: LayerShape, m: int = WINOGRAD_M) -> int:
    """T: output tiles of m^3 voxels over the batch (edges padded up to whole tiles)."""
    return layer.batch_in * prod(-(-o // m) for o in layer.size_out)


def chunk_rounds_factor(layer: LayerShape, cores: int, m: int = WINOGRAD_M) -> float:
    """The primitive's time over an even split of its work on `cores` workers: its chunks
    (winograd.chunks, the primitive's own split) run in ceil(n / cores) rounds, so one
    chunk keeps one core busy and the others idle (factor 2 on 2 cores), three take two
    rounds (4/3). The rate below was fitted on layers of 4 to 48 chunks (an even count),
    where this is 1. Measured in windows (BasicUNet, MONAI UNet, valid U-Net; 65 Winograd
    nodes, CI kind, 2026-11-24): one-chunk nodes ran 1.29-2.37x the model without it,
    nodes of 4 or more chunks 0.9-1.3x; with it the nodes' rms log error fell from 0.45
    to 0.35."""
    per_chunk = WINOGRAD_CHUNK_BYTES // (
        FLOAT_BYTES * (m + 2) ** 3 * (layer.channels_in + layer.channels_out))
    tiles = as_triple(-(-o // m) for o in layer.size_out)
    n = len(chunks(layer.batch_in, tiles, per_chunk, cores))
    workers = max(1, cores)
    return ceil(n / workers) * workers / n


def winograd_terms(
    layer: LayerShape, machine: MachineProfile, primitive: str = "winograd"
) -> tuple[float, float, float]:
    """(GEMM seconds, transform-traffic seconds, fixed seconds) of `winograd_seconds`: the
    calibration (graph/calibrate.py) fits the two rates by the first two."""
    m = _tile(primitive)
    alpha3 = (m + 2) ** 3
    t = winograd_tiles(layer, m)
    gemm_flops = 2.0 * alpha3 * layer.channels_in * layer.channels_out * t
    moved_bytes = (WINOGRAD_PASSES * alpha3 * t
                   * (layer.channels_in + layer.channels_out) * FLOAT_BYTES)
    factor = WINOGRAD6_TIME_FACTOR if m == 6 else 1.0
    factor *= chunk_rounds_factor(layer, machine.cores, m)
    return (factor * gemm_flops / machine.rate("winograd_flops_per_s"),
            factor * moved_bytes / machine.rate("winograd_bytes_per_s"),
            machine.rate("layer_overhead_s"))


def winograd_seconds(
    layer: LayerShape, machine: MachineProfile, primitive: str = "winograd"
) -> float:
    """Lavin & Gray (CVPR 2016) work counts: alpha^3 (Cout x Cin) @ (Cin x T) GEMMs, plus
    the transforms' traffic over V (alpha^3, Cin, T) and M (alpha^3, Cout, T) float32,
    at the rates of all cores, times the rounds its chunks take (`chunk_rounds_factor`)."""
    return sum(winograd_terms(layer, machine, primitive))


def winograd_bytes(layer: LayerShape, cores: int, primitive: str = "winograd") -> tuple[int, int]:
    """(workspace, kept) bytes. Workspace: per worker a chunk of V + M, the transforms'
    intermediates freed as they go (16 -> 16 channels at 64^3 with pads, 12 -> 12 at 88^3:
    7.2-7.9 MiB of numpy arrays beyond the output on 2 workers, tracemalloc, CI kind,
    2026-11-23; 4.6 MiB of resident growth, pages the arenas reuse); pads, concatenated parts
    and ragged edges are read in place, with no copies. Kept across windows: the kernel
    transform U (alpha^3, Cout, Cin) and the weight copy it is checked against
    (primitives/cpu/winograd)."""
    alpha3 = (_tile(primitive) + 2) ** 3
    w_bytes = 27 * layer.channels_in * layer.channels_out * FLOAT_BYTES
    u_bytes = alpha3 * layer.channels_in * layer.channels_out * FLOAT_BYTES
    return cores * WINOGRAD_CHUNK_BYTES, u_bytes + w_bytes
