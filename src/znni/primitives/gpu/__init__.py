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


# the compute capability each reduced precision needs: tf32 and bf16 tensor cores came with
# Ampere (8.0), fp16 arithmetic with 5.3 (CUDA C++ Programming Guide, "Compute
# Capabilities"; cuDNN's support matrix)
MIN_CAPABILITY: dict[str, tuple[int, int]] = {"fp32": (0, 0), "tf32": (8, 0), "bf16": (8, 0),
                                              "fp16": (5, 3)}


def compute_capability(device_id: int = 0) -> tuple[int, int] | None:
    """(major, minor) of CUDA device `device_id`; None without CuPy or that device."""
    try:
        import cupy  # optional, heavy, GPU-only dependency

        cc = str(cupy.cuda.Device(device_id).compute_capability)  # e.g. "90"
    except Exception:  # no CuPy, no driver, no such device: CuPy raises its own types
        return None
    return int(cc[:-1]), int(cc[-1])


def supported_precisions(device_id: int = 0) -> tuple[str, ...]:
    """The precisions CUDA device `device_id` computes in (MIN_CAPABILITY); () without CuPy
    or that device. The numpy stand-in computes in all four (the engine asks it instead)."""
    cc = compute_capability(device_id)
    if cc is None:
        return ()
    return tuple(p for p, need in MIN_CAPABILITY.items() if cc >= need)
