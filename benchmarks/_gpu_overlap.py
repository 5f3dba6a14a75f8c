"""How much of `znni segment`'s host-device copying overlaps its device compute, from markers
on the device's streams: CUDA events on a CUDA device, host timestamps taken in stream
order on the numpy stand-in.

`Tracer(cls)` wraps the Device methods the engine streams through (`copy_to_device`,
`copy_to_host`, `launch`) on the device class, so every device the engine makes during a
run is traced; each call gets a marker before and after it on its stream. `summary()`
then gives the seconds of uploads, downloads and compute, and the share of the copies'
time during which some compute ran (the pipeline's overlap).
"""

from __future__ import annotations

import time
from typing import Any

KINDS = {"copy_to_device": "h2d", "copy_to_host": "d2h", "launch": "compute"}


class Tracer:
    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.marks: list[tuple[str, Any, Any]] = []
        self._orig = {name: getattr(cls, name) for name in KINDS}
        self._cuda = cls.__name__ == "CupyDevice"

    def __enter__(self) -> Tracer:
        for name, kind in KINDS.items():
            setattr(self.cls, name, self._wrap(name, kind))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._orig.items():
            setattr(self.cls, name, fn)

    def _wrap(self, name: str, kind: str) -> Any:
        orig, tracer = self._orig[name], self

        def traced(dev: Any, *args: Any, **kwargs: Any) -> Any:
            stream = args[0] if name == "launch" else args[2]
            start = tracer._marker(dev, stream)
            out = orig(dev, *args, **kwargs)
            tracer.marks.append((kind, start, tracer._marker(dev, stream)))
            return out

        return traced

    def _marker(self, dev: Any, stream: Any) -> Any:
        if self._cuda:
            import cupy

            event = cupy.cuda.Event()
            event.record(stream)
            return event
        box: list[float] = []  # filled when the stand-in's stream thread reaches it
        self._orig["launch"](dev, stream, lambda: box.append(time.perf_counter()), "trace")
        return box

    def intervals(self) -> list[tuple[str, float, float]]:
        """(kind, start s, end s) of every traced call, from the first marker."""
        if not self.marks:
            return []
        if self._cuda:
            import cupy

            first = self.marks[0][1]
            for _, _, end in self.marks:
                end.synchronize()
            at = [(k, cupy.cuda.get_elapsed_time(first, a) / 1e3,
                   cupy.cuda.get_elapsed_time(first, b) / 1e3) for k, a, b in self.marks]
        else:
            deadline = time.perf_counter() + 10
            while any(not b for _, _, b in self.marks) and time.perf_counter() < deadline:
                time.sleep(0.001)
            at = [(k, a[0], b[0]) for k, a, b in self.marks if a and b]
        t0 = min((a for _, a, _ in at), default=0.0)
        return [(k, a - t0, b - t0) for k, a, b in at]

    def summary(self) -> dict[str, Any]:
        return overlap_summary(self.intervals())


def overlap_summary(intervals: list[tuple[str, float, float]]) -> dict[str, Any]:
    """Seconds per kind (each kind's intervals merged first), the share of upload and of
    download time with compute running, and the span from first to last marker."""
    merged = {k: _merge([(a, b) for kind, a, b in intervals if kind == k]) for k in KINDS.values()}
    compute = merged["compute"]
    out: dict[str, Any] = {f"{k}_s": sum(b - a for a, b in v) for k, v in merged.items()}
    for k in ("h2d", "d2h"):
        total = out[f"{k}_s"]
        under = sum(_cut(a, b, compute) for a, b in merged[k])
        out[f"{k}_under_compute"] = under / total if total > 0 else None
    out["span_s"] = max((b for _, _, b in intervals), default=0.0)
    out["traced_calls"] = len(intervals)
    return out


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _cut(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    """Length of [a, b] inside the (merged) spans."""
    return sum(max(0.0, min(b, d) - max(a, c)) for c, d in spans)
