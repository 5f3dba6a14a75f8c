"""Graph convolutions through FFTs on a device (cuFFT via `cupy.fft`; numpy.fft on the
stand-in): stride 1, dilation 1, one group, pads applied first.

The transforms are fft_conv.py's (padded to cuFFT-friendly sizes, pruned, in bounded
batches) on float32 copies of the stored tensors; the result is cast back to the
storage dtype. `KeptSpectra` keeps kernel spectra between calls ('cufft-keep') in a
`BytesLRU` whose bytes are reserved on the device. cuFFT's plan cache is bounded in
plans and bytes, and those bytes are reserved too (`bound_plan_cache`).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from math import prod
from typing import Any

import numpy as np

from znni.lru import BytesLRU
from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.fft_sizes import spectrum_points
from znni.primitives.gpu.conv_spec import ConvSpec
from znni.primitives.gpu.device import Device, DeviceOutOfMemory
from znni.primitives.gpu.fft_conv import (
    COMPLEX_BYTES,
    TRANSFORM_TEMPS,
    batch_images,
    fft_conv,
    fft_shape,
    fft_workspace_bytes,
    kernel_spectra,
)
from znni.primitives.gpu.workspace import Workspace
from znni.triple import as_triple

F32 = np.float32
FFT_BATCH_BYTES = 1 << 26  # one bounded batch of transforms (fft_conv.py)
# cuFFT plan cache bounds. CuPy's cache (cupy.fft.config.get_plan_cache(), a
# per-thread, per-device LRU) defaults to 16 plans and unlimited bytes; `set_size` and
# `set_memsize` bound the plans and the bytes of their work areas
# (https://docs.cupy.dev/en/stable/reference/generated/cupy.fft._cache.PlanCache.html).
# The cap's bytes are reserved once per thread as the work areas' upper bound; a plan
# in use but not cached lives inside a transform batch, which fft_workspace_bytes's
# TRANSFORM_TEMPS already counts.
PLAN_CACHE_PLANS = 32
PLAN_CACHE_BYTES = 1 << 28
PLAN_CACHE_CAP_SHARE = 16  # at most 1/16 of the device cap per thread


def fft_eligible(spec: ConvSpec) -> bool:
    """Whether FFT convolution computes `spec` (a plain valid correlation after pads)."""
    return (
        not spec.transposed
        and spec.groups == 1
        and set(spec.strides) == {1}
        and set(spec.dilations) == {1}
    )


def plan_cache_bytes(device: Device) -> int:
    return min(PLAN_CACHE_BYTES, device.memory_cap_bytes // PLAN_CACHE_CAP_SHARE)


class PlanCacheBound:
    """Bounds this device's cuFFT plan cache in each thread that transforms, once, and
    reserves its byte bound on the device (the stand-in reserves the same bytes)."""

    def __init__(self) -> None:
        self._threads: set[int] = set()
        self._lock = threading.Lock()
        self.reserved_bytes = 0

    def ensure(self, device: Device) -> None:
        tid = threading.get_ident()
        with self._lock:
            if tid in self._threads:
                return
            nbytes = plan_cache_bytes(device)
            device.reserve(nbytes, "cuFFT plan cache")
            self._threads.add(tid)
            self.reserved_bytes += nbytes
        config = getattr(device.xp.fft, "config", None)
        if config is not None and hasattr(config, "get_plan_cache"):
            cache = config.get_plan_cache()  # this thread's, for the current device
            cache.set_size(PLAN_CACHE_PLANS)
            cache.set_memsize(nbytes)

    def release(self, device: Device) -> None:
        with self._lock:
            device.release(self.reserved_bytes)
            self.reserved_bytes = 0
            self._threads.clear()


class KeptSpectra:
    """Kernel spectra kept between calls, LRU bounded in bytes, reserved on the device."""

    def __init__(self, device: Device, max_bytes: int) -> None:
        self.device = device
        self.lru = BytesLRU(max_bytes)
        self.counted_bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        return self.lru.get(key)

    def keep(self, key: Hashable, spectra: Any) -> bool:
        """Keep `spectra` if its bytes fit the LRU and the device; False if not kept."""
        nbytes = int(spectra.nbytes)
        if not self.lru.fits(nbytes):
            return False
        with self._lock:
            self.device.reserve(nbytes, "kept kernel spectra")  # may raise: nothing kept
            self.lru.put(key, spectra)
            self._settle(nbytes)
        return True

    def _settle(self, added: int) -> None:
        """Release the bytes of whatever the LRU evicted (lock held)."""
        evicted = self.counted_bytes + added - self.lru.nbytes
        if evicted:
            self.device.release(evicted)
        self.counted_bytes = self.lru.nbytes

    def clear(self) -> None:
        with self._lock:
            self.lru.clear()
            self._settle(0)


def cufft_conv(
    device: Device,
    x: Any,
    params: Mapping[str, Any],
    spec: ConvSpec,
    plans: PlanCacheBound,
    kept: KeptSpectra | None = None,
    key: Hashable | None = None,
) -> Any:
    """A new counted (N, Cout, ...) array in x's dtype: the conv by FFTs, bias, activation.

    With `kept` and a `key` the kernel spectra are taken from (or put in) the kept cache.
    """
    plans.ensure(device)
    xp = device.xp
    n, cin = spec.x_shape[:2]
    cout = spec.out_channels
    size = as_triple(spec.x_shape[2 + i] + spec.pads[i] + spec.pads[i + 3] for i in range(3))
    batch_bytes = max(1, min(FFT_BATCH_BYTES, device.memory_cap_bytes // 16))
    fshape = fft_shape(size)
    w = params["weight"]
    spectra = None
    kept_key = (key, fshape, spec.w_shape, spec.io_dtype)
    if kept is not None and key:
        spectra = kept.get(kept_key)
        if spectra is None:
            spectra = _make_kept(device, kept, kept_key, w, fshape, batch_bytes)
    keep = spectra is not None
    ws_bytes = fft_workspace_bytes(n, cin, cout, size, keep, batch_bytes)
    copies = (prod((n, cin, *size)) + prod(spec.w_shape) + prod(spec.out_shape) + cout) * 4
    device.reserve(ws_bytes + copies, "cuFFT conv workspace")
    try:
        y = device.alloc(spec.out_shape, x.dtype, "cuFFT conv output")
        try:
            ws = Workspace(ws_bytes, "cuFFT conv")
            out = _fft_arith(xp, x, params, spec, ws, batch_bytes, spectra)
            y[...] = out
        except BaseException:
            device.free(y)
            raise
    finally:
        device.release(ws_bytes + copies)
    return y


def _fft_arith(
    xp: Any, x: Any, params: Mapping[str, Any], spec: ConvSpec, ws: Workspace,
    batch_bytes: int, spectra: Any | None,
) -> Any:
    """float32 arithmetic: pad, fft_conv (bias added there), activation -> float32 out."""
    p = spec.pads
    width = ((0, 0), (0, 0)) + tuple((p[i], p[i + 3]) for i in range(3))
    x32 = xp.pad(xp.asarray(x, dtype=F32), width, mode="constant")  # (N, Cin, padded)
    w32 = xp.ascontiguousarray(params["weight"], dtype=F32)
    b = params.get("bias")
    b32 = xp.zeros(spec.out_channels, F32) if b is None else xp.asarray(b, dtype=F32)
    out = xp.empty(spec.out_shape, F32)
    fft_conv(xp, x32, w32, b32, out, ws, batch_bytes, spectra)
    if spec.activation is not None:
        kind, slope = spec.activation
        out = apply_activation(out, Activation(kind, slope), xp)
    return out


def _make_kept(
    device: Device, kept: KeptSpectra, kept_key: Hashable, w: Any, fshape: Any, batch_bytes: int
) -> Any | None:
    """Compute the spectra and keep them; None (recompute this call) where they do not fit."""
    xp = device.xp
    cout, cin = w.shape[:2]
    nbytes = spectrum_points(fshape) * cout * cin * COMPLEX_BYTES
    if not kept.lru.fits(nbytes):
        return None
    images = min(batch_images(fshape, batch_bytes), cout * cin)
    temps = TRANSFORM_TEMPS * images * spectrum_points(fshape) * COMPLEX_BYTES + w.size * 4
    device.reserve(temps + nbytes, "kernel spectra transform")
    try:
        w32 = xp.ascontiguousarray(w, dtype=F32)
        arr = xp.empty((spectrum_points(fshape), cin, cout), dtype=xp.complex64)  # (F, Cin, Cout)
        spectra = kernel_spectra(xp, w32, fshape, batch_bytes, Workspace(temps, "spectra"), arr)
    finally:
        device.release(temps + nbytes)
    try:
        kept_now = kept.keep(kept_key, spectra)
    except DeviceOutOfMemory:  # no room to keep them: recompute within this call
        kept_now = False
    return spectra if kept_now else None
