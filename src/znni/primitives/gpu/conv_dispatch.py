"""One entry point for every GPU convolution primitive: `device_conv`.

- "cudnn": cuDNN frontend graphs (cudnn_conv.py) on a CUDA device; on the numpy
  stand-in device its stand-in (cudnn_standin.py, reported as "cudnn-standin").
  Without the cuDNN frontend, or for a graph cuDNN has no plan for, the per-offset GEMM
  loop runs instead and the fallback is written to the device's `ConvState.fallbacks`.
- "cufft" / "cufft-keep": FFT convolution (cufft_conv.py) for stride 1, dilation 1,
  one group; "cufft-keep" keeps kernel spectra between calls (by `key`). Other shapes
  go to "cudnn" (and are written to the fallbacks).
- "gemm-loop": one batched GEMM per kernel offset (gemm_loop.py).

Every primitive takes and returns tensors in the precision's storage dtype, computes in
float32, and counts what it allocates on the device. `ConvState.ran` counts what
really ran, under its real name.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Any

from znni.primitives.base import Activation
from znni.primitives.gpu.conv_spec import ConvSpec, conv_spec
from znni.primitives.gpu.cudnn_conv import LibraryConv
from znni.primitives.gpu.cufft_conv import KeptSpectra, PlanCacheBound, cufft_conv, fft_eligible
from znni.primitives.gpu.device import Device, DeviceOutOfMemory, HostDevice
from znni.primitives.gpu.gemm_loop import gemm_loop_conv
from znni.primitives.precision import storage_dtype

GPU_CONV_PRIMITIVES: tuple[str, ...] = ("cudnn", "cufft-keep", "cufft", "gemm-loop")
SPECTRA_CAP_SHARE = 8  # kept spectra: at most 1/8 of the device cap


class ConvState:
    """Per-device state of the conv primitives: the cuDNN library (or its stand-in),
    kept spectra, the cuFFT plan-cache bound, and what ran or fell back."""

    def __init__(self, device: Device) -> None:
        self.spectra = KeptSpectra(device, device.memory_cap_bytes // SPECTRA_CAP_SHARE)
        self.plans = PlanCacheBound()
        self.ran: Counter[str] = Counter()
        self.fallbacks: list[str] = []  # each distinct fallback once, in order
        self._library: LibraryConv | None = None
        self._library_tried = False
        self._lock = threading.Lock()

    def note(self, message: str) -> None:
        with self._lock:
            if message not in self.fallbacks:
                self.fallbacks.append(message)

    def library(self, device: Device) -> LibraryConv | None:
        """cuDNN (or the stand-in on a HostDevice); None where the frontend is missing."""
        with self._lock:
            if not self._library_tried:
                self._library_tried = True
                self._library = _make_library(device, self)
            return self._library

    def set_library(self, library: LibraryConv | None) -> None:
        """Use `library` for "cudnn" (tests inject a configured stand-in)."""
        with self._lock:
            self._library, self._library_tried = library, True


def _make_library(device: Device, state: ConvState) -> LibraryConv | None:
    if isinstance(device, HostDevice):
        from znni.primitives.gpu.cudnn_standin import CudnnStandin

        return CudnnStandin(device)
    from znni.primitives.gpu.cudnn_conv import CudnnConv

    try:
        return CudnnConv(device)
    except ImportError as e:
        state.fallbacks.append(f"cudnn -> gemm-loop: {e}")
        return None


_STATES: weakref.WeakKeyDictionary[Device, ConvState] = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


def conv_state(device: Device) -> ConvState:
    """The conv primitives' state for `device` (created on first use)."""
    with _STATES_LOCK:
        state = _STATES.get(device)
        if state is None:
            state = _STATES[device] = ConvState(device)
        return state


def cudnn_available(device: Device) -> bool:
    """Whether "cudnn" runs cuDNN (or, on the stand-in device, its stand-in)."""
    return conv_state(device).library(device) is not None


