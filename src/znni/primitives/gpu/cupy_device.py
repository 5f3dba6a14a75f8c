"""The thin CUDA layer: `Device` on CuPy (streams, pooled pinned memory, async copies).

Everything above this file is written against `Device` and `xp`, and runs in
CI on `HostDevice`; only this file (and cudnn_conv.py) needs a GPU. CuPy is imported
lazily. CuPy's own `OutOfMemoryError` from an allocation or a launch is raised as
`DeviceOutOfMemory`, so callers shrink their batch instead of failing the job.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.gpu.device import Device, DeviceOutOfMemory
from znni.primitives.gpu.pinned_pool import DEFAULT_PINNED_BYTES, PinnedPool

# the extra matching the driver: nvidia-smi's header shows its CUDA version (README, "GPU")
INSTALL_HINT = "pip install 'znni[gpu-cuda13]' ('znni[gpu-cuda12]' for a CUDA 12 driver)"


def _import_cupy() -> ModuleType:
    try:
        import cupy  # optional, GPU-only dependency
    except ImportError as e:
        raise ValueError(
            f"the GPU device needs CuPy, which is not installed; run: {INSTALL_HINT}, "
            "or use --device cpu"
        ) from e
    return cupy


def require_cuda() -> ModuleType:
    """CuPy with at least one CUDA device, or ValueError saying how to get one."""
    cupy = _import_cupy()
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver or no device: CuPy raises its own error types
        raise ValueError(f"no CUDA device was found ({e}); use --device cpu") from e
    if count < 1:
        raise ValueError("no CUDA device was found; use --device cpu")
    return cupy


def cuda_available() -> bool:
    try:
        require_cuda()
    except ValueError:
        return False
    return True


class CupyDevice(Device):
    """One CUDA device through CuPy. `memory_cap_bytes` defaults to the free memory."""

    name = "cuda"

    def __init__(self, memory_cap_bytes: int | None = None, device_id: int = 0,
                 pinned_bytes: int = DEFAULT_PINNED_BYTES) -> None:
        cupy = require_cuda()
        self.xp = cupy
        self._cuda = cupy.cuda
        self.native_oom = (cupy.cuda.memory.OutOfMemoryError,)
        self._device = cupy.cuda.Device(device_id)
        self._device.use()
        if memory_cap_bytes is None:
            free_bytes, _total = cupy.cuda.runtime.memGetInfo()
            memory_cap_bytes = int(free_bytes * 0.9)
        super().__init__(memory_cap_bytes)
        self._streams: dict[str, Any] = {}
        # page-locked blocks straight from cudaHostAlloc (PinnedMemory is CuPy's RAII
        # wrapper), bypassing CuPy's unbounded pinned pool: ours is the bounded one
        self.pinned_pool = PinnedPool(
            lambda n: cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(n), 0), pinned_bytes
        )
        self._in_flight: list[tuple[Any, Any]] = []  # (event, host buffer) of async copies
        try:
            import cupyx

            self._cupyx = cupyx
        except ImportError as e:  # ships with CuPy; absent means a broken install
            raise ValueError(f"CuPy is installed without cupyx; reinstall: {INSTALL_HINT}") from e

    def _empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        try:
            return self.xp.empty(shape, dtype=dtype)
        except self.native_oom as e:  # the cap is ours; the GPU was fuller than it says
            raise DeviceOutOfMemory(f"CUDA could not allocate {shape} {dtype}: {e}") from e

    def pinned(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A view of a pooled page-locked block; the block is reused once the view is gone."""
        return self.pinned_pool.take(shape, dtype)

    def _hold_until_copied(self, stream: Any, host: np.ndarray) -> None:
        """Keep `host` alive until its async copy has run, so its pinned block is not
        handed out again while the DMA still reads or writes it."""
        self._in_flight = [(e, h) for e, h in self._in_flight if not e.done]
        self._in_flight.append((stream.record(), host))

    def compute_capability(self) -> tuple[int, int]:
        """(major, minor), e.g. (9, 0) on an H100."""
        cc = str(self._device.compute_capability)  # CuPy gives e.g. "90"
        return int(cc[:-1]), int(cc[-1])

    def set_tf32(self, enabled: bool) -> None:
        """TF32 tensor-core math for cuBLAS float32/complex64 matmuls, at run time.

        CuPy reads env CUPY_TF32 once per dtype; its cuBLAS compute type can be set later
        with cupy._core._routines_linalg.set_compute_type (COMPUTE_TYPE_TF32 = 7,
        COMPUTE_TYPE_DEFAULT = 1; cupy/_core/_routines_linalg.pxd), which this uses.
        """
        linalg = importlib.import_module("cupy._core._routines_linalg")
        kind = linalg.COMPUTE_TYPE_TF32 if enabled else linalg.COMPUTE_TYPE_DEFAULT
        for dtype in (np.float32, np.complex64):
            linalg.set_compute_type(dtype, kind)
        super().set_tf32(enabled)

    def stream(self, name: str) -> Any:
        if name not in self._streams:
            self._streams[name] = self._cuda.Stream(non_blocking=True)
        return self._streams[name]

    def copy_to_device(self, dst: Any, src: np.ndarray, stream: Any, tag: str = "") -> None:
        self._note("issue", str(id(stream)), "h2d", tag)
        dst.set(src, stream=stream)
        self._hold_until_copied(stream, src)

    def copy_to_host(self, dst: np.ndarray, src: Any, stream: Any, tag: str = "") -> None:
        self._note("issue", str(id(stream)), "d2h", tag)
        src.get(stream=stream, out=dst, blocking=False)
        self._hold_until_copied(stream, dst)

    def launch(self, stream: Any, fn: Callable[[], None], tag: str = "") -> None:
        self._note("issue", str(id(stream)), "launch", tag)
        with stream:
            try:
                fn()
            except self.native_oom as e:
                what = tag or "a launch"
                raise DeviceOutOfMemory(f"CUDA ran out of memory in {what}: {e}") from e

    def record(self, stream: Any) -> Any:
        return stream.record()

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def host_wait(self, event: Any) -> None:
        event.synchronize()

    def synchronize(self) -> None:
        for s in self._streams.values():
            s.synchronize()
        self._device.synchronize()
        self._in_flight = []  # every copy has run

    def native_conv3d(self, x: Any, w: Any, b: Any, out: Any) -> bool:
        """cuDNN (through the cuDNN frontend) valid stride-1 conv with bias into `out`;
        False when the frontend is not installed or cuDNN has no plan for it."""
        from znni.primitives.gpu.conv_dispatch import conv_state
        from znni.primitives.gpu.conv_spec import conv_spec

        state = conv_state(self)
        lib = state.library(self)
        if lib is None:
            return False
        params = {"weight": w, "bias": b, "strides": (1, 1, 1), "pads": (0,) * 6,
                  "dilations": (1, 1, 1), "group": 1}
        precision = "tf32" if self.tf32 else "fp32"
        spec = conv_spec(tuple(x.shape), params, activation=None, precision=precision,
                         transposed=False)
        y = lib.run(x, params, spec)
        if y is None:
            return False
        out[...] = y
        self.free(y)
        state.ran[lib.name] += 1
        return True

    def close(self) -> None:
        from znni.primitives.gpu.conv_dispatch import close_conv_state

        self.synchronize()
        close_conv_state(self)
        self._in_flight = []
        self._streams = {}
        self.pinned_pool.clear()
