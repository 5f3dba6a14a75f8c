"""CpuBackend: the fast CPU implementation of the `Backend` protocol.

Per conv layer it runs direct conv, FFT conv with kept kernel spectra or FFT
conv with pruned kernel transforms recomputed per call, as the plan says or
as measured fastest for the layer shape. Every hot loop runs in numpy,
BLAS or FFTW, which release the GIL, so a pool of `threads` workers and
FFTW's own threads keep every usable core busy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from math import prod

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation, ConvStep, InstanceNorm, Triple
from znni.primitives.cpu.choice import PrimitiveChooser, estimate_s, layer_key, time_call
from znni.primitives.cpu.direct_conv import direct_conv3d
from znni.primitives.cpu.fft_conv import (
    COMPLEX_BYTES,
    FFT_WORK_BYTES,
    RECOMPUTE_BYTES,
    fft_conv3d,
    kernel_spectra,
    samples_per_chunk,
    spectrum_shape,
)
from znni.primitives.cpu.fft_workspaces import SPECTRA_CACHE_BYTES, FftSettings
from znni.primitives.cpu.fftw_plans import PlanCache
from znni.primitives.cpu.heap import keep_freed_memory
from znni.primitives.cpu.openvino_conv import OpenVinoConvs, openvino_available
from znni.primitives.cpu.pooling import maxpool, mpf
from znni.primitives.cpu.spectra_cache import SpectraCache, spectra_key
from znni.primitives.cpu.threads import warn_if_blas_forced
from znni.primitives.cpu.tiling import (
    RECOMPUTE_SPECTRA_BYTES,
    choose_tiles,
    gather_tiles,
    recompute_parts,
    scatter_tiles,
    tile_geometry,
    tile_origins,
)
from znni.primitives.cpu.winograd import PRIMITIVE_TILES, channel_parts, winograd_conv3d
from znni.primitives.fft_sizes import padded_shape
from znni.triple import as_triple

CONV_PRIMITIVES = ("direct", "fft-keep", "fft-recompute")
# only when chosen explicitly (the graph planner): OpenVINO is an optional dependency,
# Winograd F(4,3) ("winograd") and F(6,3) ("winograd6") run 3x3x3 kernels only
OPTIONAL_PRIMITIVES = ("openvino", *PRIMITIVE_TILES)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _check_window(window: Triple) -> Triple:
    if len(window) != 3 or min(window) < 1:
        raise ValueError(f"pool window must be three integers >= 1, got {window}")
    return (int(window[0]), int(window[1]), int(window[2]))


class CpuBackend:
    """numpy + pyFFTW backend; see the module docstring."""

    name = "cpu"

    def __init__(
        self,
        threads: int | None = None,
        fft_effort: str | None = None,
        spectra_cache_bytes: int = SPECTRA_CACHE_BYTES,
        workspace_bytes: int = 2**30,
        persist_choices: bool = True,
        fft_tiles: int | None = None,
        fft_work_bytes: int = FFT_WORK_BYTES,
        recompute_spectra_bytes: int = RECOMPUTE_SPECTRA_BYTES,
    ) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if fft_tiles is not None and fft_tiles < 1:
            raise ValueError(f"fft_tiles must be >= 1, got {fft_tiles}")
        if fft_work_bytes < 1:
            raise ValueError(f"fft_work_bytes must be >= 1, got {fft_work_bytes}")
        if recompute_spectra_bytes < 1:
            raise ValueError(
                f"recompute_spectra_bytes must be >= 1, got {recompute_spectra_bytes}")
        self.fft_tiles = fft_tiles  # None: chosen per layer by the tiling model
        self.fft_work_bytes = fft_work_bytes  # spectra per chunk of transforms (fft_conv3d)
        self.recompute_spectra_bytes = recompute_spectra_bytes  # one part of tiled recompute
        self.threads = threads or usable_cores()
        # Default FFTW_MEASURE; ZNNI_FFT_EFFORT lets CI pick a cheap planner for every backend.
        self.fft_effort = fft_effort or os.environ.get("ZNNI_FFT_EFFORT", "FFTW_MEASURE")
        self.plans = PlanCache(self.threads, self.fft_effort, workspace_bytes)
        self.spectra = SpectraCache(spectra_cache_bytes)
        self.chooser = PrimitiveChooser(persist=persist_choices)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="znni-cpu")
        self._ov: OpenVinoConvs | None = None
        warn_if_blas_forced()
        keep_freed_memory()  # windows reuse their tensors' pages (primitives/cpu/heap)

    @property
    def fft_settings(self) -> FftSettings:
        """What decides the FFT workspaces a layer checks out (fft_workspaces)."""
        return FftSettings(self.fft_tiles, self.spectra.max_bytes, self.fft_work_bytes,
                           self.recompute_spectra_bytes)

    def close(self) -> None:
        """Stop the worker threads and drop caches."""
        self._pool.shutdown(wait=True)
        self.plans.clear()
        self.spectra.clear()

    def conv3d(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None = None,
        primitive: str | None = None,
    ) -> np.ndarray:
        x, weight, bias = self._check_conv(x, weight, bias)
        if primitive is None:
            primitive = self.choose(x, weight, bias, activation)
        elif primitive not in CONV_PRIMITIVES + OPTIONAL_PRIMITIVES:
            raise ValueError(
                f"unknown CPU conv primitive {primitive!r}; expected one of "
                f"{CONV_PRIMITIVES + OPTIONAL_PRIMITIVES}"
            )
        return self._run(primitive, x, weight, bias, activation)

    def conv3d_parts(
        self,
        parts: Sequence[np.ndarray],
        pads: Sequence[int],
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None = None,
        primitive: str | None = None,
        norm: InstanceNorm | None = None,
        channels_last: bool = False,
    ) -> np.ndarray:
        """conv3d of the channel concatenation of `parts` (S, Cin_i, Z, Y, X) with zero
        `pads` (z, y, x before, then after) around it: Winograd and OpenVINO read them
        where they lie, the other primitives get the padded concatenation built once.
        `norm`, OpenVINO only: the instance norm after the conv, before `activation`.
        `channels_last`, OpenVINO only: the output may stay in its channels-last memory,
        for readers that are OpenVINO layers too (openvino_conv)."""
        if norm is not None and primitive != "openvino":
            raise ValueError(f"only the 'openvino' conv primitive applies a norm, "
                             f"got primitive {primitive!r}")
        if primitive in PRIMITIVE_TILES:
            return self._winograd(primitive, parts, pads, weight, bias, activation)
        if primitive == "openvino":
            arrays, pads, shape = channel_parts(parts, pads)
            weight, bias = _checked_weights(shape, weight, bias)
            return self._openvino().conv3d(arrays, weight, bias, activation, pads, norm,
                                           channels_last)
        from znni.primitives.cpu.graph_ops import concat_channels

        x = concat_channels(parts, pads) if len(parts) > 1 or any(pads) else parts[0]
        return self.conv3d(x, weight, bias, activation, primitive)

    def conv3d_chain(
        self,
        parts: Sequence[np.ndarray],
        steps: Sequence[ConvStep],
        channels_last: bool = False,
    ) -> np.ndarray:
        """Convs one after another in one OpenVINO layer (model.openvino_layers.openvino_chains),
        the first reading the channel concatenation of `parts` as conv3d_parts does; the
        tensors between them are never ours. `channels_last` as in conv3d_parts."""
        if not steps:
            raise ValueError("a conv chain needs one step or more, got none")
        arrays, pads, shape = channel_parts(parts, steps[0].pads)
        weight, bias = _checked_weights(shape, steps[0].weight, steps[0].bias)
        first = steps[0]._replace(pads=pads, weight=weight, bias=bias)
        return self._openvino().conv3d_chain(arrays, [first, *steps[1:]], channels_last)

    def _run(
        self,
        primitive: str,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None,
    ) -> np.ndarray:
        if primitive == "direct":
            return direct_conv3d(self._pool, x, weight, bias, activation)
        if primitive == "openvino":
            return self._openvino().conv3d(x, weight, bias, activation)
        if primitive in PRIMITIVE_TILES:
            return self._winograd(primitive, x, (0,) * 6, weight, bias, activation)
        return self._run_fft(primitive == "fft-keep", x, weight, bias, activation)

    def _winograd(
        self,
        primitive: str,
        x: np.ndarray | Sequence[np.ndarray],
        pads: Sequence[int],
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None,
    ) -> np.ndarray:
        """Winograd F(m, 3) with the primitive's m, over the backend's thread pool."""
        return winograd_conv3d(x, weight, bias, activation, pool=self._pool, pads=pads,
                               m=PRIMITIVE_TILES[primitive])

    def _openvino(self) -> OpenVinoConvs:
        """The OpenVINO layer cache; ValueError naming the fix when it is not installed."""
        if self._ov is None:
            if not openvino_available():
                raise ValueError("conv primitive 'openvino' needs the optional openvino "
                                 "package: pip install openvino")
            self._ov = OpenVinoConvs(self.threads, self._pool)
        return self._ov

    def _run_fft(
        self,
        keep: bool,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None,
    ) -> np.ndarray:
        """FFT conv, over overlap-save tiles when the tiling model says that is faster."""
        s, cin = x.shape[:2]
        cout = weight.shape[0]
        kernel = as_triple(weight.shape[2:])
        out = as_triple(int(n) - k + 1 for n, k in zip(x.shape[2:], kernel, strict=True))
        budget = self.spectra.max_bytes if keep else None
        m = self.fft_tiles or choose_tiles(s, cin, cout, out, kernel, budget)
        counts, t_out, t_in = tile_geometry(out, kernel, m)
        spectra = self.kept_spectra(weight, t_in) if keep else None  # t_in = n when untiled
        if counts == (1, 1, 1):
            return fft_conv3d(self.plans, self._pool, x, weight, bias, activation, spectra,
                              work_bytes=self.fft_work_bytes)
        return self._run_tiles(x, weight, bias, activation, spectra, out, (counts, t_out, t_in))

    def _run_tiles(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None,
        spectra: np.ndarray | None,
        out: Triple,
        geometry: tuple[Triple, Triple, Triple],
    ) -> np.ndarray:
        """Overlap-save tiles streamed through fft_conv3d, one transform chunk of tiles per
        call, gathered into one reused buffer and scattered into the output as soon as done.
        Without kept `spectra`, each part of the output channels gets its spectra made once
        at the tile size (not once per chunk of tiles) and every tile streams through it."""
        s, cin = x.shape[:2]
        cout = weight.shape[0]
        counts, t_out, t_in = geometry
        padded = padded_shape(t_in)
        nf = prod(spectrum_shape(padded))
        width = cout if spectra is not None else recompute_parts(
            cin, cout, nf, self.recompute_spectra_bytes)
        origins = tile_origins(s, counts, t_out)
        y = np.empty((s, cout, *out), dtype=np.float32)
        group = min(len(origins), samples_per_chunk(cin, width, padded, self.fft_work_bytes))
        buf = np.empty((group, cin, *t_in), dtype=np.float32)  # (G, Cin, t_in)
        for o0 in range(0, cout, width):
            o1 = min(cout, o0 + width)
            part = spectra if spectra is not None else kernel_spectra(
                self.plans, weight[o0:o1], padded, RECOMPUTE_BYTES)  # (F, o1 - o0, Cin)
            for g0 in range(0, len(origins), group):
                batch = origins[g0 : g0 + group]
                gather_tiles(x, batch, t_in, buf)
                yt = fft_conv3d(self.plans, self._pool, buf[: len(batch)], weight[o0:o1],
                                bias[o0:o1], activation, part,
                                work_bytes=self.fft_work_bytes)  # (b, o1 - o0, t_out)
                scatter_tiles(yt, batch, y[:, o0:o1])
                del yt
            del part
        return y

    def kept_spectra(self, weight: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
        """Kernel spectra for patches of `size`, from the cache (kept there when they fit)."""
        padded = padded_shape((int(size[0]), int(size[1]), int(size[2])))
        nbytes = self.spectra_bytes(weight.shape, size)
        return self.spectra.get_or_make(
            spectra_key(weight, padded),
            nbytes,
            lambda: kernel_spectra(self.plans, weight, padded, RECOMPUTE_BYTES),
        )

    def spectra_bytes(self, w_shape: tuple[int, ...], size: tuple[int, ...]) -> int:
        """Bytes of kept kernel spectra of a (Cout, Cin, ...) weight for patches of `size`."""
        padded = padded_shape((int(size[0]), int(size[1]), int(size[2])))
        return prod(spectrum_shape(padded)) * int(w_shape[0]) * int(w_shape[1]) * COMPLEX_BYTES

    def estimate(self, primitive: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> float:
        """Rough model seconds (used to skip hopeless candidates, not to choose)."""
        return estimate_s(primitive, x_shape, w_shape, self.spectra.max_bytes)

    def choose(
        self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, activation: Activation | None
    ) -> str:
        """The measured-fastest primitive for this layer shape (cached by shape)."""
        key = layer_key(x.shape, weight.shape, self.threads, self.fft_effort)
        names = CONV_PRIMITIVES  # fft-keep tiles so its spectra fit the cache

        def timed(name: str) -> float:
            if name != "direct":  # plans and kept spectra are one-off costs: warm them first
                self._run(name, x, weight, bias, activation)
            return time_call(lambda: self._run(name, x, weight, bias, activation))

        return self.chooser.choose(
            key,
            {n: partial(timed, n) for n in names},
            {n: self.estimate(n, x.shape, weight.shape) for n in names},
        )

    @staticmethod
    def _check_conv(
        x: np.ndarray, weight: np.ndarray, bias: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        weight, bias = _checked_weights(x.shape, weight, bias)
        return np.ascontiguousarray(x, dtype=np.float32), weight, bias

    def maxpool(self, x: np.ndarray, window: Triple) -> np.ndarray:
        return maxpool(x, _check_window(window))

    def mpf(self, x: np.ndarray, window: Triple) -> np.ndarray:
        return mpf(x, _check_window(window), self._pool)

    def activation(self, x: np.ndarray, activation: Activation) -> np.ndarray:
        return apply_activation(x, activation)


def _checked_weights(
    shape: tuple[int, ...], weight: np.ndarray, bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) as contiguous float32, checked against an input of `shape` (padded)."""
    if len(shape) != 5 or weight.ndim != 5:
        raise ValueError(
            f"conv3d needs a (S, C, Z, Y, X) input and a (Cout, Cin, kz, ky, kx) weight, "
            f"got shapes {tuple(shape)} and {weight.shape}"
        )
    if shape[1] != weight.shape[1]:
        raise ValueError(f"input has {shape[1]} channels but the kernel expects {weight.shape[1]}")
    if any(n < k for n, k in zip(shape[2:], weight.shape[2:], strict=True)):
        raise ValueError(f"input {tuple(shape[2:])} is smaller than kernel {weight.shape[2:]}")
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"bias has shape {bias.shape}, expected ({weight.shape[0]},)")
    return np.ascontiguousarray(weight, dtype=np.float32), bias.astype(np.float32)