def release_conv_caches(device: Device) -> None:
    """Give back the device memory the conv caches hold (kept spectra, plan-cache bound)."""
    state = conv_state(device)
    state.spectra.clear()
    state.plans.release(device)


def close_conv_state(device: Device) -> None:
    """Release the conv caches' device memory and the cuDNN handle; forget the state."""
    with _STATES_LOCK:
        state = _STATES.pop(device, None)
    if state is None:
        return
    state.spectra.clear()
    state.plans.release(device)
    lib = state._library
    if lib is not None:
        lib.close()


def device_conv(
    device: Device,
    primitive: str,
    x: Any,
    params: Mapping[str, Any],
    *,
    activation: Activation | None = None,
    precision: str = "fp32",
    transposed: bool = False,
    key: Hashable | None = None,
) -> Any:
    """x: device array (N, Cin, Z, Y, X) in storage_dtype(precision); params: the ONNX graph
    node's params as graph_kernels.conv/conv_transpose read them (weight, bias, strides, pads,
    dilations, group, output_padding), with `weight` already a device array in the storage dtype
    and `bias` a float32 device array or None; activation: znni.primitives.base.Activation fused
    after bias, or None; key: a stable identity of the weights (node name + precision) for
    caches of kernel spectra. Returns a NEW device array (N, Cout, ...) in the storage dtype,
    counted by the device (device.alloc/adopt; the caller frees it with device.free). Raises
    DeviceOutOfMemory (device.py) when the cap is exceeded, leaving nothing counted."""
    if primitive not in GPU_CONV_PRIMITIVES:
        raise ValueError(
            f"unknown GPU conv primitive {primitive!r}; expected one of "
            f"{', '.join(GPU_CONV_PRIMITIVES)}"
        )
    want = storage_dtype(precision)
    if x.dtype != want or params["weight"].dtype != want:
        raise TypeError(
            f"precision {precision} stores {want.name}, got input {x.dtype} and weight "
            f"{params['weight'].dtype}"
        )
    spec = conv_spec(tuple(x.shape), params, activation=activation, precision=precision,
                     transposed=transposed)
    if device.tf32 != (precision == "tf32"):  # cuBLAS matmuls (gemm-loop, cuFFT's products)
        device.set_tf32(precision == "tf32")
    state = conv_state(device)
    try:
        try:
            return _dispatch(device, state, primitive, x, params, spec, key)
        except DeviceOutOfMemory:
            if not state.spectra.counted_bytes:
                raise
            state.spectra.clear()  # give the kept spectra back and try once more
            return _dispatch(device, state, primitive, x, params, spec, key)
    except device.native_oom as e:
        raise DeviceOutOfMemory(f"{primitive} conv on {spec.x_shape} ran out of memory: {e}") from e


def _dispatch(
    device: Device, state: ConvState, primitive: str, x: Any, params: Mapping[str, Any],
    spec: ConvSpec, key: Hashable | None,
) -> Any:
    """Run `primitive` or its fallback; count what ran under its real name."""
    if primitive in ("cufft", "cufft-keep"):
        if fft_eligible(spec):
            kept = state.spectra if primitive == "cufft-keep" else None
            y = cufft_conv(device, x, params, spec, state.plans, kept, key)
            state.ran[primitive] += 1
            return y
        state.note(f"{primitive} -> cudnn: FFT convs take stride 1, dilation 1, one group, "
                   "not transposed")
        primitive = "cudnn"
    if primitive == "cudnn":
        lib = state.library(device)
        if lib is not None:
            y = lib.run(x, params, spec)
            if y is not None:
                state.ran[lib.name] += 1
                return y
            state.note(f"{lib.name} -> gemm-loop: no plan for {_describe(spec)}")
    y = gemm_loop_conv(device, x, params, spec)
    state.ran["gemm-loop"] += 1
    return y


def _describe(spec: ConvSpec) -> str:
    kind = "ConvTranspose" if spec.transposed else "Conv"
    return (f"{kind} {spec.x_shape} * {spec.w_shape} strides {spec.strides} dilations "
            f"{spec.dilations} group {spec.groups} {spec.io_dtype}")
