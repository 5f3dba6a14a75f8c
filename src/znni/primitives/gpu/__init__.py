"""GPU (CuPy) primitives. `import cupy` happens only inside this package, lazily.

- device.py: the `Device` interface and `HostDevice`, the numpy stand-in used in CI.
- cupy_device.py: `CupyDevice`, the thin CUDA layer; `require_cuda()`.
- conv.py, fft_conv.py, layers.py: kernels written against `xp` and their memory model.
- streaming.py: sub-batches streamed between host RAM and the device on two streams.
- backend.py: `GpuBackend`, the `Backend` protocol on a device.
"""

from __future__ import annotations

from typing import Any


def device_info() -> list[dict[str, Any]]:
    """CUDA devices as [{'name', 'memory_bytes', 'free_bytes'}]; [] without CuPy or a GPU."""
    try:
        import cupy  # optional, heavy, GPU-only dependency
    except ImportError:
        return []
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver / no device: CuPy raises its own types
        return []
    out: list[dict[str, Any]] = []
    for i in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        with cupy.cuda.Device(i):
            free_bytes, total_bytes = cupy.cuda.runtime.memGetInfo()
        name = props["name"]
        out.append(
            {
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory_bytes": int(total_bytes),
                "free_bytes": int(free_bytes),
            }
        )
    return out


def require_cuda() -> None:
    """Raise ValueError naming the fix when CuPy or a CUDA device is missing."""
    from znni.primitives.gpu.cupy_device import require_cuda as _require

    _require()
