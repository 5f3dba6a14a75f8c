"""Parsing sizes and regions given by users ("12GiB", "0:64,10:90,:")."""

from __future__ import annotations

import re

from znni.triple import Triple, as_triple

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """'12GiB' -> 12884901888; refuses anything that is not a positive size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"memory size {text!r} is not a size like 12GiB, 800MB or 2000000000")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    return value


def parse_roi(text: str) -> tuple[tuple[int | None, int | None], ...]:
    """'z0:z1,y0:y1,x0:x1' (ends may be empty) -> ((z0, z1), (y0, y1), (x0, x1))."""
    parts = text.split(",")
    if len(parts) != 3:
        raise ValueError(f"ROI {text!r} must have 3 comma-separated ranges z0:z1,y0:y1,x0:x1")
    out = []
    for part in parts:
        m = re.fullmatch(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*", part)
        if not m:
            raise ValueError(f"ROI range {part!r} in {text!r} is not of the form start:stop")
        lo, hi = (int(g) if g else None for g in m.groups())
        out.append((lo, hi))
    return tuple(out)


def resolve_roi(
    roi: tuple[tuple[int | None, int | None], ...] | None, shape: tuple[int, int, int]
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Fill open ends from the volume shape and check the ROI lies inside it (None: the
    whole volume)."""
    if roi is None:
        return ((0, shape[0]), (0, shape[1]), (0, shape[2]))
    out = []
    for axis, ((lo, hi), n) in enumerate(zip(roi, shape, strict=True)):
        lo = 0 if lo is None else lo
        hi = n if hi is None else hi
        if not 0 <= lo < hi <= n:
            raise ValueError(
                f"ROI {lo}:{hi} on axis {'zyx'[axis]} is outside the volume of shape {shape} "
                f"(need 0 <= start < stop <= {n})"
            )
        out.append((lo, hi))
    return (out[0], out[1], out[2])


def roi_shape(
    roi: tuple[tuple[int | None, int | None], ...] | None, shape: tuple[int, int, int]
) -> tuple[int, int, int]:
    """The (z, y, x) size of `resolve_roi(roi, shape)`."""
    (z0, z1), (y0, y1), (x0, x1) = resolve_roi(roi, shape)
    return (z1 - z0, y1 - y0, x1 - x0)


def parse_triple(text: str, what: str) -> Triple:
    """'64,64,64' -> (64, 64, 64), all positive."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ValueError(f"{what} {text!r} must be 3 positive integers z,y,x")
    return as_triple(values, what)
