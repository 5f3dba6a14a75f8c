"""Shared benchmark helpers: medians of repeated timings, the optional PyTorch peer, tables."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def median_s(fn: Callable[[], Any], reps: int, warmup: int = 1) -> float:
    """Median wall seconds of `reps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_or_none() -> Any:
    """torch if importable (benchmark-only optional dependency), else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_conv(torch: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> Callable[[], Any]:
    """A closure running PyTorch's CPU conv3d (oneDNN) on the same arrays."""
    tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)

    def run() -> Any:
        with torch.inference_mode():
            return torch.nn.functional.conv3d(tx, tw, tb)

    return run


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def fmt_s(t: float | None) -> str:
    return "-" if t is None else f"{t:.3f}"


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def peak_rss_bytes(field: str = "VmHWM") -> int:
    """This process's peak resident set (VmHWM, Linux), or with field="VmRSS" the current
    one. Unlike a child's ru_maxrss, which counts the parent's pages at fork, VmHWM starts
    afresh at exec (and at reset_peak_rss)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status (peak RSS needs Linux)")


def reset_peak_rss() -> None:
    """Start VmHWM again from the current resident set (Linux >= 4.0: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
