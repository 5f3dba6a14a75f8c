"""The (z, y, x) triple: one type and one conversion for the whole code base.

Shapes, windows, chunks, strides and offsets are all three ints, arriving as numpy shapes,
JSON lists, generators or tuples of numpy ints. `Triple` names the type once and
`as_triple` makes one of plain Python ints (so it hashes, compares and serialises the same
wherever it came from). It imports nothing from znni, so every package may use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import SupportsInt

Triple = tuple[int, int, int]


def as_triple(values: Iterable[SupportsInt], name: str = "value") -> Triple:
    """`values` as three Python ints; ValueError naming `name` unless there are exactly three."""
    vals = tuple(values)
    if len(vals) != 3:
        raise ValueError(f"{name} must have 3 entries (z, y, x), got {vals!r}")
    return (int(vals[0]), int(vals[1]), int(vals[2]))
