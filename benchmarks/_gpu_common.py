"""benchmarks/gpu.py's shared helpers: the device under test and its name, what its convs
really ran, torch's device and flags, and the result rows (printed and kept as JSON)."""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

STANDIN_ENV = "ZNNI_GPU_STANDIN"
STANDIN_CAP = 2**31  # the stand-in device's memory cap


def standin() -> bool:
    return os.environ.get(STANDIN_ENV, "") not in ("", "0")


def make_device(cap: int | None = None) -> Any:
    """The CUDA device through CuPy, or the numpy stand-in under ZNNI_GPU_STANDIN=1."""
    if standin():
        from znni.primitives.gpu.device import HostDevice

        return HostDevice(cap or STANDIN_CAP)
    from znni.primitives.gpu.cupy_device import CupyDevice

    return CupyDevice(cap)


def release_pools() -> None:
    """Give CuPy's cached device and pinned blocks back, so torch (or the next run) gets
    the memory that znni's finished runs freed."""
    if standin():
        return
    try:
        import cupy
    except ImportError:
        return
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


def gpu_name(device: Any) -> str:
    """The GPU's name as CUDA reports it, or what the stand-in is."""
    if standin() or getattr(device, "name", "") != "cuda":
        return "numpy stand-in (not a GPU)"
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def cpu_name() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def software() -> dict[str, str]:
    """Versions of what the figures depend on (absent ones left out)."""
    out: dict[str, str] = {}
    for name in ("numpy", "cupy", "cudnn", "torch", "monai", "onnx"):
        try:
            mod = __import__(name)
        except Exception:  # noqa: BLE001 - absent or broken: not part of this run
            continue
        out[name] = str(getattr(mod, "__version__", "?"))
    try:
        import cupy

        out["cuda runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
        out["cuda driver"] = str(cupy.cuda.runtime.driverGetVersion())
    except Exception:  # noqa: BLE001 - no CUDA here
        pass
    try:
        import cudnn

        out["cudnn backend"] = str(cudnn.backend_version())
    except Exception:  # noqa: BLE001 - no cuDNN frontend or library here
        pass
    return out


_LEGACY: Counter[str] = Counter()  # GpuBackend's per-layer convs that conv_dispatch misses


def count_layer_convs() -> None:
    """Count what GpuBackend's per-layer path (primitives/gpu/layers.apply_op) runs besides
    cuDNN, which conv_dispatch counts itself: its per-offset GEMM loop (`direct_conv`) and
    its FFT conv (`fft_conv`), by wrapping the two functions where apply_op looks them up.
    Once per process; a layers module without them is left alone."""
    try:
        from znni.primitives.gpu import layers
    except ImportError:
        return
    for attr, name in (("direct_conv", "gemm-loop"), ("fft_conv", "cufft")):
        fn = getattr(layers, attr, None)
        if fn is None or getattr(fn, "_counted", False):
            continue

        def counted(*args: Any, _fn: Any = fn, _name: str = name, **kwargs: Any) -> Any:
            _LEGACY[_name] += 1
            return _fn(*args, **kwargs)

        counted._counted = True  # type: ignore[attr-defined]
        setattr(layers, attr, counted)


def reset_engines(device: Any) -> None:
    """Forget which conv primitives ran on `device` (conv_dispatch.ConvState.ran, and the
    per-layer path's counts from count_layer_convs)."""
    _LEGACY.clear()
    try:
        from znni.primitives.gpu.conv_dispatch import conv_state
    except ImportError:
        return
    conv_state(device).ran.clear()


def engines(device: Any, fallback: str = "-") -> str:
    """What the convs on `device` really ran since reset_engines, by the primitive's own
    name ("cudnn 7", "gemm-loop 2", "cufft 1"; counted per call, so sub-batches and
    channel chunks count apiece), with the number of distinct fallbacks; `fallback` when
    nothing was counted."""
    ran: Counter[str] = Counter(_LEGACY)
    fallbacks = 0
    try:
        from znni.primitives.gpu.conv_dispatch import conv_state

        state = conv_state(device)
        ran.update(state.ran)
        fallbacks = len(state.fallbacks)
    except ImportError:
        pass
    if not ran:
        return fallback
    text = ", ".join(f"{k} {v}" for k, v in sorted(ran.items()))
    return text + (f"; fallbacks noted: {fallbacks}" if fallbacks else "")


def torch_setup(torch: Any) -> tuple[str, str]:
    """(torch device, its name): CUDA unless the stand-in runs. fp32 means fp32: TF32 is off
    for cuDNN convs and matmuls (torch allows it for convs by default); cudnn.benchmark on
    (autotuned algorithms, in torch's favour)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if not standin() and torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    return "cpu", f"CPU: {cpu_name()}"


def timed_median(fn: Callable[[], Any], reps: int, warmup: int = 1,
                 after_warmup: Callable[[], Any] | None = None) -> float:
    """Median wall seconds of `reps` calls after `warmup`; `fn` must synchronise itself."""
    for _ in range(warmup):
        fn()
    if after_warmup is not None:
        after_warmup()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


class Results:
    """Rows by section, each printed with its device, written as JSON after every row so a
    run stopped by its timeout still leaves what it measured."""

    def __init__(self, path: str | None, meta: dict[str, Any]) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = {"meta": meta, "sections": {}, "problems": []}
        self._save()

    def add(self, section: str, row: dict[str, Any]) -> None:
        self.data["sections"].setdefault(section, []).append(row)
        self._save()

    def problem(self, text: str) -> None:
        print(f"PROBLEM: {text}", flush=True)
        self.data["problems"].append(text)
        self._save()

    def rows(self, section: str) -> list[dict[str, Any]]:
        return self.data["sections"].get(section, [])

    def _save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            tmp.replace(self.path)


def print_rows(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """A plain table of `columns` from dict rows (missing cells as '-')."""
    if not rows:
        return
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print(flush=True)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e6:
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:.2e}"
    return str(v)
