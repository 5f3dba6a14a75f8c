"""The thin CUDA layer: `Device` on CuPy (streams, pinned memory, async copies, cuDNN).

Everything above this file is written against `Device` and `xp`, and runs in
CI on `HostDevice`; only this file needs a GPU. CuPy is imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.gpu.device import Device

INSTALL_HINT = "pip install 'znni[gpu]'"


def _import_cupy() -> ModuleType:
    try:
        import cupy  # optional, GPU-only dependency
    except ImportError as e:
        raise ValueError(
            f"the GPU device needs CuPy, which is not installed; run: {INSTALL_HINT}"
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

    def __init__(self, memory_cap_bytes: int | None = None, device_id: int = 0) -> None:
        cupy = require_cuda()
        self.xp = cupy
        self._cuda = cupy.cuda
        self._device = cupy.cuda.Device(device_id)
        self._device.use()
        if memory_cap_bytes is None:
            free_bytes, _total = cupy.cuda.runtime.memGetInfo()
            memory_cap_bytes = int(free_bytes * 0.9)
        super().__init__(memory_cap_bytes)
        self._streams: dict[str, Any] = {}
        try:
            import cupyx

            self._cupyx = cupyx
        except ImportError as e:  # ships with CuPy; absent means a broken install
            raise ValueError(f"CuPy is installed without cupyx; reinstall: {INSTALL_HINT}") from e

    def _empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    def pinned(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return self._cupyx.empty_pinned(shape, dtype=dtype)

    def stream(self, name: str) -> Any:
        if name not in self._streams:
            self._streams[name] = self._cuda.Stream(non_blocking=True)
        return self._streams[name]

    def copy_to_device(self, dst: Any, src: np.ndarray, stream: Any, tag: str = "") -> None:
        self._note("issue", str(id(stream)), "h2d", tag)
        dst.set(src, stream=stream)

    def copy_to_host(self, dst: np.ndarray, src: Any, stream: Any, tag: str = "") -> None:
        self._note("issue", str(id(stream)), "d2h", tag)
        src.get(stream=stream, out=dst, blocking=False)

    def launch(self, stream: Any, fn: Callable[[], None], tag: str = "") -> None:
        self._note("issue", str(id(stream)), "launch", tag)
        with stream:
            fn()

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

    def native_conv3d(self, x: Any, w: Any, b: Any, out: Any) -> bool:
        """cuDNN forward convolution (valid, stride 1) with bias, when CuPy has cuDNN."""
        if not getattr(self._cuda, "cudnn_enabled", False):
            return False
        try:
            from cupyx import cudnn  # CuPy >= 9; the module is absent without cuDNN
        except ImportError:
            return False
        cudnn.convolution_forward(
            x, w, b, out, (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, auto_tune=True, tensor_core="auto"
        )
        return True

    def close(self) -> None:
        self.synchronize()
        self._streams = {}
